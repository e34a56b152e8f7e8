// The step guards (train/step_guard.h) and the batch-size ramp, through the real Trainer on a
// tiny Llama: a skipped update leaves the weights and the optimizer state as they were, a
// guarded run ends bit-identical to one that skips the same steps by config, the limits stop
// the run with exit 3, and a ramped or spike-guarded run resumed mid-way equals the
// uninterrupted one.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/files.h"
#include "support/tiny_training.h"
#include "train/step_guard.h"
#include "train/trainer.h"

namespace crucible {
namespace {

namespace fs = std::filesystem;

// Stops the run with exit 143 after step `stop_at` (once the built-in hooks saved it).
struct StopAfter : TrainerHook {
  explicit StopAfter(int64_t stop_at) : stop_at(stop_at) {}
  std::optional<int> AfterStep(const StepReport& report) override {
    return report.step == stop_at ? std::optional<int>(143) : std::nullopt;
  }
  int64_t stop_at;
};

class GuardsTest : public ::testing::Test {
 protected:
  void SetUp() override { root_ = test_support::FreshTestFolder("crucible-guards"); }
  void TearDown() override { fs::remove_all(root_); }

  Config Make(const std::string& folder, int64_t steps, const std::vector<std::string>& sets) {
    Config config = test_support::TinyTrainingConfig(root_ / folder, steps);
    for (const char* o : {"optimizer.lr=0.01", "lr_scheduler.decay_type=constant",
                          "checkpoint.async=false", "checkpoint.keep_latest_k=0"})
      config.ApplyOverride(o);
    for (const std::string& o : sets) config.ApplyOverride(o);
    return config;
  }
  int Train(const std::string& folder, int64_t steps, const std::vector<std::string>& sets,
            int64_t stop_at = 0, const std::string& resume = "none") {
    Trainer trainer(Make(folder, steps, sets), resume);
    if (stop_at > 0) trainer.AddHook(std::make_unique<StopAfter>(stop_at));
    return trainer.Run();
  }
  std::vector<nlohmann::json> Metrics(const std::string& folder) const {
    std::vector<nlohmann::json> lines;
    std::ifstream in(root_ / folder / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
    return lines;
  }
  std::vector<double> Losses(const std::string& folder) const {
    return test_support::LoggedLosses(root_ / folder);
  }
  std::vector<float> Weights(const std::string& folder, int64_t steps) {
    return test_support::FinalWeights(Make(folder, steps, {}), root_ / folder);
  }
  // The bytes of every data file of checkpoint step-<step> (state.json and the manifest aside).
  std::string CheckpointData(const std::string& folder, int64_t step) const {
    std::string bytes;
    const fs::path dir = root_ / folder / "ckpt" / ("step-" + std::to_string(step));
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(dir))
      if (entry.path().extension() == ".safetensors") files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) bytes += f.filename().string() + ReadFile(f.string());
    return bytes;
  }
  nlohmann::json State(const std::string& folder, int64_t step) const {
    return nlohmann::json::parse(ReadFile(
        (root_ / folder / "ckpt" / ("step-" + std::to_string(step)) / "state.json").string()));
  }

  fs::path root_;
};

TEST_F(GuardsTest, AnInjectedNanGradientIsSkippedWithWeightsAndOptimizerStateUntouched) {
  // A skipped step writes no interval checkpoint, but the last step of a run always saves: stop
  // at the skipped step 3, then resume on to step 5.
  ASSERT_EQ(Train("nan", 3, {"debug.inject_nan_step=3", "checkpoint.interval=1"}), kExitOk);
  ASSERT_EQ(Train("nan", 5, {"debug.inject_nan_step=3", "checkpoint.interval=1"}), kExitOk);
  const std::string before = CheckpointData("nan", 2), after = CheckpointData("nan", 3);
  ASSERT_GT(before.size(), 1000u);
  EXPECT_EQ(before, after);  // weights and every optimizer state buffer, byte for byte
  EXPECT_NE(CheckpointData("nan", 3), CheckpointData("nan", 4));  // step 4 updated again
  const std::vector<nlohmann::json> m = Metrics("nan");
  ASSERT_EQ(m.size(), 5u);
  EXPECT_TRUE(m[2]["skipped"].get<bool>());
  EXPECT_TRUE(m[2]["grad_norm"].is_null());
  EXPECT_TRUE(m[2]["grad_norm_clipped"].is_null());
  EXPECT_FALSE(m[3]["skipped"].get<bool>());
  EXPECT_EQ(State("nan", 5)["guards"]["skipped"], 1);
  // A run that skips step 3 by config ends bit-identical.
  ASSERT_EQ(Train("listed", 5, {"debug.skip_steps=\"3\""}), kExitOk);
  EXPECT_EQ(Losses("nan"), Losses("listed"));
  EXPECT_EQ(Weights("nan", 5), Weights("listed", 5));
  ASSERT_EQ(Train("plain", 5, {}), kExitOk);
  EXPECT_NE(Weights("plain", 5), Weights("listed", 5));  // the skip did change the run
}

TEST_F(GuardsTest, ALossSpikeIsSkippedAndTheRunEqualsOneThatSkipsThatStepByConfig) {
  const std::vector<std::string> spike = {"training.spike_skip=\"loss\"", "training.spike_warmup=3",
                                          "training.spike_k=6", "debug.scale_loss_step=6",
                                          "debug.scale_loss_factor=10"};
  ASSERT_EQ(Train("spiked", 8, spike), kExitOk);
  const std::vector<nlohmann::json> m = Metrics("spiked");
  for (size_t i = 0; i < m.size(); ++i) EXPECT_EQ(m[i]["skipped"].get<bool>(), i == 5) << i;
  ASSERT_EQ(Train("listed", 8, {"debug.skip_steps=\"6\""}), kExitOk);
  std::vector<double> spiked = Losses("spiked"), listed = Losses("listed");
  EXPECT_DOUBLE_EQ(spiked[5], 10 * listed[5]);
  spiked[5] = listed[5];
  EXPECT_EQ(spiked, listed);
  EXPECT_EQ(Weights("spiked", 8), Weights("listed", 8));
}

TEST_F(GuardsTest, TheConsecutiveSkipLimitStopsWithExit3NamingTheCheckpointBeforeTheStreak) {
  try {
    Train("limit", 8,
          {"debug.skip_steps=\"3,4,5\"", "training.max_consecutive_skips=3",
           "checkpoint.interval=2"});
    FAIL() << "three skips in a row did not stop the run";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitDiverged);
    const std::string what = e.what();
    EXPECT_NE(
        what.find(
            "step 5: 3 updates skipped in a row since step 3 (training.max_consecutive_skips = 3)"),
        std::string::npos)
        << what;
    EXPECT_NE(what.find("roll back to the last checkpoint: " +
                        (root_ / "limit" / "ckpt" / "step-2").string()),
              std::string::npos)
        << what;
  }
  // Two in a row, then an update: the count starts again.
  EXPECT_EQ(Train("reset", 6, {"debug.skip_steps=\"2,3,5,6\"", "training.max_consecutive_skips=3"}),
            kExitOk);
}

// Lion moves every weight by lr: at 1e20 the update of step 1 leaves weights that are finite
// but so large that every later loss overflows, and with max_consecutive_skips = 0 no guard stops
// the skips.
const std::vector<std::string> kBlownUp = {
    "optimizer.name=\"Lion\"",          "optimizer.lr=1e20",     "optimizer.weight_decay=0",
    "training.max_consecutive_skips=0", "checkpoint.interval=2", "training.local_batch_size=1"};

TEST_F(GuardsTest, ARunWhoseFinalLossIsNotFiniteExits3WithoutFinalWeightsWhateverTheGuards) {
  try {
    Train("blown", 5, kBlownUp);
    FAIL() << "a run that ended on a non-finite loss exited 0";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitDiverged);
    const std::string what = e.what();
    EXPECT_NE(what.find("the final loss (step 5) is not finite (nan)"), std::string::npos) << what;
    EXPECT_NE(what.find("model.safetensors was not written"), std::string::npos) << what;
  }
  EXPECT_FALSE(fs::exists(root_ / "blown" / "model.safetensors"));
  // Nothing of the diverged steps is saved: the last step's checkpoint is not written either.
  EXPECT_FALSE(fs::exists(root_ / "blown" / "ckpt" / "step-5"));
  EXPECT_EQ(Metrics("blown").size(), 5u);  // every step is still logged
}

TEST_F(GuardsTest, TheRollBackAdviceSkipsTheCheckpointWhoseStateTheNonFiniteLossesCameFrom) {
  // Saved after step 1, whose update blew the weights up: the losses from step 2 on are NaN, so
  // resuming from step-1 would replay them.
  std::vector<std::string> sets = kBlownUp;
  sets.push_back("checkpoint.interval=1");
  try {
    Train("saved", 3, sets);
    FAIL() << "a run that ended on a non-finite loss exited 0";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitDiverged);
    const std::string step1 = (root_ / "saved" / "ckpt" / "step-1").string();
    EXPECT_NE(std::string(e.what()).find("nor any since step 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("roll back to the last checkpoint: none kept from before "
                                         "it (not " +
                                         step1 + ": the trouble began at step 2"),
              std::string::npos)
        << e.what();
    EXPECT_TRUE(fs::exists(step1));
  }
}

TEST_F(GuardsTest, NonFiniteGradientsWarnOncePerStepWithTheirCount) {
  testing::internal::CaptureStderr();
  EXPECT_THROW(Train("warned", 3, kBlownUp), Error);
  const std::string log = testing::internal::GetCapturedStderr();
  // Four micro-batches a step (global batch 4, micro-batch 1), every one non-finite from step 2.
  for (const char* step : {"step 2: ", "step 3: "}) {
    size_t lines = 0;
    for (size_t at = log.find(std::string(step) + "non-finite gradient"); at != std::string::npos;
         at = log.find(std::string(step) + "non-finite gradient", at + 1))
      ++lines;
    EXPECT_EQ(lines, 1u) << log;
  }
  EXPECT_NE(log.find("in 4 of 4 micro-batches"), std::string::npos) << log;
}

TEST_F(GuardsTest, TheSpikeLimitStopsWithExit3) {
  try {
    Train("spikes", 8,
          {"training.spike_skip=\"loss\"", "training.spike_warmup=3", "training.spike_limit=1",
           "debug.scale_loss_step=6", "debug.scale_loss_factor=10"});
    FAIL() << "the spike limit did not stop the run";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitDiverged);
    EXPECT_NE(std::string(e.what()).find(
                  "step 6: 1 loss spikes in a row since step 6 (training.spike_limit"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(GuardsTest, ASpikeGuardedRunResumedMidWayDecidesAsTheUninterruptedOne) {
  const std::vector<std::string> spike = {"training.spike_skip=\"loss\"", "training.spike_warmup=3",
                                          "debug.scale_loss_step=6", "debug.scale_loss_factor=10",
                                          "checkpoint.interval=4"};
  ASSERT_EQ(Train("straight", 8, spike), kExitOk);
  ASSERT_EQ(Train("resumed", 8, spike, /*stop_at=*/4), 143);
  ASSERT_EQ(Train("resumed", 8, spike, 0, "auto"), kExitOk);  // the window of steps 1-4 restored
  EXPECT_EQ(Losses("resumed"), Losses("straight"));
  EXPECT_EQ(Metrics("resumed")[5]["skipped"], true);
  EXPECT_EQ(Weights("resumed", 8), Weights("straight", 8));
}

TEST_F(GuardsTest, ARampedRunGrowsItsBatchAndResumedMidStageEqualsTheUninterruptedOne) {
  // Global batch 4 (accumulation 2) for steps 1-2, 8 for 3-5, 16 for 6-8.
  const std::vector<std::string> ramp = {"training.batch_ramp=[\"2x@3\", \"16@6\"]",
                                         "training.batch_ramp_lr=\"sqrt\"",
                                         "checkpoint.interval=4"};
  ASSERT_EQ(Train("straight", 8, ramp), kExitOk);
  const std::vector<nlohmann::json> m = Metrics("straight");
  ASSERT_EQ(m.size(), 8u);
  const std::vector<int64_t> batches = {4, 4, 8, 8, 8, 16, 16, 16};
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(m[i]["global_batch"], batches[i]) << i;
  EXPECT_EQ(m[7]["tokens"], (4 + 4 + 8 + 8 + 8 + 16 + 16 + 16) * 16);
  EXPECT_DOUBLE_EQ(m[5]["lr"].get<double>(), m[1]["lr"].get<double>() * 2);  // sqrt(16 / 4)
  EXPECT_EQ(State("straight", 4)["consumed_samples"], 4 + 4 + 8 + 8);
  // The first stage is the unramped run's.
  ASSERT_EQ(Train("plain", 8, {}), kExitOk);
  EXPECT_EQ(Losses("plain")[0], Losses("straight")[0]);
  EXPECT_EQ(Losses("plain")[1], Losses("straight")[1]);
  EXPECT_NE(Losses("plain")[2], Losses("straight")[2]);
  // Stopped after step 4, in the middle of the second stage, and resumed.
  ASSERT_EQ(Train("resumed", 8, ramp, /*stop_at=*/4), 143);
  ASSERT_EQ(Train("resumed", 8, ramp, 0, "auto"), kExitOk);
  EXPECT_EQ(Losses("resumed"), Losses("straight"));
  EXPECT_EQ(Weights("resumed", 8), Weights("straight", 8));
}

TEST_F(GuardsTest, ARampStageWhoseLearningRateTimesTheDecayReachesOneIsRefusedAtStartUp) {
  // 0.05 x 10 = 0.5 passes the peak's check; batch_ramp_lr = linear makes the LR of the stage
  // from step 3 four times that: 0.2 x 10 = 2, which would flip the weights' sign every step.
  const std::vector<std::string> ramp = {"optimizer.lr=0.05", "optimizer.weight_decay=10",
                                         "training.batch_ramp=[\"4x@3\"]",
                                         "training.batch_ramp_lr=\"linear\""};
  try {
    Train("ramp", 4, ramp);
    FAIL() << "a ramp stage at lr x weight_decay = 2 trained";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    EXPECT_NE(what.find("training.batch_ramp: the stage from step 3 (global batch 16, "
                        "batch_ramp_lr = linear: 4 x the LR): optimizer.lr x 4 x "
                        "optimizer.weight_decay = 0.05 x 4 x 10 = 2: must be below 1"),
              std::string::npos)
        << what;
  }
  EXPECT_FALSE(fs::exists(root_ / "ramp" / "metrics.jsonl"));  // refused before step 1
  // Under sqrt the stage's LR is 2 x 0.05: 0.1 x 10 = 1, still refused; at weight_decay 9, 0.9.
  EXPECT_THROW(Train("sqrt", 4, {ramp[0], ramp[1], ramp[2], "training.batch_ramp_lr=\"sqrt\""}),
               Error);
  EXPECT_EQ(
      Train("fits", 4,
            {ramp[0], "optimizer.weight_decay=9", ramp[2], "training.batch_ramp_lr=\"sqrt\""}),
      kExitOk);
}

// BuildTrainingConfig's message for `ramp` (and batch_ramp_lr `rule`) on `world` ranks of
// local_batch_size 2, global batch 2 x world: "" when it is accepted.
std::string RampError(const std::string& ramp, int world, const std::string& rule = "constant") {
  Config config = Config::Defaults();
  config.ApplyOverride("training.local_batch_size=2");
  config.ApplyOverride("training.seq_len=16");
  config.ApplyOverride("training.batch_ramp=" + ramp);
  config.ApplyOverride("training.batch_ramp_lr=\"" + rule + "\"");
  try {
    BuildTrainingConfig(config, world);
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    return e.what();
  }
  return "";
}

TEST(BatchRampConfigTest, BadStagesAreOneLineUsageErrorsNamingTheKey) {
  EXPECT_EQ(RampError("[\"2x@3\", \"8@5\"]", 1), "");
  EXPECT_EQ(RampError("[\"2x@3\", \"6@5\"]", 1), "");
  EXPECT_NE(RampError("[\"4x@5\", \"8x@3\"]", 1)
                .find("training.batch_ramp: stage \"8x@3\": it "
                      "starts at step 3, not after the stage "
                      "before (step 5): stages must be in order"),
            std::string::npos);
  EXPECT_NE(RampError("[\"9@3\"]", 3)
                .find("training.batch_ramp: stage \"9@3\": its global batch 9 "
                      "is not a multiple of local_batch_size x ranks (2 x 3)"),
            std::string::npos);
  EXPECT_NE(RampError("[\"4x@3\", \"2x@5\"]", 1).find("does not grow"), std::string::npos);
  EXPECT_NE(RampError("[\"2x@1\"]", 1).find("not after the stage before"), std::string::npos);
  EXPECT_NE(RampError("[\"4x\"]", 1).find("expected <batch>@<start>"), std::string::npos);
  EXPECT_NE(RampError("[\"ax@3\"]", 1).find("training.batch_ramp: stage \"ax@3\""),
            std::string::npos);
  EXPECT_NE(RampError("[]", 1, "linear").find("training.batch_ramp_lr = \"linear\" needs"),
            std::string::npos);
  EXPECT_NE(RampError("[\"2x@3\"]", 1, "cubic").find("training.batch_ramp_lr must be"),
            std::string::npos);
}

TEST(BatchRampConfigTest, TokenStartsBecomeTheFirstStepThatBeginsWithThatManyTokens) {
  Config config = Config::Defaults();
  config.ApplyOverride("training.local_batch_size=2");
  config.ApplyOverride("training.seq_len=16");
  // 2 samples x 16 tokens a step: step 4 begins with 96 tokens; 97 waits for step 5. Then 8
  // samples (128 tokens) a step: 600 tokens are first reached at step 5 + ceil(472 / 128) = 9.
  config.ApplyOverride("training.batch_ramp=[\"8@97tokens\", \"16@600tokens\"]");
  const TrainingConfig t = BuildTrainingConfig(config, 1);
  ASSERT_EQ(t.batches.stages().size(), 3u);
  EXPECT_EQ(t.batches.stages()[1].first_step, 5);
  EXPECT_EQ(t.batches.stages()[2].first_step, 9);
  EXPECT_EQ(t.batches.SamplesBefore(9), 4 * 2 + 4 * 8);
  EXPECT_GE(t.batches.SamplesBefore(9) * 16, 600);
  EXPECT_LT(t.batches.SamplesBefore(8) * 16, 600);
  EXPECT_EQ(t.max_accumulation(), 8);
}

TEST(GuardConfigTest, ContradictoryGuardKeysAreUsageErrors) {
  Config config = Config::Defaults();
  config.ApplyOverride("training.spike_window=4");
  config.ApplyOverride("training.spike_warmup=5");
  EXPECT_THROW(BuildTrainingConfig(config, 1), Error);
  config.ApplyOverride("training.spike_warmup=4");
  config.ApplyOverride("training.spike_skip=\"gradnorm\"");
  EXPECT_THROW(BuildTrainingConfig(config, 1), Error);
  config.ApplyOverride("training.spike_skip=\"grad_norm\"");
  config.ApplyOverride("debug.skip_steps=\"3,x\"");
  EXPECT_THROW(BuildTrainingConfig(config, 1), Error);
  config.ApplyOverride("debug.skip_steps=\"3, 7\"");
  EXPECT_EQ(BuildTrainingConfig(config, 1).guards.skip_steps, (std::vector<int64_t>{3, 7}));
}

}  // namespace
}  // namespace crucible

namespace crucible {
namespace {

TEST(StepGuardTest, WarnsOnceWhenTheGradientNormRisesByTheFactorInOneStep) {
  GuardConfig config;
  config.grad_norm_rise_warn = 3.0;
  StepGuard guard(config, /*leader=*/true, [](int64_t) { return std::string("none"); });
  testing::internal::CaptureStderr();
  EXPECT_FALSE(guard.SkipUpdate(1, 2.0, 1.0));
  EXPECT_FALSE(guard.SkipUpdate(2, 2.0, 2.9));   // x2.9: below the factor
  EXPECT_FALSE(guard.SkipUpdate(3, 2.0, 9.0));   // x3.1: warns, but does not skip
  EXPECT_FALSE(guard.SkipUpdate(4, 2.0, 10.0));  // from 9: no
  const std::string warnings = testing::internal::GetCapturedStderr();
  EXPECT_EQ(std::count(warnings.begin(), warnings.end(), '\n'), 1) << warnings;
  EXPECT_NE(warnings.find("step 3: the gradient norm rose from 2.9 to 9 in one step"),
            std::string::npos)
      << warnings;
  config.grad_norm_rise_warn = 0;  // off
  StepGuard quiet(config, true, [](int64_t) { return std::string("none"); });
  testing::internal::CaptureStderr();
  quiet.SkipUpdate(1, 2.0, 1.0);
  quiet.SkipUpdate(2, 2.0, 100.0);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

}  // namespace
}  // namespace crucible
