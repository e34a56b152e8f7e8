#include "optim/optim.h"

#include <gtest/gtest.h>

#include <cmath>

#include "dist/exact_sum.h"

namespace crucible {
namespace {

LrScheduleConfig Schedule(const std::string& type) {
  LrScheduleConfig s;
  s.lr = 1.0;
  s.warmup_steps = 10;
  s.decay_type = type;
  s.decay_ratio = 0.2;
  s.min_lr_factor = 0.1;
  s.total_steps = 110;
  return s;
}

TEST(LrSchedule, WarmupIsLinear) {
  for (const char* type : {"constant", "linear", "cosine", "wsd"}) {
    EXPECT_DOUBLE_EQ(LearningRate(Schedule(type), 1), 0.1) << type;
    EXPECT_DOUBLE_EQ(LearningRate(Schedule(type), 10), 1.0) << type;
  }
}

TEST(LrSchedule, DecaysReachTheFloor) {
  EXPECT_DOUBLE_EQ(LearningRate(Schedule("constant"), 110), 1.0);
  EXPECT_NEAR(LearningRate(Schedule("linear"), 60), 0.55, 1e-12);
  EXPECT_NEAR(LearningRate(Schedule("linear"), 110), 0.1, 1e-12);
  EXPECT_NEAR(LearningRate(Schedule("cosine"), 60), 0.55, 1e-12);
  EXPECT_NEAR(LearningRate(Schedule("cosine"), 110), 0.1, 1e-12);
  // wsd: stable until step 88 (110 - 22), then linear to the floor.
  EXPECT_DOUBLE_EQ(LearningRate(Schedule("wsd"), 88), 1.0);
  EXPECT_NEAR(LearningRate(Schedule("wsd"), 99), 0.55, 1e-12);
  EXPECT_NEAR(LearningRate(Schedule("wsd"), 110), 0.1, 1e-12);
}

TEST(Clip, MatchesTorchClipGradNorm) {
  EXPECT_EQ(ClipScale(0.5, 1.0), 1.0f);
  EXPECT_FLOAT_EQ(ClipScale(4.0, 1.0), static_cast<float>(1.0 / (4.0 + 1e-6)));
  EXPECT_EQ(ClipScale(4.0, 0.0), 1.0f);
}

TEST(ExactAccumulator, SumDoesNotDependOnOrder) {
  std::vector<std::vector<float>> parts = {
      {1e-3f, 3.0f, -7e-9f}, {1e8f, -2.5f, 1e-30f}, {-1e8f, 1e-7f, 5e-9f}, {0.1f, 0.2f, 0.3f}};
  auto sum = [&](const std::vector<int>& order) {
    ExactAccumulator acc(3);
    acc.Zero();
    for (int i : order) EXPECT_TRUE(acc.Add(parts[i].data()));
    std::vector<float> out(3);
    acc.ToFloat(out.data());
    return out;
  };
  auto a = sum({0, 1, 2, 3}), b = sum({3, 2, 1, 0}), c = sum({2, 0, 3, 1});
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, c);
  // Float addition in the first order loses 1e-3 against 1e8; the exact sum keeps it.
  EXPECT_FLOAT_EQ(a[0], 1e-3f + 0.1f);
}

TEST(ExactAccumulator, ReportsNonFiniteValues) {
  ExactAccumulator acc(2);
  acc.Zero();
  std::vector<float> bad = {1.0f, NAN};
  EXPECT_FALSE(acc.Add(bad.data()));
  std::vector<float> huge = {1e30f, 0.0f};
  EXPECT_FALSE(acc.Add(huge.data()));
}

}  // namespace
}  // namespace crucible
