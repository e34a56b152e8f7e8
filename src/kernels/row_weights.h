// A weight matrix as the decode step's row products read it (ComputeBackend::MatmulRows): rows of
// float32, or of 16-bit floats (IEEE fp16 or bfloat16) that the kernel widens to float32 as it
// reads them, so a batch-1 decode, which is bound by the bytes of weights it reads, reads half.
// The arithmetic after the widening is float32 either way (kernels/cpu/decode.h).
#pragma once

#include <cstdint>
#include <string>

namespace crucible {

enum class WeightType { kF32, kF16, kBF16 };

// "f32", "f16", "bf16" and back; ParseWeightType returns false for another name.
inline bool ParseWeightType(const std::string& name, WeightType* type) {
  if (name == "f32")
    *type = WeightType::kF32;
  else if (name == "f16")
    *type = WeightType::kF16;
  else if (name == "bf16")
    *type = WeightType::kBF16;
  else
    return false;
  return true;
}
inline const char* WeightTypeName(WeightType type) {
  return type == WeightType::kF32 ? "f32" : type == WeightType::kF16 ? "f16" : "bf16";
}
inline size_t WeightTypeBytes(WeightType type) {
  return type == WeightType::kF32 ? 4 : 2;
}

struct RowWeights {
  const void* data = nullptr;  // (OC, C) row-major, elements of `type`
  WeightType type = WeightType::kF32;
  RowWeights() = default;
  RowWeights(const float* weights) : data(weights) {}  // NOLINT(google-explicit-constructor)
  RowWeights(const void* weights, WeightType element) : data(weights), type(element) {}
  // The matrix starting `elements` further on (a tensor inside a unit, a row block).
  RowWeights Plus(size_t elements) const {
    return {static_cast<const char*>(data) + elements * WeightTypeBytes(type), type};
  }
};

}  // namespace crucible
