// bfloat16 rounding of float32 values, for code that emulates bf16 storage or bf16 operands
// exactly in float32 (the trainer's bf16 weight storage, Muon's bf16 Newton-Schulz, the CPU
// backend's bf16 compute).
#pragma once

#include <cstddef>

namespace crucible {

// `value` rounded to the nearest bfloat16 (ties to even), as float32; inf and NaN unchanged.
float RoundToBfloat16(float value);

// out[i] = RoundToBfloat16(in[i]) for i in [0, n), bit for bit; branch-free so the compiler
// vectorises it, and split over OpenMP threads for large n (elementwise: any thread count gives
// the same bits). `out` may be `in`.
void RoundToBfloat16(const float* in, float* out, size_t n);

}  // namespace crucible
