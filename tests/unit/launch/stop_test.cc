// A stop through the launcher: the trainer's `stopped` line, the grace measured from its step
// and save times, and the exit code judged from the checkpoint it names (docs/launch.md,
// "Stopping a job").
#include "launch/stop.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "ckpt/checkpoint.h"
#include "common/config.h"
#include "common/error.h"
#include "common/strings.h"

namespace crucible {
namespace {

namespace fs = std::filesystem;

AttemptLog LogOf(const std::string& text) {
  AttemptLog log(nullptr, {"n1"});
  double t = 0;
  for (const std::string& line : Split(text, '\n')) {
    if (line.empty()) continue;
    // "@<seconds> <line>" sets the time a line arrived.
    std::string body = line;
    if (line[0] == '@') {
      t = std::stod(line.substr(1));
      body = line.substr(line.find(' ') + 1);
    }
    log.Add(ParseOutputLine(body, LabelStyle::kColon), t);
  }
  return log;
}

TEST(StoppedLine, ParsesTheTrainersLastWord) {
  auto stopped =
      ParseStoppedLine("stopped step=12 signal=SIGUSR1 checkpoint=/runs/a b/ckpt/step-12 exit=143");
  ASSERT_TRUE(stopped);
  EXPECT_EQ(stopped->step, 12);
  EXPECT_EQ(stopped->signal, "SIGUSR1");
  EXPECT_EQ(stopped->checkpoint, "/runs/a b/ckpt/step-12");  // a path with a space
  EXPECT_EQ(stopped->exit_code, 143);
  auto none = ParseStoppedLine("stopped step=3 signal=SIGTERM checkpoint=none exit=75");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->checkpoint, "none");
  EXPECT_EQ(none->exit_code, 75);
  EXPECT_FALSE(ParseStoppedLine("step=3 loss=1.0"));
  EXPECT_FALSE(ParseStoppedLine("stopped step=x signal=SIGTERM checkpoint=none exit=75"));
  EXPECT_FALSE(ParseStoppedLine("stopped step=3 signal=SIGTERM"));
  // Through the log, rank label and all.
  AttemptLog log = LogOf("0: stopped step=9 signal=SIGUSR1 checkpoint=ckpt/step-9 exit=143\n");
  ASSERT_TRUE(log.stopped());
  EXPECT_EQ(log.stopped()->checkpoint, "ckpt/step-9");
}

TEST(StopGrace, AssumesAMinuteForASaveBeforeTheFirstOne) {
  AttemptLog nothing = LogOf("");
  EXPECT_DOUBLE_EQ(StopGraceSeconds(nothing, 1), 3 * 60 + 10);
  EXPECT_DOUBLE_EQ(StopGraceSeconds(nothing, 500), 500);  // never less than --kill-grace
}

TEST(StopGrace, GrowsWithTheLongestStepAndSaveTheTrainerReported) {
  AttemptLog log = LogOf(
      "@1.0 0: step=1 loss=10\n"
      "@1.5 0: step=2 loss=9\n"
      "@1.6 0: phase=checkpoint step=2 mode=async reason=interval stall_s=0.2500 copy_s=0.2500 "
      "wait_s=0.0000 state_bytes=100\n"
      "@4.0 0: phase=checkpoint step=2 status=complete path=ckpt/step-2 bytes=100 write_s=4.000\n"
      "@4.5 0: step=3 loss=8\n"  // the longest gap between step lines: 3 s
      "@5.0 0: step=4 loss=7\n"
      "@5.1 0: phase=checkpoint step=4 mode=sync reason=interval stall_s=1.5000 copy_s=0.2 "
      "wait_s=0.0000 state_bytes=100\n");
  ASSERT_TRUE(log.longest_step_seconds());
  EXPECT_DOUBLE_EQ(*log.longest_step_seconds(), 3.0);
  ASSERT_TRUE(log.longest_save_seconds());
  EXPECT_DOUBLE_EQ(*log.longest_save_seconds(), 1.5 + 4.0);  // longest stall + longest write
  EXPECT_DOUBLE_EQ(StopGraceSeconds(log, 1), 3 * (3.0 + 5.5) + 10);
}

class JudgeStopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("stop_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // A real checkpoint of a tiny model at <root>/step-<step>.
  std::string WriteComplete(int64_t step) {
    Config config = Config::Defaults();
    for (const char* o : {"model.vocab_size=64", "model.dim=16", "model.n_layers=1",
                          "model.n_heads=2", "model.n_kv_heads=1", "model.ffn_hidden_dim=32"})
      config.ApplyOverride(o);
    const std::shared_ptr<const ModelSpec> model = BuildModelSpec(config);
    const ParameterTable table = model->BuildTable();
    CheckpointSnapshot snapshot;
    snapshot.step = step;
    snapshot.weights.assign(table.total(), 0.5f);
    snapshot.optimizer_state = {{"exp_avg", std::vector<float>(table.total(), 1.0f)}};
    snapshot.state = {{"step", step}};
    snapshot.config_toml = config.ToToml();
    return WriteCheckpoint(root_.string(), snapshot, table, *model).path;
  }
  std::string Stopped(const std::string& checkpoint, int exit_code) {
    return StrFormat("0: step=5 loss=1\n0: stopped step=5 signal=SIGUSR1 checkpoint=%s exit=%d\n",
                     checkpoint.c_str(), exit_code);
  }

  fs::path root_;
};

TEST_F(JudgeStopTest, A143NeedsTheNamedCheckpointComplete) {
  const std::string path = WriteComplete(5);
  StopJudgement ok = JudgeStop(LogOf(Stopped(path, 143)), {143, true, false, ""});
  EXPECT_TRUE(ok.applies);
  EXPECT_EQ(ok.exit_code, kExitSignalled);
  EXPECT_EQ(ok.checkpoint, path);
  EXPECT_EQ(ok.problem, "");
  // The same, but the ranks were signalled directly (no stop through the launcher).
  EXPECT_EQ(JudgeStop(LogOf(Stopped(path, 143)), {143, false, false, ""}).exit_code, 143);
  // Killed after the grace, but the checkpoint had been completed: still 143.
  EXPECT_EQ(JudgeStop(LogOf(Stopped(path, 143)), {137, true, false, "was killed after the grace"})
                .exit_code,
            143);

  // A complete checkpoint, but of another step than the one the trainer stopped at.
  StopJudgement other =
      JudgeStop(LogOf("0: stopped step=6 signal=SIGUSR1 checkpoint=" + path + " exit=143\n"),
                {143, true, false, ""});
  EXPECT_EQ(other.exit_code, 75);
  EXPECT_EQ(other.problem, "checkpoint " + path +
                               " named by the trainer is not the one of step 6 "
                               "(step-6); the job exited 143");

  fs::remove(fs::path(path) / "COMPLETE");
  StopJudgement incomplete = JudgeStop(LogOf(Stopped(path, 143)), {143, true, false, ""});
  EXPECT_EQ(incomplete.exit_code, kExitStoppedNoCheckpoint);
  EXPECT_EQ(incomplete.problem, "checkpoint " + path +
                                    " named by the trainer is not complete: COMPLETE is missing "
                                    "(the save never finished); the job exited 143");
}

TEST_F(JudgeStopTest, WithoutACheckpointOrAStoppedLineIts75) {
  StopJudgement none = JudgeStop(LogOf(Stopped("none", 75)), {75, true, false, ""});
  EXPECT_EQ(none.exit_code, 75);
  EXPECT_EQ(none.checkpoint, "");
  EXPECT_NE(none.problem.find("without a checkpoint (checkpoint=none)"), std::string::npos);
  StopJudgement silent = JudgeStop(LogOf("0: step=5 loss=1\n"), {1, true, false,
                                                                 "was killed at once by a second "
                                                                 "signal to the launcher"});
  EXPECT_EQ(silent.exit_code, 75);
  EXPECT_EQ(silent.problem,
            "the job was killed at once by a second signal to the launcher without a 'stopped "
            "step=...' line");
  // A "143" from a job that printed no stopped line is not believed either.
  EXPECT_EQ(JudgeStop(LogOf("0: step=5 loss=1\n"), {143, false, false, ""}).exit_code, 75);
}

TEST_F(JudgeStopTest, OtherExitsAreLeftAlone) {
  EXPECT_FALSE(JudgeStop(LogOf("0: step=5 loss=1\n"), {1, false, false, ""}).applies);
  EXPECT_FALSE(JudgeStop(LogOf("0: step=5 loss=1\n"), {124, false, true, ""}).applies);
  // The job finished before the stop took effect.
  EXPECT_FALSE(JudgeStop(LogOf("0: done steps=5\n"), {0, true, false, ""}).applies);
}

}  // namespace
}  // namespace crucible
