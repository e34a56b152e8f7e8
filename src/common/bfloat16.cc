#include "common/bfloat16.h"

#include <cstdint>
#include <cstring>

namespace crucible {
namespace {

// The rounding on the bits: add half an ULP of bf16 (minus one when the kept part is even, so
// ties go to even) and cut the low 16 bits; inf and NaN (exponent all ones) pass unchanged.
inline uint32_t RoundBits(uint32_t bits) {
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
  return (bits & 0x7f800000u) == 0x7f800000u ? bits : rounded;
}

}  // namespace

float RoundToBfloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  bits = RoundBits(bits);
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

void RoundToBfloat16(const float* in, float* out, size_t n) {
  const int64_t count = static_cast<int64_t>(n);
#pragma omp parallel for schedule(static) if (count > (int64_t{1} << 16))
  for (int64_t i = 0; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, in + i, 4);
    bits = RoundBits(bits);
    std::memcpy(out + i, &bits, 4);
  }
}

}  // namespace crucible
