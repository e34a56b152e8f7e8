// 16-bit floats: IEEE fp16 and bfloat16 bits from float32 (round to nearest, ties to even) and
// back (exact). fp16 uses the F16C instructions of the x86-64-v3 baseline; bf16 is bit shifting.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "common/bfloat16.h"

namespace crucible::kernels {

// fp16 of `value`: nearest even, overflow to infinity, subnormals kept, NaN stays NaN.
inline uint16_t Fp16Bits(float value) {
  return static_cast<uint16_t>(_cvtss_sh(value, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
inline float FromFp16(uint16_t bits) {
  return _cvtsh_ss(bits);
}

// bf16 of `value`: nearest even (RoundToBfloat16), NaN stays NaN (quiet).
inline uint16_t Bf16Bits(float value) {
  uint32_t bits;
  if (value != value) {
    std::memcpy(&bits, &value, 4);
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  const float rounded = RoundToBfloat16(value);
  std::memcpy(&bits, &rounded, 4);
  return static_cast<uint16_t>(bits >> 16);
}
inline float FromBf16(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, 4);
  return value;
}

}  // namespace crucible::kernels
