// Fixed-order reductions along one row: the determinism primitive of the CPU kernels. Every row
// sum, dot product and row maximum in kernels/cpu/ goes through these.
//
// The order: element i of x[0, n) goes to lane i % kLanes (16 lanes), and each lane accumulates
// its elements in index order. A sum then combines the lanes as a tree, lane l += lane l + w for
// w = 8, 4, 2, 1, and returns lane 0; a maximum scans lanes 0..15 in order. The order depends on
// n alone, so the bits are the same for any thread count or caller, and the compiler vectorises
// the lane loop (a single running sum cannot be vectorised without -ffast-math, which would also
// make the order the compiler's choice). tests/unit/kernels/lanes_test.cc pins the order
// against a plain reference.
//
// Each function is single-threaded; a kernel runs many rows in parallel, one row per thread.
#pragma once

#include <cstdint>

namespace crucible::kernels {

constexpr int kLanes = 16;

// Sum of term(i) (a float) over i in [0, n), in the order above; 0 for n = 0. The term is
// inlined into the lane loop, e.g. lane_sum(n, [&](int64_t i) { return exp_fast(x[i] - m); }).
template <typename Term>
inline float lane_sum(int64_t n, Term term) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += term(i + l);
  for (int l = 0; i + l < n; ++l) acc[l] += term(i + l);
  for (int width = kLanes / 2; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) acc[l] += acc[l + width];
  return acc[0];
}

// Sum of x[0, n).
inline float lane_sum(const float* x, int64_t n) {
  return lane_sum(n, [x](int64_t i) { return x[i]; });
}

// Sum of x[i] * y[i] over [0, n) (each product rounded, then added: the build has no FMA
// contraction).
inline float lane_dot(const float* x, const float* y, int64_t n) {
  return lane_sum(n, [x, y](int64_t i) { return x[i] * y[i]; });
}

// Largest of x[0, n), n >= 1. Every lane starts at x[0] and keeps `lane > x[i] ? lane : x[i]`,
// then the lanes are scanned in order the same way. A NaN in x makes the result depend on where
// it sits (it may or may not come out), but always the same way for the same row.
inline float lane_max(const float* x, int64_t n) {
  float acc[kLanes];
  for (int l = 0; l < kLanes; ++l) acc[l] = x[0];
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] = acc[l] > x[i + l] ? acc[l] : x[i + l];
  for (int l = 0; i + l < n; ++l) acc[l] = acc[l] > x[i + l] ? acc[l] : x[i + l];
  float m = acc[0];
  for (int l = 1; l < kLanes; ++l) m = m > acc[l] ? m : acc[l];
  return m;
}

}  // namespace crucible::kernels
