// The Trainer's seams: a token source of the caller's (with per-token loss weights), hooks that
// see every step and may stop the run, and the typed training config. Each trains a tiny Llama
// through the real Trainer on synthetic data.
#include "train/trainer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <vector>

#include "common/error.h"
#include "common/files.h"
#include "data/token_source.h"
#include "support/tiny_training.h"

namespace crucible {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kVocab = 64, kSeqLen = 16;

// The synthetic source of the config's seed, with targets changed by the test: `weight(pos)`
// weighs target pos of every sample (a weighted source), or, with `ignore_last`, the last
// target of every sample is -1 (ignored).
class TestSource : public TokenSource {
 public:
  TestSource(std::function<float(int64_t)> weight, bool ignore_last)
      : inner_(MakeSyntheticSource(0, kVocab, kSeqLen)),
        weight_(std::move(weight)),
        ignore_last_(ignore_last) {}
  void Sample(int64_t index, int32_t* tokens) const override {
    inner_->Sample(index, tokens);
    if (ignore_last_) tokens[kSeqLen] = -1;  // a target only: inputs end at kSeqLen - 1
  }
  bool weighted() const override { return static_cast<bool>(weight_); }
  void SampleWeights(int64_t, float* weights) const override {
    for (int64_t t = 0; t < kSeqLen; ++t) weights[t] = weight_(t);
  }
  std::string Describe() const override { return "test " + inner_->Describe(); }

 private:
  std::unique_ptr<TokenSource> inner_;
  std::function<float(int64_t)> weight_;
  bool ignore_last_;
};

// Counts what it sees; stops the run with `exit_code` after step `stop_at` (0: never).
struct CountingHook : TrainerHook {
  CountingHook(std::vector<int64_t>* steps, int* ends, int64_t stop_at, int exit_code)
      : steps(steps), ends(ends), stop_at(stop_at), exit_code(exit_code) {}
  std::optional<int> AfterStep(const StepReport& report) override {
    steps->push_back(report.last ? -report.step : report.step);
    if (report.step == stop_at) return exit_code;
    return std::nullopt;
  }
  void End(bool stopped) override { *ends += stopped ? 100 : 1; }
  std::vector<int64_t>* steps;
  int* ends;
  int64_t stop_at;
  int exit_code;
};

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override { root_ = test_support::FreshTestFolder("crucible-trainer"); }
  void TearDown() override { fs::remove_all(root_); }

  Config TrainConfig(const std::string& folder) const {
    Config config = test_support::TinyTrainingConfig(root_ / folder, 6);
    config.ApplyOverride("optimizer.lr=0.01");
    return config;
  }
  int Train(const std::string& folder, std::unique_ptr<TokenSource> source) {
    Trainer trainer(TrainConfig(folder), "none", std::move(source));
    return trainer.Run();
  }
  std::vector<float> FinalWeights(const std::string& folder) const {
    return test_support::FinalWeights(TrainConfig(folder), root_ / folder);
  }
  std::vector<double> Losses(const std::string& folder) const {
    return test_support::LoggedLosses(root_ / folder);
  }

  fs::path root_;
};

TEST_F(TrainerTest, AllOnesLossWeightsTrainBitIdenticallyToNone) {
  ASSERT_EQ(Train("plain", std::make_unique<TestSource>(nullptr, false)), kExitOk);
  ASSERT_EQ(Train("ones", std::make_unique<TestSource>([](int64_t) { return 1.0f; }, false)),
            kExitOk);
  EXPECT_EQ(Losses("plain"), Losses("ones"));
  EXPECT_EQ(FinalWeights("plain"), FinalWeights("ones"));
  // And the plain source is the config's own synthetic data.
  Trainer trainer(TrainConfig("config"), "none");
  ASSERT_EQ(trainer.Run(), kExitOk);
  EXPECT_EQ(FinalWeights("config"), FinalWeights("plain"));
}

TEST_F(TrainerTest, AZeroLossWeightDropsATargetExactlyAsIgnoringItDoes) {
  auto last_zero = [](int64_t t) { return t == kSeqLen - 1 ? 0.0f : 1.0f; };
  ASSERT_EQ(Train("zero", std::make_unique<TestSource>(last_zero, false)), kExitOk);
  ASSERT_EQ(Train("ignored", std::make_unique<TestSource>(nullptr, true)), kExitOk);
  ASSERT_EQ(Train("plain", std::make_unique<TestSource>(nullptr, false)), kExitOk);
  EXPECT_EQ(Losses("zero"), Losses("ignored"));
  EXPECT_EQ(FinalWeights("zero"), FinalWeights("ignored"));
  EXPECT_NE(Losses("zero"), Losses("plain"));  // the weights did change the objective
}

TEST_F(TrainerTest, LossWeightsThatSumToNothingAreADataError) {
  try {
    Train("nothing", std::make_unique<TestSource>([](int64_t) { return 0.0f; }, false));
    FAIL() << "trained on a batch with no weight";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitBadData);
    EXPECT_NE(std::string(e.what()).find("step 1: the global batch has no valid target tokens"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(TrainerTest, AHookSeesEveryStepAndTheEnd) {
  std::vector<int64_t> steps;
  int ends = 0;
  Trainer trainer(TrainConfig("hooked"), "none");
  trainer.AddHook(std::make_unique<CountingHook>(&steps, &ends, 0, 0));
  ASSERT_EQ(trainer.Run(), kExitOk);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, -6}));  // -6: the last
  EXPECT_EQ(ends, 1);
}

TEST_F(TrainerTest, AHookStopsTheRunWithItsExitCodeAfterTheBuiltInHooks) {
  std::vector<int64_t> steps;
  int ends = 0;
  Trainer trainer(TrainConfig("stopped"), "none");
  trainer.AddHook(std::make_unique<CountingHook>(&steps, &ends, 3, 42));
  EXPECT_EQ(trainer.Run(), 42);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(ends, 100);                     // End(stopped = true), once
  EXPECT_EQ(Losses("stopped").size(), 3u);  // the metrics hook ran before it, each step
  EXPECT_FALSE(fs::exists(root_ / "stopped" / "model.safetensors"));  // not a finished run
}

TEST_F(TrainerTest, AHessianIntervalLongerThanTheRunWarnsAtStartUpNamingBothNumbers) {
  Config config = TrainConfig("sophia");
  config.ApplyOverride("optimizer.name=\"SophiaG\"");
  config.ApplyOverride("optimizer.sophia_k=20");
  testing::internal::CaptureStderr();
  {
    Trainer trainer(config, "none");
    ASSERT_EQ(trainer.Run(), kExitOk);
  }
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("optimizer.name = SophiaG estimates its Hessian every 20 steps, but steps 1 "
                     "to 6 (training.steps = 6) hold no multiple of 20: it is never estimated"),
            std::string::npos)
      << log;
  config.ApplyOverride("optimizer.sophia_k=3");  // steps 3 and 6
  testing::internal::CaptureStderr();
  {
    Trainer trainer(config, "none");
    ASSERT_EQ(trainer.Run(), kExitOk);
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr().find("never estimated"), std::string::npos);
}

TEST(TrainingConfigTest, ResolvesTheGlobalBatchAndTheShape) {
  Config config = Config::Defaults();
  config.ApplyOverride("training.local_batch_size=2");
  config.ApplyOverride("training.global_batch_size=0");
  config.ApplyOverride("parallelism.overlap_grad_reduce=true");
  TrainingConfig t = BuildTrainingConfig(config, 3);
  EXPECT_EQ(t.global_batch, 6);
  EXPECT_EQ(config.Int("training.global_batch_size"), 6);  // recorded for the run directory
  EXPECT_EQ(t.shape.accumulation, 1);
  EXPECT_TRUE(t.shape.overlap);
  EXPECT_EQ(t.tokens_per_step(1), 6 * t.shape.seq_len);
  config.ApplyOverride("training.global_batch_size=24");
  t = BuildTrainingConfig(config, 3);
  EXPECT_EQ(t.shape.accumulation, 4);
  EXPECT_EQ(t.accumulation(1) * t.shape.micro_batch, 8);
  EXPECT_FALSE(BuildTrainingConfig(config, 1).shape.overlap);  // nothing to overlap on one rank
  EXPECT_FALSE(BuildTrainingConfig(config, 1).check_consistency());
  config.ApplyOverride("training.global_batch_size=10");
  try {
    BuildTrainingConfig(config, 3);
    FAIL() << "10 is not a multiple of 2 x 3";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    EXPECT_NE(std::string(e.what()).find("training.global_batch_size (10)"), std::string::npos);
  }
}

}  // namespace
}  // namespace crucible
