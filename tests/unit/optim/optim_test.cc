#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "common/error.h"
#include "distributed/exact_sum.h"
#include "optim/clipping.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer_shard.h"

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

std::string UsageErrorOf(const std::function<void()>& build) {
  try {
    build();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    return e.what();
  }
  return "";
}

TEST(OptimizerConfig, WeightDecayThatWouldZeroTheWeightsEveryStepIsRejected) {
  Config config = Config::Defaults();
  config.ApplyOverride("optimizer.lr=2");
  config.ApplyOverride("optimizer.weight_decay=0.5");
  const std::string message = UsageErrorOf([&] { BuildOptimizerConfig(config); });
  EXPECT_NE(message.find("optimizer.lr x optimizer.weight_decay = 2 x 0.5 = 1: must be below 1"),
            std::string::npos)
      << message;
  config.ApplyOverride("optimizer.weight_decay=0.4");
  EXPECT_EQ(UsageErrorOf([&] { BuildOptimizerConfig(config); }), "");
}

TEST(OptimizerConfig, TheDecayErrorOfAMatricesOnlyOptimizerNamesTheAdamWKeysThatFailed) {
  for (const char* name : {"Muon", "Mano"}) {
    Config config = Config::Defaults();
    config.ApplyOverride(std::string("optimizer.name=") + name);
    config.ApplyOverride("optimizer.lr=0.5");
    config.ApplyOverride("optimizer.weight_decay=0.1");        // 0.05: fine
    config.ApplyOverride("optimizer.adamw_weight_decay=2.5");  // 1.25 on AdamW's groups
    std::string message = UsageErrorOf([&] { BuildOptimizerConfig(config); });
    EXPECT_NE(message.find("optimizer.lr x optimizer.adamw_weight_decay = 0.5 x 2.5 = 1.25"),
              std::string::npos)
        << name << ": " << message;
    // With adamw_lr, that is the learning rate of those groups.
    config.ApplyOverride("optimizer.adamw_lr=0.8");
    message = UsageErrorOf([&] { BuildOptimizerConfig(config); });
    EXPECT_NE(message.find("optimizer.adamw_lr x optimizer.adamw_weight_decay = 0.8 x 2.5 = 2"),
              std::string::npos)
        << name << ": " << message;
  }
}

TEST(LrScheduleConfig, WsdWarmupThatRunsIntoTheDecayIsRejected) {
  Config config = Config::Defaults();
  config.ApplyOverride("training.steps=100");
  config.ApplyOverride("lr_scheduler.decay_type=wsd");
  config.ApplyOverride("lr_scheduler.warmup_steps=90");  // the decay starts after step 80
  const std::string message = UsageErrorOf([&] { BuildLrScheduleConfig(config); });
  EXPECT_NE(message.find("lr_scheduler.warmup_steps = 90"), std::string::npos) << message;
  EXPECT_NE(message.find("step 80"), std::string::npos) << message;
  config.ApplyOverride("lr_scheduler.warmup_steps=80");
  EXPECT_EQ(UsageErrorOf([&] { BuildLrScheduleConfig(config); }), "");
  // A warmup longer than a short run is fine for the other schedules (the run may be resumed
  // with more steps): the learning rate ramps for as long as the run lasts.
  config.ApplyOverride("lr_scheduler.decay_type=cosine");
  config.ApplyOverride("training.steps=6");
  config.ApplyOverride("lr_scheduler.warmup_steps=10");
  EXPECT_EQ(UsageErrorOf([&] { BuildLrScheduleConfig(config); }), "");
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
    for (int i : order) EXPECT_TRUE(acc.AddRange(0, 3, parts[i].data()));
    std::vector<float> out(3);
    Int128ToFloat(acc.data(), out.data(), 3);
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
  EXPECT_FALSE(acc.AddRange(0, 2, bad.data()));
  std::vector<float> huge = {1e30f, 0.0f};
  EXPECT_FALSE(acc.AddRange(0, 2, huge.data()));
}

// The conversions take a fast path through int64 where the value fits; they must give exactly
// what the plain 128-bit conversions give, on both sides of 2^63 (|g| = 0.5) and for sums far
// beyond int64.
TEST(ExactAccumulator, FastConversionsEqualThePlain128BitOnes) {
  std::vector<float> values;
  for (int e = -90; e <= 61; ++e)
    for (float m : {1.0f, 1.5f, 1.9999999f, 1.2345678f})
      for (float sign : {1.0f, -1.0f}) values.push_back(sign * std::ldexp(m, e));
  values.push_back(0.0f);
  values.push_back(std::nextafter(0.5f, 0.0f));
  values.push_back(-std::nextafter(0.5f, 0.0f));
  std::vector<__int128> fixed(values.size());
  ASSERT_TRUE(FloatToInt128(values.data(), fixed.data(), values.size()));
  const double scale = std::ldexp(1.0, 64);
  for (size_t i = 0; i < values.size(); ++i) {
    const __int128 plain = static_cast<__int128>(static_cast<double>(values[i]) * scale);
    EXPECT_TRUE(fixed[i] == plain) << values[i];
  }
  // Back to float, including sums that only 128 bits hold.
  std::vector<__int128> sums = fixed;
  for (__int128 v : fixed) sums.push_back(v * 3 + (v >> 7));
  sums.push_back(static_cast<__int128>(1) << 100);
  sums.push_back(-(static_cast<__int128>(1) << 63));
  sums.push_back((static_cast<__int128>(1) << 63) + 12345);
  std::vector<float> out(sums.size());
  Int128ToFloat(sums.data(), out.data(), sums.size());
  for (size_t i = 0; i < sums.size(); ++i) {
    const float plain = static_cast<float>(static_cast<double>(sums[i]) / scale);
    EXPECT_EQ(out[i], plain) << i;
  }
}

}  // namespace
}  // namespace crucible
