#include "common/bfloat16.h"

#include <algorithm>
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

void RoundSpan(const float* in, float* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, in + i, 4);
    bits = RoundBits(bits);
    std::memcpy(out + i, &bits, 4);
  }
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
  // Short spans skip the OpenMP construct: attention rounds one tile row at a time inside its
  // own parallel region, and even a region that runs on one thread costs about a microsecond.
  constexpr int64_t kChunk = int64_t{1} << 14;
  if (count <= 4 * kChunk) return RoundSpan(in, out, count);
#pragma omp parallel for schedule(static)
  for (int64_t chunk = 0; chunk < (count + kChunk - 1) / kChunk; ++chunk)
    RoundSpan(in + chunk * kChunk, out + chunk * kChunk, std::min(kChunk, count - chunk * kChunk));
}

}  // namespace crucible
