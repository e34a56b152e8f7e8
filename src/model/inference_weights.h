// The weights an inference path (model/model.h InferenceModel) runs on: its own copy of every
// unit of the table in backend memory, taken from a ParameterAccess once (each unit acquired,
// copied, released), so that the model that lent them may change or free its own afterwards,
// and the copy lies in memory laid out for the decode step's streaming reads (on the host, 2 MiB
// pages: host_backend.h).
//
// `type` is the matrices' precision. kF32: the weights as they are. kF16 / kBF16: every matrix
// (embeddings, linear layers, output projections, the head; not the norms, the biases, nor a
// tensor `keep` names, such as a router, whose argmax-like decisions should see the trained
// values) is rounded to the 16-bit type (nearest even) and held twice, as the same numbers: as
// float32 in the unit (what prefill's GEMMs, the embedding lookup and the norms read) and packed
// in 16 bits at the same element offsets (what decode's MatmulRows reads: half the bytes). So a
// prefill and the decode steps after it run one model, the rounded one.
#pragma once

#include <cstddef>
#include <functional>
#include <initializer_list>
#include <memory>
#include <vector>

#include "compute/backend.h"
#include "kernels/row_weights.h"
#include "model/parameters.h"

namespace crucible {

class InferenceWeights {
 public:
  using Keep = std::function<bool(const ParamInfo&)>;
  InferenceWeights(const ParameterTable& table, ParameterAccess& access, ComputeBackend& backend,
                   WeightType type, const Keep& keep = {});

  WeightType type() const { return type_; }
  // Unit `unit` as float32 (the rounded values under a 16-bit type).
  const float* unit(int unit) const { return floats_[static_cast<size_t>(unit)].data(); }
  // The matrix at `offset` (elements) inside unit `unit`, as MatmulRows should read it: packed
  // 16-bit when the unit's tensor there was rounded, else the float32 values.
  RowWeights rows(int unit, size_t offset) const;
  // Bytes held: the float32 units and the 16-bit copies.
  size_t bytes() const;

 private:
  WeightType type_;
  std::vector<DeviceArray<float>> floats_;
  std::vector<DeviceArray<uint16_t>> halves_;  // per unit, empty under kF32
  // Per unit, the [begin, end) element ranges (in the unit) held in 16 bits.
  std::vector<std::vector<std::pair<size_t, size_t>>> packed_;
};

// Products of one input `inp` (n, C) against matrices of unit `unit`: {out (n, OC), the weight's
// offset in the unit, OC} each. The decode step's (`rows`): one MatmulRowsMany over the weights
// as decode reads them (16-bit where rounded); else (prefill) one training GEMM each over the
// float32 values.
struct UnitProduct {
  float* out;
  size_t offset;
  int64_t OC;
};
void UnitProducts(ComputeBackend& backend, const InferenceWeights& weights, bool rows, int unit,
                  const float* inp, int64_t n, int64_t C, std::initializer_list<UnitProduct> outs);

}  // namespace crucible
