// The learning rate of each stage's LR policy (train/stages.h, docs/training.md#stages) at the
// stage boundaries, from the stated formulas; how the trainer's config takes the stages
// (training.steps is their total; a disagreeing one is refused in one line); and the trainer's
// stage-boundary hook.
#include "train/stages.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"
#include "data/token_source.h"
#include "support/tiny_training.h"
#include "train/trainer.h"
#include "train/training_config.h"

namespace crucible {
namespace {

// optimizer.lr = 1, warmup 2, cosine to 0.1 (min_lr_factor).
LrScheduleConfig Base(const std::string& decay = "cosine") {
  LrScheduleConfig s;
  s.lr = 1.0;
  s.warmup_steps = 2;
  s.decay_type = decay;
  s.decay_ratio = 0.2;
  s.min_lr_factor = 0.1;
  s.total_steps = 999;  // not used by the stages
  return s;
}

DataStage Stage(int64_t first_step, int64_t steps, LrPolicy policy, int64_t warmup = -1,
                double fraction = 1) {
  DataStage s;
  s.name = "s" + std::to_string(first_step);
  s.where = "[[data.stages]] " + s.name;
  s.first_step = first_step;
  s.steps = steps;
  s.lr_policy = policy;
  s.warmup_steps = warmup;
  s.peak_fraction = fraction;
  return s;
}

// The cosine formula of docs/training.md: floor + (peak - floor)(1 + cos(pi x progress)) / 2.
double Cosine(double peak, double progress) {
  const double floor = peak * 0.1;
  return floor + (peak - floor) * 0.5 * (1 + std::cos(M_PI * progress));
}

TEST(StageLearningRate, ContinueStagesAreTheRunsScheduleBitForBit) {
  for (const char* decay : {"constant", "linear", "cosine", "wsd"}) {
    const std::vector<LrSegment> segments = StageLrSegments(
        Base(decay), {Stage(1, 10, LrPolicy::kContinue), Stage(11, 7, LrPolicy::kContinue),
                      Stage(18, 3, LrPolicy::kContinue)});
    LrScheduleConfig whole = Base(decay);
    whole.total_steps = 20;
    for (int64_t step = 1; step <= 20; ++step)
      EXPECT_EQ(SegmentedLearningRate(segments, step), LearningRate(whole, step))
          << decay << " step " << step;
  }
}

TEST(StageLearningRate, RewarmClimbsBackToThePeakAndDecaysOverItsStage) {
  const std::vector<LrSegment> segments = StageLrSegments(
      Base(), {Stage(1, 10, LrPolicy::kContinue), Stage(11, 10, LrPolicy::kRewarm, 4)});
  auto lr = [&](int64_t step) { return SegmentedLearningRate(segments, step); };
  // Stage 1 is a segment of its own (10 steps): warmup 2, cosine to the floor at its last step.
  EXPECT_DOUBLE_EQ(lr(1), 0.5);
  EXPECT_DOUBLE_EQ(lr(2), 1.0);
  EXPECT_NEAR(lr(6), Cosine(1.0, 4.0 / 8), 1e-15);
  EXPECT_NEAR(lr(10), 0.1, 1e-15);
  // Stage 2: u = step - 10; warmup 4 to the peak, then cosine over the remaining 6 steps.
  EXPECT_DOUBLE_EQ(lr(11), 0.25);
  EXPECT_DOUBLE_EQ(lr(14), 1.0);
  EXPECT_NEAR(lr(17), Cosine(1.0, 3.0 / 6), 1e-15);
  EXPECT_NEAR(lr(20), 0.1, 1e-15);
}

TEST(StageLearningRate, GentleIsTheSameShapeToAFractionOfThePeak) {
  const std::vector<LrSegment> gentle = StageLrSegments(
      Base(), {Stage(1, 10, LrPolicy::kContinue), Stage(11, 10, LrPolicy::kGentle, 4, 0.3)});
  const std::vector<LrSegment> rewarm = StageLrSegments(
      Base(), {Stage(1, 10, LrPolicy::kContinue), Stage(11, 10, LrPolicy::kRewarm, 4)});
  for (int64_t step = 1; step <= 10; ++step)
    EXPECT_EQ(SegmentedLearningRate(gentle, step), SegmentedLearningRate(rewarm, step));
  EXPECT_NEAR(SegmentedLearningRate(gentle, 11), 0.3 / 4, 1e-15);
  EXPECT_NEAR(SegmentedLearningRate(gentle, 14), 0.3, 1e-15);
  EXPECT_NEAR(SegmentedLearningRate(gentle, 17), Cosine(0.3, 0.5), 1e-15);
  EXPECT_NEAR(SegmentedLearningRate(gentle, 20), 0.03, 1e-15);  // 0.3 x min_lr_factor
  for (int64_t step = 11; step <= 20; ++step)
    EXPECT_NEAR(SegmentedLearningRate(gentle, step), 0.3 * SegmentedLearningRate(rewarm, step),
                1e-15);
}

TEST(StageLearningRate, ContinueAfterARewarmGoesOnWithItsSegment) {
  const std::vector<LrSegment> segments = StageLrSegments(
      Base(), {Stage(1, 10, LrPolicy::kContinue), Stage(11, 10, LrPolicy::kRewarm, 4),
               Stage(21, 10, LrPolicy::kContinue)});
  ASSERT_EQ(segments.size(), 2u);
  EXPECT_EQ(segments[1].first_step, 11);
  EXPECT_EQ(segments[1].schedule.total_steps, 20);  // stages 2 and 3 together
  auto lr = [&](int64_t step) { return SegmentedLearningRate(segments, step); };
  // Across the boundary of stages 2 and 3 the segment's cosine (20 steps, warmup 4) goes on.
  EXPECT_NEAR(lr(20), Cosine(1.0, 6.0 / 16), 1e-15);
  EXPECT_NEAR(lr(21), Cosine(1.0, 7.0 / 16), 1e-15);
  EXPECT_NEAR(lr(30), 0.1, 1e-15);
}

TEST(StageLearningRate, AStageWarmsUpOverTheSchedulesWarmupUnlessItSaysOtherwise) {
  const std::vector<LrSegment> segments = StageLrSegments(
      Base(), {Stage(1, 10, LrPolicy::kGentle, -1, 0.5), Stage(11, 10, LrPolicy::kRewarm)});
  EXPECT_DOUBLE_EQ(SegmentedLearningRate(segments, 1), 0.25);  // 0.5 x 1/2
  EXPECT_DOUBLE_EQ(SegmentedLearningRate(segments, 2), 0.5);   // a gentle first stage
  EXPECT_DOUBLE_EQ(SegmentedLearningRate(segments, 11), 0.5);  // lr_scheduler.warmup_steps = 2
  EXPECT_DOUBLE_EQ(SegmentedLearningRate(segments, 12), 1.0);
}

TEST(StageLearningRate, AWsdWarmupReachingIntoItsSegmentsDecayIsRefusedNamingTheStage) {
  try {
    StageLrSegments(Base("wsd"),
                    {Stage(1, 10, LrPolicy::kContinue), Stage(11, 10, LrPolicy::kRewarm, 9)});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    EXPECT_NE(std::string(e.what()).find("[[data.stages]] s11: the LR segment it starts (10 "
                                         "steps): warmup_steps = 9 reaches into the wsd decay"),
              std::string::npos)
        << e.what();
  }
}

class StagedTrainingConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    list_ = ::testing::TempDir() + "/stages-" + std::to_string(::getpid()) + ".txt";
    AtomicWriteFile(list_, "1 a\n");
  }
  void TearDown() override { std::remove(list_.c_str()); }
  Config Staged(const std::string& training) const {
    return Config::Parse("[training]\nglobal_batch_size = 8\nlocal_batch_size = 4\nseq_len = 16\n" +
                             training + "\n[[data.stages]]\nlist = \"" + list_ +
                             "\"\nsteps = 6\n[[data.stages]]\nlist = \"" + list_ +
                             "\"\ntokens = 512\nlr_policy = \"rewarm\"\n",
                         "run.toml");
  }
  std::string list_;
};

TEST_F(StagedTrainingConfigTest, TheStagesSetTrainingSteps) {
  Config config = Staged("dataset = \"blend\"");
  const TrainingConfig t = BuildTrainingConfig(config, 1);
  EXPECT_EQ(t.steps, 10);  // 6, then 512 / (8 x 16) = 4
  EXPECT_EQ(config.Int("training.steps"), 10);
  ASSERT_EQ(t.stages.size(), 2u);
  EXPECT_EQ(t.stages[1].first_step, 7);
  Config agreeing = Staged("dataset = \"blend\"\nsteps = 10");
  EXPECT_EQ(BuildTrainingConfig(agreeing, 1).steps, 10);
}

TEST_F(StagedTrainingConfigTest, StepsThatDisagreeWithTheStagesAreRefusedInOneLine) {
  Config config = Staged("dataset = \"blend\"\nsteps = 12");
  try {
    BuildTrainingConfig(config, 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    EXPECT_STREQ(e.what(),
                 "run.toml:6: training.steps = 12 but the stages of [[data.stages]] add up to 10 "
                 "steps (stage1 6 + stage2 4): remove training.steps (the stages set it) or make "
                 "them agree");
  }
}

TEST_F(StagedTrainingConfigTest, StagesReadBlendsOnly) {
  Config synthetic = Staged("");
  EXPECT_THROW(
      {
        try {
          BuildTrainingConfig(synthetic, 1);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("set training.dataset = \"blend\""),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
  Config both = Staged("dataset = \"blend\"\ndataset_path = \"x.txt\"");
  EXPECT_THROW(BuildTrainingConfig(both, 1), Error);
}

// Records what a hook sees of the stages; stops the run at boundary `stop_after` (-1: never).
struct StageRecorder : TrainerHook {
  explicit StageRecorder(std::vector<std::string>* seen, int stop_after = -1)
      : seen(seen), stop_after(stop_after) {}
  std::optional<int> AfterStep(const StepReport& r) override {
    seen->push_back(
        StrFormat("step %lld in %d:%s", (long long)r.step, r.stage, r.stage_name.c_str()));
    return std::nullopt;
  }
  std::optional<int> AtStageBoundary(const StageBoundary& b) override {
    seen->push_back(StrFormat("boundary at %lld: %d:%s -> %d:%s", (long long)b.step, b.finished,
                              b.finished_name.c_str(), b.next, b.next_name.c_str()));
    if (b.finished == stop_after) return 42;
    return std::nullopt;
  }
  std::vector<std::string>* seen;
  int stop_after;
};

class StageBoundaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = test_support::FreshTestFolder("crucible-stages");
    AtomicWriteFile((root_ / "list.txt").string(), "1 a\n");  // read by no one: the source is given
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  // Stage "a" (2 steps), then "b" (4 steps, rewarm), on synthetic data handed to the trainer.
  Config StagedConfig(const std::string& folder) const {
    Config config = test_support::TinyTrainingConfig(root_ / folder, 6);
    config.ApplyOverride("training.dataset=blend");
    config.ApplyOverride("checkpoint.async=false");
    config.ApplyOverride("checkpoint.interval=2");
    const std::string list = (root_ / "list.txt").string();
    config.ApplyOverride("data.stages=[{name=\"a\", list=\"" + list +
                         "\", steps=2}, {name=\"b\", list=\"" + list +
                         "\", steps=4, lr_policy=\"rewarm\"}]");
    return config;
  }
  int Run(const std::string& folder, std::vector<std::string>* seen,
          const std::string& resume = "none", int stop_after = -1) {
    Trainer trainer(StagedConfig(folder), resume, MakeSyntheticSource(0, 64, 16));
    trainer.AddHook(std::make_unique<StageRecorder>(seen, stop_after));
    return trainer.Run();
  }
  std::filesystem::path root_;
};

TEST_F(StageBoundaryTest, AHookPassesEveryBoundaryAfterTheStepHooks) {
  std::vector<std::string> seen;
  ASSERT_EQ(Run("run", &seen), kExitOk);
  EXPECT_EQ(seen, (std::vector<std::string>{"boundary at 0: 0: -> 1:a", "step 1 in 1:a",
                                            "step 2 in 1:a", "boundary at 2: 1:a -> 2:b",
                                            "step 3 in 2:b", "step 4 in 2:b", "step 5 in 2:b",
                                            "step 6 in 2:b", "boundary at 6: 2:b -> 0:"}));
}

TEST_F(StageBoundaryTest, AResumeFromABoundarysCheckpointPassesItAgain) {
  std::vector<std::string> first, resumed;
  ASSERT_EQ(Run("run", &first), kExitOk);
  std::filesystem::remove_all(root_ / "run" / "ckpt" / "step-4");
  std::filesystem::remove_all(root_ / "run" / "ckpt" / "step-6");
  std::filesystem::remove(root_ / "run" / "ckpt" / "latest");
  ASSERT_EQ(Run("run", &resumed, "auto"), kExitOk);
  ASSERT_GE(resumed.size(), 2u);
  EXPECT_EQ(resumed[0], "boundary at 2: 1:a -> 2:b");
  EXPECT_EQ(resumed[1], "step 3 in 2:b");
}

TEST_F(StageBoundaryTest, AHookStopsTheRunAtABoundaryWithItsExitCode) {
  std::vector<std::string> seen;
  EXPECT_EQ(Run("stopped", &seen, "none", /*stop_after=*/1), 42);
  EXPECT_EQ(seen.back(), "boundary at 2: 1:a -> 2:b");
  EXPECT_EQ(test_support::LoggedLosses(root_ / "stopped").size(), 2u);
}

}  // namespace
}  // namespace crucible
