#include "model/parameters.h"

#include <algorithm>

#include "common/error.h"
#include "common/strings.h"

namespace crucible {

size_t ParamInfo::global_numel() const {
  size_t n = 1;
  for (int64_t s : global_shape) n *= static_cast<size_t>(s);
  return n;
}

size_t ParamInfo::GlobalIndex(size_t local) const {
  if (!sliced()) return local;
  // Row-major: the index splits into (outer, along, inner) around the split dimension.
  size_t inner = 1;
  for (size_t d = static_cast<size_t>(split_dim) + 1; d < shape.size(); ++d)
    inner *= static_cast<size_t>(shape[d]);
  const size_t along = static_cast<size_t>(shape[split_dim]);
  const size_t global_along = static_cast<size_t>(global_shape[split_dim]);
  const size_t outer = local / (along * inner), rest = local % (along * inner);
  const size_t a = rest / inner, i = rest % inner;
  return (outer * global_along + static_cast<size_t>(slice_begin) + a) * inner + i;
}

size_t ParamInfo::ChunkRun() const {
  if (chunks <= 1 || chunk_dim < 0) return numel;
  // A part holds whole chunks along chunk_dim; a run is one chunk's extent times what is inside.
  size_t inner = 1;
  for (size_t d = static_cast<size_t>(chunk_dim) + 1; d < shape.size(); ++d)
    inner *= static_cast<size_t>(shape[d]);
  return static_cast<size_t>(global_shape[chunk_dim] / chunks) * inner;
}

const ParamInfo& ParameterTable::Add(const std::string& name, std::vector<int64_t> shape,
                                     ParamKind kind, int layer, bool in_flops, TensorSplit split) {
  ParamInfo info;
  info.name = name;
  info.global_shape = shape;
  info.shape = std::move(shape);
  if (split.dim >= 0 && split.parts > 1) {
    const size_t d = static_cast<size_t>(split.dim);
    if (d >= info.shape.size() || info.shape[d] % split.parts != 0 || split.part < 0 ||
        split.part >= split.parts)
      throw Error(kExitFailure, "internal: tensor " + name + " cannot be cut in " +
                                    std::to_string(split.parts) + " parts along dimension " +
                                    std::to_string(split.dim));
    info.shape[d] /= split.parts;
    info.split_dim = split.dim;
    info.slice_begin = split.part * info.shape[d];
  }
  if (split.dim >= 0 && split.chunks > 1) {
    const size_t d = static_cast<size_t>(split.dim);
    if (d >= info.shape.size() || info.global_shape[d] % split.chunks != 0 ||
        split.chunks % std::max<int64_t>(split.parts, 1) != 0)
      throw Error(kExitFailure, "internal: tensor " + name + " cannot be cut in " +
                                    std::to_string(split.chunks) + " chunks along dimension " +
                                    std::to_string(split.dim));
    info.chunk_dim = split.dim;
    info.chunks = split.chunks;
  }
  info.numel = 1;
  for (int64_t s : info.shape) info.numel *= static_cast<size_t>(s);
  info.offset = total_;
  info.kind = kind;
  info.layer = layer;
  info.expert = expert_;
  info.whole_index = whole_count_++;
  total_ += info.numel;
  if (in_flops) flop_params_ += info.global_numel();
  params_.push_back(std::move(info));
  return params_.back();
}

bool ParameterTable::sliced() const {
  return std::any_of(params_.begin(), params_.end(), [](const ParamInfo& p) { return p.sliced(); });
}

bool ParameterTable::chunked() const {
  return std::any_of(params_.begin(), params_.end(),
                     [](const ParamInfo& p) { return p.chunks > 1; });
}

bool ParameterTable::has_experts() const {
  return std::any_of(params_.begin(), params_.end(),
                     [](const ParamInfo& p) { return p.expert >= 0; });
}

std::vector<LayoutFreeRun> ParameterTable::LayoutFreeRuns(int unit) const {
  const ParamUnit& u = units_.at(static_cast<size_t>(unit));
  std::vector<LayoutFreeRun> runs;
  // Without chunks, data and expert parallelism do not change the table: the unit in runs cut
  // at each expert tensor.
  if (!chunked()) {
    size_t begin = u.begin;
    for (const ParamInfo& p : params_) {
      if (p.expert < 0 || p.offset < u.begin || p.offset >= u.end || p.numel == 0) continue;
      if (begin < p.offset) runs.push_back({begin, p.offset, p.offset - begin});
      runs.push_back({p.offset, p.offset + p.numel, p.numel});
      begin = p.offset + p.numel;
    }
    if (begin < u.end) runs.push_back({begin, u.end, u.end - begin});
    return runs;
  }
  for (const ParamInfo& p : params_)
    if (p.offset >= u.begin && p.offset < u.end && p.numel > 0)
      runs.push_back({p.offset, p.offset + p.numel, p.ChunkRun()});
  return runs;
}

void ParameterAccess::AddGradient(int unit, size_t begin, size_t end, float* /*values*/) {
  throw Error(kExitFailure, StrFormat("internal: this parameter access takes no other gradient "
                                      "contributions (unit %d, elements %zu to %zu)",
                                      unit, begin, end));
}

void CheckPartsOfWhole(const ParameterTable& parts, const ParameterTable& whole) {
  if (parts.params().size() > whole.params().size() || whole.partial())
    throw Error(kExitFailure, "internal: a table of parts and the whole table differ in tensors");
  for (size_t t = 0; t < parts.params().size(); ++t) {
    const ParamInfo& p = parts.params()[t];
    if (p.whole_index >= whole.params().size() ||
        (t > 0 && p.whole_index <= parts.params()[t - 1].whole_index))
      throw Error(kExitFailure, "internal: tensor " + p.name + " has no place in the whole table");
    const ParamInfo& w = whole.params()[p.whole_index];
    if (p.name != w.name || p.global_shape != w.shape)
      throw Error(kExitFailure, "internal: tensor " + p.name + " is not " + w.name + " cut");
  }
}

void CopyPartsToWhole(const ParameterTable& parts, const float* part_values,
                      const ParameterTable& whole, float* whole_values) {
  ForEachPartRun(parts, whole, [&](size_t t, size_t w, size_t part, size_t at, size_t n) {
    const float* from = part_values + parts.params()[t].offset + part;
    std::copy(from, from + n, whole_values + whole.params()[w].offset + at);
  });
}

void CopyWholeToParts(const ParameterTable& whole, const float* whole_values,
                      const ParameterTable& parts, float* part_values) {
  ForEachPartRun(parts, whole, [&](size_t t, size_t w, size_t part, size_t at, size_t n) {
    const float* from = whole_values + whole.params()[w].offset + at;
    std::copy(from, from + n, part_values + parts.params()[t].offset + part);
  });
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

size_t ParameterTable::OffsetInUnit(const std::string& name, size_t unit) const {
  const ParamInfo& p = Find(name);
  const ParamUnit& u = units_.at(unit);
  if (p.offset < u.begin || p.offset + p.numel > u.end)
    throw Error(kExitFailure,
                "internal: tensor " + name + " is not in unit " + std::to_string(unit));
  return p.offset - u.begin;
}

}  // namespace crucible
