#include "model/inference_weights.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "kernels/cpu/half.h"

namespace crucible {

InferenceWeights::InferenceWeights(const ParameterTable& table, ParameterAccess& access,
                                   ComputeBackend& backend, WeightType type, const Keep& keep)
    : type_(type) {
  const std::vector<ParamUnit>& units = table.units();
  floats_.resize(units.size());
  halves_.resize(units.size());
  packed_.resize(units.size());
  std::vector<float> host;
  std::vector<uint16_t> half;
  for (size_t u = 0; u < units.size(); ++u) {
    const ParamUnit& unit = units[u];
    const float* source = access.AcquireWeights(static_cast<int>(u));
    floats_[u] = DeviceArray<float>(backend, unit.size());
    if (type == WeightType::kF32) {
      // The access's weights are host memory (ParameterAccess's contract).
      floats_[u].CopyFrom(source, unit.size());
      access.ReleaseWeights(static_cast<int>(u));
      continue;
    }
    host.assign(source, source + unit.size());
    access.ReleaseWeights(static_cast<int>(u));
    half.assign(unit.size(), 0);
    for (const ParamInfo& p : table.params()) {
      if (p.offset < unit.begin || p.offset >= unit.end) continue;
      const bool matrix = p.kind == ParamKind::kEmbedding || p.kind == ParamKind::kLinear ||
                          p.kind == ParamKind::kOutputProjection || p.kind == ParamKind::kHead;
      if (!matrix || p.shape.size() != 2 || (keep && keep(p))) continue;
      const size_t begin = p.offset - unit.begin, end = begin + p.numel;
      for (size_t i = begin; i < end; ++i) {
        const uint16_t bits =
            type == WeightType::kF16 ? kernels::Fp16Bits(host[i]) : kernels::Bf16Bits(host[i]);
        half[i] = bits;
        host[i] = type == WeightType::kF16 ? kernels::FromFp16(bits) : kernels::FromBf16(bits);
      }
      packed_[u].emplace_back(begin, end);
    }
    floats_[u].CopyFrom(host.data(), unit.size());
    halves_[u] = DeviceArray<uint16_t>(backend, unit.size());
    halves_[u].CopyFrom(half.data(), unit.size());
  }
}

RowWeights InferenceWeights::rows(int unit, size_t offset) const {
  const size_t u = static_cast<size_t>(unit);
  for (const auto& [begin, end] : packed_[u])
    if (offset >= begin && offset < end) return {halves_[u].data() + offset, type_};
  return {floats_[u].data() + offset, WeightType::kF32};
}

void UnitProducts(ComputeBackend& backend, const InferenceWeights& weights, bool rows, int unit,
                  const float* inp, int64_t n, int64_t C, std::initializer_list<UnitProduct> outs) {
  if (!rows) {
    for (const UnitProduct& o : outs)
      backend.MatmulForward(o.out, inp, weights.unit(unit) + o.offset, n, C, o.OC);
    return;
  }
  std::vector<ComputeBackend::RowProduct> products;
  for (const UnitProduct& o : outs) products.push_back({o.out, weights.rows(unit, o.offset), o.OC});
  backend.MatmulRowsMany(products.data(), static_cast<int>(products.size()), inp, n, C);
}

size_t InferenceWeights::bytes() const {
  size_t total = 0;
  for (const DeviceArray<float>& f : floats_) total += f.size() * sizeof(float);
  for (const DeviceArray<uint16_t>& h : halves_) total += h.size() * sizeof(uint16_t);
  return total;
}

}  // namespace crucible
