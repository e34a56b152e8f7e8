// The LR finder's rules (train/lr_finder.h): the sweep's learning rates, the bias-corrected
// moving average and its blow-up rule, the steepest-descent point and the suggestion, and the
// one-line refusals of bad options.
#include "train/lr_finder.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>

#include "common/error.h"
#include "common/files.h"

namespace crucible {
namespace {

TEST(LrFinder, SweepIsExponentialFromMinToMax) {
  LrFindOptions options;
  options.min_lr = 1e-5;
  options.max_lr = 1e-1;
  options.steps = 5;
  EXPECT_DOUBLE_EQ(SweepLearningRate(options, 1), 1e-5);
  EXPECT_NEAR(SweepLearningRate(options, 2), 1e-4, 1e-18);
  EXPECT_NEAR(SweepLearningRate(options, 3), 1e-3, 1e-17);
  EXPECT_NEAR(SweepLearningRate(options, 5), 1e-1, 1e-15);
}

TEST(LrFinder, SmootherIsABiasCorrectedMovingAverage) {
  LossSmoother smoother(0.9);
  EXPECT_DOUBLE_EQ(smoother.Add(4.0), 4.0);  // bias correction: the first value comes back
  // (0.9 * 0.1 * 4 + 0.1 * 2) / (1 - 0.81)
  EXPECT_NEAR(smoother.Add(2.0), (0.36 + 0.2) / 0.19, 1e-12);
  EXPECT_FALSE(smoother.blew_up());
  LossSmoother none(0.0);  // beta 0: the raw loss
  EXPECT_DOUBLE_EQ(none.Add(3.0), 3.0);
  EXPECT_DOUBLE_EQ(none.Add(1.5), 1.5);
}

TEST(LrFinder, BlowUpIsFourTimesTheBestSmoothedLossOrNonFinite) {
  LossSmoother smoother(0.0);
  smoother.Add(2.0);
  smoother.Add(1.0);  // the best
  smoother.Add(4.0);  // exactly 4x: not yet
  EXPECT_FALSE(smoother.blew_up());
  smoother.Add(4.01);
  EXPECT_TRUE(smoother.blew_up());
  LossSmoother nan(0.5);
  nan.Add(1.0);
  EXPECT_TRUE(std::isnan(nan.Add(std::nan(""))));
  EXPECT_TRUE(nan.blew_up());
}

std::vector<LrSweepPoint> Points(const std::vector<double>& smoothed) {
  std::vector<LrSweepPoint> points;
  for (size_t i = 0; i < smoothed.size(); ++i)
    points.push_back({static_cast<int64_t>(i + 1), std::pow(10.0, -5.0 + static_cast<double>(i)),
                      smoothed[i], smoothed[i]});
  return points;
}

TEST(LrFinder, FindsTheSteepestDescentAndSuggestsTheSmallerOfItAndBlowUpOverTen) {
  // lr 1e-5 .. 1e1; the fastest fall (central difference) is around 1e-2 (index 3: 5 -> 2).
  const LrFindResult result = AnalyzeSweep(Points({6, 6, 5, 4, 2, 1.9, 30}), int64_t{7});
  ASSERT_TRUE(result.blowup_step);
  EXPECT_EQ(*result.blowup_step, 7);
  EXPECT_DOUBLE_EQ(result.blowup_lr, 10.0);
  ASSERT_TRUE(result.steepest_lr);
  EXPECT_DOUBLE_EQ(*result.steepest_lr, 1e-2);
  // Blow-up / 10 (1.0) is above the steepest descent: the smaller one is suggested.
  EXPECT_DOUBLE_EQ(result.suggested_lr, 1e-2);
  EXPECT_EQ(result.suggestion_rule, "steepest");
}

TEST(LrFinder, SuggestsBlowUpOverTenWhenItIsBelowTheSteepestDescent) {
  // Four points per decade from 1e-3: the fastest fall is at index 5 (10^-1.75), the blow-up at
  // index 8 (1e-1), so blow-up / 10 = 1e-2 is the smaller.
  const std::vector<double> smoothed = {6, 6, 6, 6, 6, 5, 2, 1.9, 30};
  std::vector<LrSweepPoint> points;
  for (size_t i = 0; i < smoothed.size(); ++i)
    points.push_back({static_cast<int64_t>(i + 1),
                      std::pow(10.0, -3.0 + 0.25 * static_cast<double>(i)), smoothed[i],
                      smoothed[i]});
  const LrFindResult result = AnalyzeSweep(points, int64_t{9});
  ASSERT_TRUE(result.steepest_lr);
  EXPECT_DOUBLE_EQ(*result.steepest_lr, std::pow(10.0, -1.75));
  EXPECT_DOUBLE_EQ(result.suggested_lr, result.blowup_lr / 10);
  EXPECT_EQ(result.suggestion_rule, "blowup/10");
}

TEST(LrFinder, WithoutABlowUpSuggestsTheSteepestDescent) {
  const LrFindResult result = AnalyzeSweep(Points({6, 5.9, 3, 2.95, 2.9}), std::nullopt);
  EXPECT_FALSE(result.blowup_step);
  EXPECT_DOUBLE_EQ(*result.steepest_lr, 1e-4);  // 6 -> 3 around it, 5.9 -> 2.95 next
  EXPECT_EQ(result.suggestion_rule, "steepest");
  EXPECT_DOUBLE_EQ(result.suggested_lr, *result.steepest_lr);
}

TEST(LrFinder, TheBlowUpPointIsNotACandidateForSteepestDescent) {
  // Before the blow-up only two points: no interior point, so no steepest-descent LR.
  const LrFindResult result = AnalyzeSweep(Points({5, 4, 100}), int64_t{3});
  EXPECT_FALSE(result.steepest_lr);
  EXPECT_DOUBLE_EQ(result.suggested_lr, 1e-4);
}

void ExpectUsageError(const LrFindOptions& options, const std::string& names) {
  try {
    CheckLrFindOptions(options);
    FAIL() << "accepted: " << names;
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
  }
}

TEST(LrFinder, BadOptionsAreUsageErrorsNamingTheOption) {
  LrFindOptions options;
  CheckLrFindOptions(options);  // the defaults are fine
  LrFindOptions o = options;
  o.min_lr = 0;
  ExpectUsageError(o, "--min");
  o = options;
  o.max_lr = -1;
  ExpectUsageError(o, "--max");
  o = options;
  o.min_lr = 1;
  ExpectUsageError(o, "below --max");
  o = options;
  o.steps = 4;
  ExpectUsageError(o, "--steps");
  o = options;
  o.smoothing = 1;
  ExpectUsageError(o, "--smoothing");
  o = options;
  o.config_path = "configs/tiny.toml";
  o.apply_path = "configs/../configs/tiny.toml";
  ExpectUsageError(o, "--apply");
}

TEST(LrFinder, AnApplyFileInAMissingFolderIsRefusedInsteadOfCreatingTheFolder) {
  LrFindOptions o;
  const std::string folder = ::testing::TempDir() + "/lr_find_missing-" + std::to_string(getpid());
  o.apply_path = folder + "/deeper/applied.toml";
  ExpectUsageError(o,
                   "--apply " + o.apply_path + ": the folder " + folder + "/deeper does not exist");
  EXPECT_FALSE(FileExists(folder));
}

TEST(LrFinder, AnExistingApplyFileIsRefusedUnlessOverwriteIsGiven) {
  LrFindOptions o;
  o.apply_path = ::testing::TempDir() + "/lr_find_existing-" + std::to_string(getpid()) + ".toml";
  AtomicWriteFile(o.apply_path, "[optimizer]\nlr = 1\n");
  ExpectUsageError(o, "--apply " + o.apply_path + ": exists; give --overwrite to replace it");
  o.overwrite = true;
  CheckLrFindOptions(o);
  ::unlink(o.apply_path.c_str());
}

TEST(LrFinder, AnApplyDeviceIsWrittenThroughWithoutOverwrite) {
  LrFindOptions o;
  o.apply_path = ::testing::TempDir() + "/lr_find_fifo-" + std::to_string(getpid());
  ASSERT_EQ(::mkfifo(o.apply_path.c_str(), 0644), 0);
  CheckLrFindOptions(o);  // a FIFO or device is not replaced, so nothing needs --overwrite
  ::unlink(o.apply_path.c_str());
}

}  // namespace
}  // namespace crucible
