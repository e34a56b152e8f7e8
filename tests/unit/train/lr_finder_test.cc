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

// Sweep points with these smoothed losses (the raw loss the same), at `per_decade` points per
// decade of LR from 10^first. `plateau` points at the first loss come before them: the steepest
// descent skips the first kSkipStart points of the curve.
std::vector<LrSweepPoint> Points(std::vector<double> smoothed, double first = -5.0,
                                 double per_decade = 1.0, size_t plateau = kSkipStart) {
  smoothed.insert(smoothed.begin(), plateau, smoothed.front());
  std::vector<LrSweepPoint> points;
  for (size_t i = 0; i < smoothed.size(); ++i)
    points.push_back({static_cast<int64_t>(i + 1),
                      std::pow(10.0, first + static_cast<double>(i) / per_decade), smoothed[i],
                      smoothed[i]});
  return points;
}

std::string AnalysisError(std::vector<LrSweepPoint> points, std::optional<int64_t> blowup) {
  try {
    AnalyzeSweep(std::move(points), blowup);
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    return e.what();
  }
  return "";
}

TEST(LrFinder, FindsTheSteepestDescentAndSuggestsTheSmallerOfItAndBlowUpOverTen) {
  // After the plateau (lr 1e-15 .. 1e-6), lr 1e-5 .. 1e1: the fastest fall (central difference)
  // is around 1e-2 (5 -> 2).
  const LrFindResult result = AnalyzeSweep(Points({6, 6, 5, 4, 2, 1.9, 30}, -15), int64_t{17});
  ASSERT_TRUE(result.blowup_step);
  EXPECT_EQ(*result.blowup_step, 17);
  EXPECT_DOUBLE_EQ(result.blowup_lr, 10.0);
  ASSERT_TRUE(result.steepest_lr);
  EXPECT_NEAR(*result.steepest_lr, 1e-2, 1e-15);
  // Blow-up / 10 (1.0) is above the steepest descent: the smaller one is suggested.
  EXPECT_DOUBLE_EQ(result.suggested_lr, *result.steepest_lr);
  EXPECT_EQ(result.suggestion_rule, "steepest");
}

TEST(LrFinder, SuggestsBlowUpOverTenWhenItIsBelowTheSteepestDescent) {
  // Four points per decade: the fastest fall is at 10^-1.75, the blow-up at 1e-1, so
  // blow-up / 10 = 1e-2 is the smaller (and below the 10^-1.25 of the step before the blow-up).
  const LrFindResult result =
      AnalyzeSweep(Points({6, 6, 6, 6, 6, 5, 2, 1.9, 30}, -5.5, 4), int64_t{19});
  ASSERT_TRUE(result.steepest_lr);
  EXPECT_NEAR(*result.steepest_lr, std::pow(10.0, -1.75), 1e-15);
  EXPECT_DOUBLE_EQ(result.suggested_lr, result.blowup_lr / 10);
  EXPECT_EQ(result.suggestion_rule, "blowup/10");
}

TEST(LrFinder, WithoutABlowUpSuggestsTheSteepestDescent) {
  const LrFindResult result = AnalyzeSweep(Points({6, 5.9, 3, 2.95, 2.9}, -14), std::nullopt);
  EXPECT_FALSE(result.blowup_step);
  EXPECT_NEAR(*result.steepest_lr, 1e-3, 1e-16);  // 6 -> 3 around it, 5.9 -> 2.95 next
  EXPECT_EQ(result.suggestion_rule, "steepest");
  EXPECT_DOUBLE_EQ(result.suggested_lr, *result.steepest_lr);
}

TEST(LrFinder, TheSteepestDescentSkipsTheFirstPointsOfTheCurve) {
  // The bias-corrected average's first points fall fastest of all (9 -> 5.8 around the second);
  // as fastai's, the search starts at point kSkipStart, and finds the fall 5.3 -> 4.4 there.
  const std::vector<double> smoothed = {9,    6,   5.8,  5.7, 5.65, 5.6, 5.55, 5.5,
                                        5.45, 5.4, 5.35, 5.3, 4.5,  4.4, 4.35};
  const std::vector<LrSweepPoint> points = Points(smoothed, -5, 4, 0);
  const LrFindResult result = AnalyzeSweep(points, std::nullopt);
  ASSERT_TRUE(result.steepest_lr);
  EXPECT_DOUBLE_EQ(*result.steepest_lr, points[12].lr);
}

TEST(LrFinder, NeverSuggestsALearningRateAtOrPastOneTheSweepSawDiverge) {
  // --min 1e20 --max 1e30 --steps 10: the loss of step 2 is NaN, so the update of step 1 (1e20)
  // diverged; blow-up / 10 = 1.29e20 is past it, and one point is too few for anything else.
  std::vector<LrSweepPoint> points = {{1, 1e20, 5.5, 5.5},
                                      {2, 1e20 * std::pow(1e10, 1.0 / 9), NAN, NAN}};
  const std::string what = AnalysisError(points, int64_t{2});
  EXPECT_NE(what.find("blew up at step 2"), std::string::npos) << what;
  EXPECT_NE(what.find("1 point before it"), std::string::npos) << what;
  EXPECT_NE(what.find("lower --min"), std::string::npos) << what;
  // Coarser than a decade a step, blow-up / 10 lies past the step before the blow-up: the
  // steepest descent is suggested instead.
  points = Points({6, 6, 5, 3, 2.9, NAN}, -3, 0.8);
  const LrFindResult result = AnalyzeSweep(points, int64_t{16});
  EXPECT_GT(result.blowup_lr / 10, points[14].lr);
  EXPECT_EQ(result.suggestion_rule, "steepest");
  EXPECT_LT(result.suggested_lr, points[14].lr);
  // Too few points for a steepest descent, and blow-up / 10 at the step before it: refused.
  EXPECT_NE(AnalysisError(Points({5, 4, 100}, -5, 1, 0), int64_t{3}).find("too few points"),
            std::string::npos);
}

TEST(LrFinder, AFlatCurveIsSaidAndGetsNoSuggestion) {
  // Random tokens: the loss stays at ln(vocab) whatever the LR.
  std::vector<double> flat;
  for (int i = 0; i < 30; ++i) flat.push_back(5.545 + 0.002 * ((i * 7) % 5 - 2));
  const std::string what = AnalysisError(Points(flat, -6, 5, 0), std::nullopt);
  EXPECT_NE(what.find("flat"), std::string::npos) << what;
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
