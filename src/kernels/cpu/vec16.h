// Sixteen-lane float vectors written once (GCC vector extensions) for the row loops of softmax and
// cross-entropy: inlined into a function compiled for AVX-512 a vector is one zmm register, into
// one compiled for the build's AVX2 it is two ymm registers. The lanes are the 16 lanes of
// lanes.h, and every operation is the scalar code's operation on each lane, so these loops give
// the bits of exp_fast (vec_math.h), lane_sum and lane_max (lanes.h) exactly, on either width
// (tests/unit/kernels/vec16_test.cc). What the compiler's own vectorisation of those scalar loops
// did not manage: one pass that takes the exponentials and sums them, the tails of a row masked
// instead of a scalar epilogue, and a maximum kept in a register instead of spilled.
//
// Every function here is always_inline: call them only from a function compiled for one width
// (the `Avx512`/`Avx2` pairs in attention.cc and cross_entropy.cc), never across a call boundary
// (a 64-byte vector argument changes the ABI, hence -Wpsabi is silenced below).
#pragma once

#include <cstdint>
#include <cstring>

// GCC reports the ABI note where a translation unit ends, so it stays silenced for every file
// that includes this one (no function here is ever called, only inlined).
#pragma GCC diagnostic ignored "-Wpsabi"

namespace crucible::kernels {

// Whether the CPU runs AVX-512F (the wider path of the tile products and of these loops).
bool cpu_has_avx512f();

namespace vec16 {
using F = float __attribute__((vector_size(64)));
using I = int32_t __attribute__((vector_size(64)));
constexpr int64_t kWidth = 16;

[[gnu::always_inline]] inline F Splat(float x) {
  return F{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
}
[[gnu::always_inline]] inline F Load(const float* p) {
  F v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
[[gnu::always_inline]] inline void Store(float* p, F v) {
  std::memcpy(p, &v, sizeof(v));
}
// The first n < 16 values at p, the other lanes zero; and the inverse.
[[gnu::always_inline]] inline F LoadFirst(const float* p, int64_t n) {
  float lanes[kWidth] = {};
  for (int64_t l = 0; l < n; ++l) lanes[l] = p[l];
  return Load(lanes);
}
[[gnu::always_inline]] inline void StoreFirst(float* p, F v, int64_t n) {
  float lanes[kWidth];
  Store(lanes, v);
  for (int64_t l = 0; l < n; ++l) p[l] = lanes[l];
}
// Lanes l < n all ones, the others zero: a mask for `Mask ? a : b`.
[[gnu::always_inline]] inline I FirstLanes(int64_t n) {
  const I iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return iota < static_cast<int32_t>(n);
}

// exp_fast (vec_math.h) on every lane, by the same operations in the same order. floor is
// trunc-then-correct: the argument lies in [-125.5, 127.5] (or is NaN, where the result is NaN
// either way), so it is exact, and it never meets -0.
[[gnu::always_inline]] inline F Exp(F x) {
  const float kLog2e = 1.44269504088896341f;
  const float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  const F clamped = x < -87.3f ? Splat(-87.3f) : (x > 88.0f ? Splat(88.0f) : x);
  const F t = clamped * kLog2e + 0.5f;
  F n = __builtin_convertvector(__builtin_convertvector(t, I), F);
  n = n > t ? n - 1.0f : n;
  F r = clamped - n * kLn2Hi;
  r = r - n * kLn2Lo;
  F p = Splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const F y = p * r * r + r + 1.0f;
  const I bits = (__builtin_convertvector(n, I) + 127) << 23;
  F scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  const F result = y * scale;
  return x < -87.3f ? F{} : result;
}

// lane_sum's closing tree over the 16 lanes (lanes.h), on their values in `acc`: lane l gets
// lane l + width added, width 8, 4, 2, 1, by shuffles instead of a round trip through memory.
[[gnu::always_inline]] inline float SumLanes(F acc) {
  acc += __builtin_shuffle(acc, I{8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15});
  acc += __builtin_shuffle(acc, I{4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7});
  acc += __builtin_shuffle(acc, I{2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3});
  acc += __builtin_shuffle(acc, I{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
  return acc[0];
}

// The larger of each lane pair as lane_max compares them (a > b ? a : b).
[[gnu::always_inline]] inline F Larger(F a, F b) {
  return a > b ? a : b;
}

// The maximum of the 16 lanes as lane_max closes it: m = lane 0, then m = m > lane ? m : lane
// in lane order. A maximum is exact, so a tree gives the same value whenever no lane is NaN and
// the maximum is not zero (only the sign of a zero and which NaN survives depend on the order);
// otherwise the lanes are walked in order.
[[gnu::always_inline]] inline float MaxLanes(F acc) {
  F t =
      Larger(acc, __builtin_shuffle(acc, I{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7}));
  t = Larger(t, __builtin_shuffle(t, I{4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11}));
  t = Larger(t, __builtin_shuffle(t, I{2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13}));
  t = Larger(t, __builtin_shuffle(t, I{1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14}));
  const float tree = t[0];
  // A NaN lane can hide from the tree. acc - acc is 0 on every finite lane and NaN on a NaN or
  // infinite one, so its sum is exactly 0 when no lane is either (an infinity only takes the
  // ordered walk, which is right for any lanes); in vector registers, not lane by lane.
  if (tree != 0.0f && tree == tree && SumLanes(acc - acc) == 0.0f) return tree;
  float m = acc[0];
  for (int l = 1; l < kWidth; ++l) m = m > acc[l] ? m : acc[l];
  return m;
}

// lane_max(x, n) (lanes.h), n >= 1: the same running maxima per lane and the same closing order,
// so even the sign of a zero maximum and which NaN wins agree.
// Padded (this and ExpShiftedSum below): x (and out) readable (writable) up to the next multiple
// of 16 past n, as a row inside a padded tile is, so the row's last vector is a whole load with
// its lanes past n masked off (the same bits) instead of a copy through memory; out[j] = 0 for
// those lanes.
template <bool kPadded = false>
[[gnu::always_inline]] inline float Max(const float* x, int64_t n) {
  F acc = Splat(x[0]);
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) {
    const F v = Load(x + i);
    acc = acc > v ? acc : v;
  }
  if (i < n) {
    const F v = kPadded ? Load(x + i) : LoadFirst(x + i, n - i);
    acc = FirstLanes(n - i) ? (acc > v ? acc : v) : acc;
  }
  return MaxLanes(acc);
}

// out[j] = exp_fast(x[j] - shift) for j < n (out may be x), returning lane_sum(out, n).
template <bool kPadded = false>
[[gnu::always_inline]] inline float ExpShiftedSum(float* out, const float* x, int64_t n,
                                                  float shift) {
  F acc{};
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) {
    const F e = Exp(Load(x + i) - shift);
    Store(out + i, e);
    acc += e;
  }
  if (i < n) {
    const I first = FirstLanes(n - i);
    if constexpr (kPadded) {
      const F e = first ? Exp(Load(x + i) - shift) : F{};
      Store(out + i, e);
      acc = first ? acc + e : acc;
    } else {
      const F e = Exp(LoadFirst(x + i, n - i) - shift);
      StoreFirst(out + i, e, n - i);
      acc = first ? acc + e : acc;
    }
  }
  return SumLanes(acc);
}

// lane_sum over j < n of exp_fast(x[j] - shift), nothing written.
[[gnu::always_inline]] inline float ExpShiftedSum(const float* x, int64_t n, float shift) {
  F acc{};
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) acc += Exp(Load(x + i) - shift);
  if (i < n) {
    const F e = Exp(LoadFirst(x + i, n - i) - shift);
    acc = FirstLanes(n - i) ? acc + e : acc;
  }
  return SumLanes(acc);
}

// x[j] = exp_fast(x[j] - shift) * scale for j < n.
[[gnu::always_inline]] inline void ExpShiftedScaled(float* x, int64_t n, float shift, float scale) {
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) Store(x + i, Exp(Load(x + i) - shift) * scale);
  if (i < n) StoreFirst(x + i, Exp(LoadFirst(x + i, n - i) - shift) * scale, n - i);
}
}  // namespace vec16
}  // namespace crucible::kernels
