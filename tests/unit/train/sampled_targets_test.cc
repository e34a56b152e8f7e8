// The Hessian pass's targets (train/sampled_targets.h): drawn from softmax(logits), a pure
// function of (seed, step, global sample, position), ignored positions kept ignored.
#include "train/sampled_targets.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace crucible {
namespace {

constexpr int64_t kVocab = 5;

std::vector<float> RepeatedLogits(int64_t positions) {
  const float row[kVocab] = {1.0f, 0.0f, -1.0f, 2.0f, -30.0f};
  std::vector<float> logits;
  for (int64_t i = 0; i < positions; ++i) logits.insert(logits.end(), row, row + kVocab);
  return logits;
}

TEST(SampleTargets, FollowTheSoftmaxAtTemperatureOne) {
  const int64_t rows = 400, seq = 50, n = rows * seq;
  const std::vector<float> logits = RepeatedLogits(n);
  const std::vector<int32_t> targets(n, 0);
  std::vector<int32_t> out(n);
  SampleTargets(logits.data(), targets.data(), rows, seq, kVocab, 7, 3, 0, out.data());
  std::vector<double> count(kVocab, 0.0);
  for (int32_t t : out) {
    ASSERT_GE(t, 0);
    ASSERT_LT(t, kVocab);
    count[t] += 1;
  }
  double total = 0;
  const double l[kVocab] = {1, 0, -1, 2, -30};
  for (double x : l) total += std::exp(x);
  for (int64_t v = 0; v < kVocab; ++v) {
    const double p = std::exp(l[v]) / total, sd = std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(count[v] / n, p, 5 * sd + 1e-9) << v;
  }
}

TEST(SampleTargets, APureFunctionOfSeedStepSampleAndPosition) {
  const int64_t rows = 4, seq = 8, n = rows * seq;
  const std::vector<float> logits = RepeatedLogits(n);
  std::vector<int32_t> targets(n, 1);
  targets[3] = -1;
  targets[20] = -1;
  std::vector<int32_t> whole(n), parts(n), other_step(n), other_seed(n);
  SampleTargets(logits.data(), targets.data(), rows, seq, kVocab, 7, 3, 10, whole.data());
  // The same samples cut into two micro-batches of two rows: global samples 10-11, 12-13.
  SampleTargets(logits.data(), targets.data(), 2, seq, kVocab, 7, 3, 10, parts.data());
  SampleTargets(logits.data() + 2 * seq * kVocab, targets.data() + 2 * seq, 2, seq, kVocab, 7, 3,
                12, parts.data() + 2 * seq);
  EXPECT_EQ(whole, parts);
  EXPECT_EQ(whole[3], -1);
  EXPECT_EQ(whole[20], -1);
  SampleTargets(logits.data(), targets.data(), rows, seq, kVocab, 7, 4, 10, other_step.data());
  SampleTargets(logits.data(), targets.data(), rows, seq, kVocab, 8, 3, 10, other_seed.data());
  EXPECT_NE(whole, other_step);
  EXPECT_NE(whole, other_seed);
}

}  // namespace
}  // namespace crucible
