// Branch-free float math that the compiler vectorises without -ffast-math, so it is both fast
// and bit-reproducible (no dependence on libm's vector variants).
#pragma once

#include <cstdint>
#include <cstring>

namespace crucible::kernels {

// exp(x), relative error below 2e-7 over the float range; exp(-inf or < -87.3) = 0.
inline float exp_fast(float x) {
  const float kLog2e = 1.44269504088896341f;
  const float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  float clamped = x < -87.3f ? -87.3f : (x > 88.0f ? 88.0f : x);
  float n = __builtin_floorf(clamped * kLog2e + 0.5f);
  float r = clamped - n * kLn2Hi;
  r = r - n * kLn2Lo;
  // Cephes expf polynomial on [-ln2/2, ln2/2].
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  int32_t exponent = static_cast<int32_t>(n) + 127;
  int32_t bits = exponent << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  float result = y * scale;
  return x < -87.3f ? 0.0f : result;
}

inline float sigmoid_fast(float x) {
  return 1.0f / (1.0f + exp_fast(-x));
}

}  // namespace crucible::kernels
