#include "model/parameters.h"

#include <algorithm>

#include "common/error.h"

namespace crucible {

const ParamInfo& ParameterTable::Add(const std::string& name, std::vector<int64_t> shape,
                                     ParamKind kind, int layer, bool in_flops) {
  ParamInfo info;
  info.name = name;
  info.shape = std::move(shape);
  info.numel = 1;
  for (int64_t s : info.shape) info.numel *= static_cast<size_t>(s);
  info.offset = total_;
  info.kind = kind;
  info.layer = layer;
  total_ += info.numel;
  if (in_flops) flop_params_ += info.numel;
  params_.push_back(std::move(info));
  return params_.back();
}

void ParameterTable::EndUnit() {
  units_.push_back({unit_begin_, total_});
  unit_begin_ = total_;
}

size_t ParameterTable::max_unit_size() const {
  size_t largest = 0;
  for (const ParamUnit& u : units_) largest = std::max(largest, u.size());
  return largest;
}

const ParamInfo* ParameterTable::TryFind(const std::string& name) const {
  for (const auto& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}

const ParamInfo& ParameterTable::Find(const std::string& name) const {
  const ParamInfo* p = TryFind(name);
  if (!p) throw Error(kExitFailure, "internal: no parameter named " + name);
  return *p;
}

}  // namespace crucible
