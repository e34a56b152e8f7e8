// crucible top: the frame composition (sparkline scaling, ETA, stall detection) as a pure
// function of a snapshot, and the incremental reading of a run directory (a half-written last
// line, a metrics.jsonl that a resume rewrites shorter or replaces, the launcher's attempts).
#include "report/top.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/files.h"

namespace crucible {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<TopStep> Steps(int64_t first, int64_t last, double step_seconds = 0.5) {
  std::vector<TopStep> steps;
  for (int64_t s = first; s <= last; ++s)
    steps.push_back({s, 10.0 / double(s), 1000.0 + double(s), step_seconds});
  return steps;
}

size_t CodePoints(const std::string& text) {
  size_t count = 0;
  for (unsigned char c : text) count += (c & 0xC0) != 0x80;
  return count;
}

const TopLine* FindLine(const std::vector<TopLine>& lines, const std::string& prefix) {
  for (const TopLine& line : lines)
    if (line.text.rfind(prefix, 0) == 0) return &line;
  return nullptr;
}

TEST(Sparkline, ScalesTheShownValuesFromTheirMinimumToTheirMaximum) {
  EXPECT_EQ(Sparkline({0, 1, 2, 3, 4, 5, 6, 7}, 8), "▁▂▃▄▅▆▇█");
  EXPECT_EQ(Sparkline({3.5, 3.0, 3.25}, 8), "█▁▅");  // half the range: level 3.5 rounds to 4
  EXPECT_EQ(Sparkline({7, 6, 5, 4, 3, 2, 1, 0}, 8, /*unicode=*/false), "#*+=~-._");
}

TEST(Sparkline, KeepsTheNewestValuesAndScalesOnlyThose) {
  // The 100 scrolled out of view does not flatten the rest.
  EXPECT_EQ(Sparkline({100, 2, 1, 2}, 3), "█▁█");
  EXPECT_EQ(Sparkline({}, 5), "");
}

TEST(Sparkline, EqualValuesDrawTheMiddleAndNonFiniteOnesABlank) {
  EXPECT_EQ(Sparkline({2, 2, 2}, 10), "▄▄▄");
  EXPECT_EQ(Sparkline({1, kNaN, 2, INFINITY}, 10), "▁ █ ");
  EXPECT_EQ(Sparkline({kNaN}, 10), " ");
}

TEST(Eta, IsTheRemainingStepsTimesTheMeanOfTheRecentStepTimes) {
  std::vector<TopStep> steps = Steps(1, 100, 9.0);  // old, slow steps scroll out of the mean
  for (TopStep& step : steps)
    if (step.step > 80) step.step_seconds = 0.25;
  ASSERT_EQ(RecentStepSeconds(steps), 0.25);
  EXPECT_DOUBLE_EQ(*EstimateEtaSeconds(steps, 500), 400 * 0.25);
  EXPECT_EQ(EstimateEtaSeconds(steps, 100), 0.0);  // done
  EXPECT_EQ(EstimateEtaSeconds(steps, 90), 0.0);   // a total lowered on resume: nothing left
  EXPECT_FALSE(EstimateEtaSeconds(steps, std::nullopt));
  EXPECT_FALSE(EstimateEtaSeconds({}, 500));
}

TEST(Eta, SkipsStepsWithoutATimeAndIsUnknownWithoutAny) {
  std::vector<TopStep> steps = Steps(1, 4, 2.0);
  steps[3].step_seconds = kNaN;
  steps[2].step_seconds = 0;
  EXPECT_DOUBLE_EQ(*EstimateEtaSeconds(steps, 14), 10 * 2.0);
  for (TopStep& step : steps) step.step_seconds = kNaN;
  EXPECT_FALSE(EstimateEtaSeconds(steps, 14));
}

TEST(Stall, TheThresholdIsThreeRecentStepTimesWithAFloorUnlessGiven) {
  EXPECT_DOUBLE_EQ(StallThresholdSeconds(Steps(1, 30, 4.0), 0), 12.0);
  EXPECT_DOUBLE_EQ(StallThresholdSeconds(Steps(1, 30, 0.01), 0), 5.0);  // the floor
  EXPECT_DOUBLE_EQ(StallThresholdSeconds(Steps(1, 30, 0.01), 0, 0.5), 0.5);
  EXPECT_DOUBLE_EQ(StallThresholdSeconds({}, 0), 5.0);
  EXPECT_DOUBLE_EQ(StallThresholdSeconds(Steps(1, 30, 4.0), 2.5), 2.5);
}

TEST(FormatSeconds, ReadsAsADuration) {
  EXPECT_EQ(FormatSeconds(0.42), "0.4 s");
  EXPECT_EQ(FormatSeconds(-1), "0.0 s");
  EXPECT_EQ(FormatSeconds(42.4), "42 s");
  EXPECT_EQ(FormatSeconds(185), "3m 05s");
  EXPECT_EQ(FormatSeconds(2 * 3600 + 7 * 60 + 30), "2h 07m");
  EXPECT_EQ(FormatSeconds(3 * 86400 + 4 * 3600), "3d 04h");
}

TopSnapshot Running() {
  TopSnapshot s;
  s.run_dir = "/runs/tiny";
  s.run_name = "tiny";
  s.run_dir_exists = s.metrics_exist = true;
  s.steps = Steps(1, 40, 2.0);
  s.total_steps = 100;
  s.checkpoint_step = 30;
  s.checkpoint_path = "ckpt/step-30";
  s.checkpoint_age_seconds = 25;
  s.attempt = 2;
  s.attempt_outcome = "attempt 1: node_failure -> retry";
  s.seconds_since_step = 1;
  return s;
}

TEST(TopFrame, ShowsEveryFieldOfARunningJob) {
  const std::vector<TopLine> frame = ComposeTopFrame(Running(), {});
  std::string all;
  for (const TopLine& line : frame) all += line.text + "\n";
  EXPECT_NE(all.find("crucible top  tiny  /runs/tiny"), std::string::npos) << all;
  EXPECT_NE(all.find("step         40 / 100  (40.0%)"), std::string::npos) << all;
  EXPECT_NE(all.find("loss         0.250000"), std::string::npos) << all;
  EXPECT_NE(all.find("tokens/s     1040.0"), std::string::npos) << all;
  EXPECT_NE(all.find("ETA          2m 00s"), std::string::npos) << all;  // 60 steps x 2 s
  EXPECT_NE(all.find("checkpoint   step 30, 25 s ago  (ckpt/step-30)"), std::string::npos) << all;
  EXPECT_NE(all.find("attempt      2  (attempt 1: node_failure -> retry)"), std::string::npos)
      << all;
  EXPECT_NE(all.find("stalled for  1.0 s"), std::string::npos) << all;
  EXPECT_NE(all.find("state        running"), std::string::npos) << all;
  // The loss falls: the sparkline, 40 cells (it fits), starts high and ends low.
  const std::string& spark = frame[3].text;
  EXPECT_EQ(CodePoints(spark), 13u + 40u) << spark;
  EXPECT_EQ(spark.substr(13, 3), "█");
  EXPECT_EQ(spark.substr(spark.size() - 3), "▁");
  for (const TopLine& line : frame) EXPECT_FALSE(line.alert) << line.text;
}

TEST(TopFrame, NoLineIsWiderThanTheTerminal) {
  TopSnapshot s = Running();
  s.steps = Steps(1, 500, 2.0);
  s.run_dir = "/a/very/long/path/" + std::string(200, 'x');
  for (size_t width : {20u, 33u, 80u, 200u}) {
    TopFrameOptions options;
    options.width = width;
    for (const TopLine& line : ComposeTopFrame(s, options))
      EXPECT_LE(CodePoints(line.text), width) << line.text;
  }
  TopFrameOptions wide;
  wide.width = 200;
  EXPECT_EQ(CodePoints(ComposeTopFrame(s, wide)[3].text), 200u);  // the sparkline fills it
}

TEST(TopFrame, AStallPastThreeStepTimesIsHighlighted) {
  TopSnapshot s = Running();  // 2 s steps: the threshold is 6 s
  s.seconds_since_step = 5.5;
  EXPECT_FALSE(FindLine(ComposeTopFrame(s, {}), "stalled for")->alert);
  s.seconds_since_step = 45;
  const std::vector<TopLine> frame = ComposeTopFrame(s, {});
  const TopLine* stall = FindLine(frame, "stalled for");
  ASSERT_NE(stall, nullptr);
  EXPECT_TRUE(stall->alert);
  EXPECT_NE(stall->text.find("45 s"), std::string::npos) << stall->text;
  EXPECT_NE(stall->text.find("alert above 6.0 s"), std::string::npos) << stall->text;
  EXPECT_EQ(FindLine(frame, "state")->text, "state        STALLED: no step for 45 s");
  TopFrameOptions patient;
  patient.stall_seconds = 60;
  EXPECT_FALSE(FindLine(ComposeTopFrame(s, patient), "stalled for")->alert);
}

TEST(TopFrame, AFinishedJobIsNotStalled) {
  TopSnapshot s = Running();
  s.steps = Steps(1, 100, 2.0);
  s.seconds_since_step = 3600;
  EXPECT_TRUE(LooksFinished(s));
  std::vector<TopLine> frame = ComposeTopFrame(s, {});
  EXPECT_FALSE(FindLine(frame, "stalled for")->alert);
  EXPECT_EQ(FindLine(frame, "state")->text, "state        finished (step 100 of 100)");
  EXPECT_EQ(FindLine(frame, "ETA")->text, "ETA          0.0 s");

  s = Running();
  s.final_weights = true;  // stopped early on purpose (training.steps lowered, a stop signal)
  EXPECT_TRUE(LooksFinished(s));
  s = Running();
  s.launcher_ended = true;
  s.attempt_outcome = "attempt 2: node_failure -> stop";
  frame = ComposeTopFrame(s, {});
  EXPECT_NE(FindLine(frame, "state")->text.find("attempt 2: node_failure -> stop"),
            std::string::npos);
}

TEST(TopFrame, WaitsForTheRunDirectoryAndItsFirstStep) {
  TopSnapshot s;
  s.run_dir = "/runs/later";
  std::vector<TopLine> frame = ComposeTopFrame(s, {});
  ASSERT_EQ(frame.size(), 2u);
  EXPECT_NE(frame[1].text.find("waiting for the run directory /runs/later"), std::string::npos);
  s.run_dir_exists = true;
  frame = ComposeTopFrame(s, {});
  EXPECT_NE(frame[1].text.find("waiting for metrics.jsonl"), std::string::npos) << frame[1].text;
}

TEST(TopFrame, AnUnknownTotalAndNonFiniteLossStillDraw) {
  TopSnapshot s = Running();
  s.total_steps.reset();
  s.config_problem = "config.toml not written yet";
  s.steps.back().loss = kNaN;
  s.attempt.reset();
  s.attempt_outcome.clear();
  const std::vector<TopLine> frame = ComposeTopFrame(s, {});
  EXPECT_EQ(FindLine(frame, "step")->text, "step         40 / ?  (config.toml not written yet)");
  EXPECT_EQ(FindLine(frame, "ETA")->text, "ETA          ?");
  EXPECT_NE(FindLine(frame, "loss")->text.find("non-finite"), std::string::npos);
  EXPECT_EQ(frame[3].text.substr(frame[3].text.size() - 1), " ");  // NaN: a blank cell
  EXPECT_EQ(FindLine(frame, "attempt")->text, "attempt      - (not started by crucible launch)");
}

class RunDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/top_test-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  void Write(const std::string& name, const std::string& text, bool append = false) {
    std::ofstream out(Path(name), append ? std::ios::app : std::ios::trunc);
    out << text;
  }
  static std::string Line(int64_t step, double loss = 2.0) {
    return "{\"step\":" + std::to_string(step) + ",\"loss\":" + std::to_string(loss) +
           ",\"tok_per_s\":100.0,\"step_seconds\":0.5}\n";
  }
  static std::vector<int64_t> StepsOf(const MetricsTail& tail) {
    std::vector<int64_t> steps;
    for (const TopStep& step : tail.steps()) steps.push_back(step.step);
    return steps;
  }

  std::string dir_;
};

TEST_F(RunDirectoryTest, AHalfWrittenLastLineIsReadOnceItsNewlineArrives) {
  MetricsTail tail(Path("metrics.jsonl"));
  EXPECT_FALSE(tail.Poll());
  EXPECT_FALSE(tail.exists());
  Write("metrics.jsonl", Line(1) + Line(2) + "{\"step\":3,\"lo");
  ASSERT_TRUE(tail.Poll());
  EXPECT_EQ(StepsOf(tail), (std::vector<int64_t>{1, 2}));
  Write("metrics.jsonl", "ss\":1.5,\"tok_per_s\":7,\"step_seconds\":0.25}", true);
  tail.Poll();
  EXPECT_EQ(StepsOf(tail), (std::vector<int64_t>{1, 2}));  // still no newline
  Write("metrics.jsonl", "\n" + Line(4), true);
  tail.Poll();
  ASSERT_EQ(StepsOf(tail), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(tail.steps()[2].loss, 1.5);
  EXPECT_EQ(tail.steps()[2].tokens_per_second, 7);
  EXPECT_EQ(tail.steps()[2].step_seconds, 0.25);
  EXPECT_EQ(tail.restarts(), 0);
}

TEST_F(RunDirectoryTest, AFileTruncatedOnResumeIsReadAgainFromTheStart) {
  MetricsTail tail(Path("metrics.jsonl"));
  Write("metrics.jsonl", Line(1) + Line(2) + Line(3) + Line(4) + Line(5));
  tail.Poll();
  ASSERT_EQ(StepsOf(tail).size(), 5u);
  // The resumed trainer keeps the steps up to its checkpoint (3), in place, and goes on.
  ASSERT_EQ(::truncate(Path("metrics.jsonl").c_str(), off_t(3 * Line(1).size())), 0);
  Write("metrics.jsonl", Line(4, 1.0), true);
  tail.Poll();
  EXPECT_EQ(StepsOf(tail), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(tail.steps().back().loss, 1.0);
  EXPECT_EQ(tail.restarts(), 1);
}

TEST_F(RunDirectoryTest, AFileReplacedByRenameIsReadAgainEvenWhenItDidNotShrink) {
  MetricsTail tail(Path("metrics.jsonl"));
  Write("metrics.jsonl", Line(1) + Line(2) + Line(3));
  tail.Poll();
  // What TruncateMetrics does (an atomic rewrite), then more steps than before.
  Write("new.jsonl", Line(1) + Line(2, 9.0) + Line(3, 9.0) + Line(4, 9.0) + Line(5, 9.0));
  ASSERT_EQ(std::rename(Path("new.jsonl").c_str(), Path("metrics.jsonl").c_str()), 0);
  tail.Poll();
  EXPECT_EQ(StepsOf(tail), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(tail.steps()[1].loss, 9.0);
  EXPECT_EQ(tail.restarts(), 1);
}

TEST_F(RunDirectoryTest, AStepThatGoesBackDropsTheStepsAfterIt) {
  MetricsTail tail(Path("metrics.jsonl"));
  Write("metrics.jsonl", Line(1) + Line(2) + Line(3) + "garbage cut by a kill\n" + Line(2, 5.0));
  tail.Poll();
  EXPECT_EQ(StepsOf(tail), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(tail.steps().back().loss, 5.0);
}

TEST_F(RunDirectoryTest, ALargeFileIsReadFromNearItsEndAndKeepsOnlyTheNewestSteps) {
  std::string text;
  for (int64_t step = 1; step <= 1000; ++step) text += Line(step);
  Write("metrics.jsonl", text);
  MetricsTail tail(Path("metrics.jsonl"), /*keep=*/50,
                   /*first_read_bytes=*/100 * Line(1).size() + 7);
  tail.Poll();
  const std::vector<int64_t> steps = StepsOf(tail);
  ASSERT_EQ(steps.size(), 50u);
  EXPECT_EQ(steps.front(), 951);
  EXPECT_EQ(steps.back(), 1000);
  Write("metrics.jsonl", Line(1001), true);
  tail.Poll();
  EXPECT_EQ(StepsOf(tail).back(), 1001);
  EXPECT_EQ(StepsOf(tail).size(), 50u);
}

TEST_F(RunDirectoryTest, TheWatcherReadsTheConfigCheckpointAndLauncherAttempt) {
  Config config = Config::Defaults();
  config.Set("job.name", std::string("tiny"));
  config.Set("training.steps", int64_t{10});
  Write("config.toml", config.ToToml());
  Write("metrics.jsonl", Line(1, 3.0) + Line(2, 2.0));
  MakeDirectories(Path("ckpt/step-2"));
  Write("ckpt/step-2/COMPLETE", "step=2\n");
  MakeDirectories(Path("ckpt/step-3"));  // a save that never finished and is not `latest`
  Write("ckpt/latest", "step-2\n");
  MakeDirectories(Path("launch"));
  Write("launch/attempt-1.log", "step=1\n");
  Write("launch/attempts.jsonl",
        "{\"kind\":\"preflight\",\"attempt\":1}\n"
        "{\"kind\":\"attempt\",\"attempt\":1,\"verdict\":\"node_failure\",\"action\":\"retry\"}\n");
  Write("launch/attempt-2.log", "step=2\n");

  TopWatcher watcher(dir_);
  TopSnapshot s = watcher.Poll(WallSeconds() + 30);
  EXPECT_TRUE(s.run_dir_exists);
  EXPECT_TRUE(s.metrics_exist);
  EXPECT_EQ(s.run_name, "tiny");
  EXPECT_EQ(s.total_steps, 10);
  ASSERT_EQ(s.steps.size(), 2u);
  EXPECT_EQ(s.checkpoint_step, 2);
  EXPECT_EQ(s.checkpoint_path, "ckpt/step-2");
  ASSERT_TRUE(s.checkpoint_age_seconds);
  EXPECT_NEAR(*s.checkpoint_age_seconds, 30, 5);
  EXPECT_EQ(s.attempt, 2);
  EXPECT_EQ(s.attempt_outcome, "attempt 1: node_failure -> retry");
  EXPECT_FALSE(s.launcher_ended);
  ASSERT_TRUE(s.seconds_since_step);
  EXPECT_NEAR(*s.seconds_since_step, 30, 5);
  EXPECT_FALSE(LooksFinished(s));

  // Without `latest`, the newest complete step folder; the attempt record ends the launch.
  std::remove(Path("ckpt/latest").c_str());
  Write("launch/attempts.jsonl",
        "{\"kind\":\"attempt\",\"attempt\":2,\"verdict\":\"success\",\"action\":\"done\"}\n", true);
  Write("metrics.jsonl", Line(3, 1.0), true);
  s = watcher.Poll(WallSeconds());
  EXPECT_EQ(s.checkpoint_step, 2);
  EXPECT_EQ(s.steps.back().step, 3);
  EXPECT_TRUE(s.launcher_ended);
  EXPECT_TRUE(LooksFinished(s));
}

TEST_F(RunDirectoryTest, AMissingRunOrMetricsFileIsReportedNotThrown) {
  TopWatcher missing(Path("nope"));
  EXPECT_FALSE(missing.Poll(WallSeconds()).run_dir_exists);
  TopWatcher empty(dir_);
  const TopSnapshot s = empty.Poll(WallSeconds());
  EXPECT_TRUE(s.run_dir_exists);
  EXPECT_FALSE(s.metrics_exist);
  EXPECT_FALSE(s.total_steps);
  EXPECT_FALSE(s.attempt);
}

}  // namespace
}  // namespace crucible
