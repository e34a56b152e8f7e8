// What every blend index must satisfy, for the blend fuzzers: running sample numbers, and the
// quota method's promise that at every prefix every dataset is within one sample of its share
// (checked in O(N + D): a dataset's deviation is extreme just before and just after each of its
// samples, and at the end). A small slack covers the rounding of shares to doubles.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "data/blend_index.h"

namespace crucible::fuzz {

inline void CheckBlendIndex(const std::vector<double>& weights, int64_t n) {
  const std::vector<double> shares = BlendShares(weights);
  std::vector<uint16_t> index(n);
  std::vector<int64_t> sample(n);
  BuildBlendIndex(weights, n, index.data(), sample.data());
  std::vector<int64_t> taken(weights.size(), 0);
  constexpr double kSlack = 1e-6;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t d = index[i];
    if (d >= weights.size()) __builtin_trap();
    if (sample[i] != taken[d]) __builtin_trap();
    if (std::abs(taken[d] - i * shares[d]) > 1 + kSlack) __builtin_trap();
    ++taken[d];
    if (std::abs(taken[d] - (i + 1) * shares[d]) > 1 + kSlack) __builtin_trap();
  }
  for (size_t d = 0; d < weights.size(); ++d)
    if (std::abs(taken[d] - n * shares[d]) > 1 + kSlack) __builtin_trap();
  // Prefix stability: a shorter index is the prefix of the longer one.
  const int64_t half = n / 2;
  std::vector<uint16_t> short_index(half);
  std::vector<int64_t> short_sample(half);
  BuildBlendIndex(weights, half, short_index.data(), short_sample.data());
  for (int64_t i = 0; i < half; ++i)
    if (short_index[i] != index[i] || short_sample[i] != sample[i]) __builtin_trap();
}

}  // namespace crucible::fuzz
