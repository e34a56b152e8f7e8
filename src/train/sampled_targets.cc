#include "train/sampled_targets.h"

#include <algorithm>
#include <cmath>

#include "common/philox.h"

namespace crucible {

namespace {
// Separates these draws from the other Philox streams of a run (weight init, data).
constexpr uint64_t kSampledTargetsStream = 0x50F1A6E55A000000ull;
}  // namespace

void SampleTargets(const float* logits, const int32_t* targets, int64_t rows, int64_t seq_len,
                   int64_t vocab, uint64_t seed, int64_t step, int64_t first_sample, int32_t* out) {
  const int64_t n = rows * seq_len;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    if (targets[i] < 0) {
      out[i] = -1;
      continue;
    }
    const float* row = logits + i * vocab;
    const double max = *std::max_element(row, row + vocab);
    double total = 0;
    for (int64_t v = 0; v < vocab; ++v) total += std::exp(static_cast<double>(row[v]) - max);
    // One 53-bit uniform per position: stream (step), offset 2 x (global position).
    const uint64_t position = static_cast<uint64_t>(first_sample * seq_len + i);
    Philox rng(seed, kSampledTargetsStream ^ static_cast<uint64_t>(step), 2 * position);
    const double u = static_cast<double>(rng.NextU64() >> 11) * (1.0 / 9007199254740992.0);
    const double threshold = u * total;
    double cumulative = 0;
    int32_t label = -1;
    for (int64_t v = 0; v < vocab; ++v) {
      const double p = std::exp(static_cast<double>(row[v]) - max);
      if (p > 0) label = static_cast<int32_t>(v);  // the last label with mass, if u*total is hit
      cumulative += p;
      if (cumulative > threshold) break;
    }
    out[i] = label;
  }
}

}  // namespace crucible
