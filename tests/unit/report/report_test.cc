// crucible report's data extraction on small synthetic run directories: the series each source
// gives, what a missing source leaves, bad input, and the chart specs and page built from them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "report/html.h"
#include "report/run_data.h"

namespace crucible {
namespace {

namespace fs = std::filesystem;

class ReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("report_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string Write(const std::string& relative, const std::string& text) {
    const fs::path path = root_ / relative;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
    return path.string();
  }
  std::string Dir(const std::string& relative) const { return (root_ / relative).string(); }

  fs::path root_;
};

const char kMetrics[] =
    R"({"step":1,"loss":5.5,"lr":1e-4,"grad_norm":2.0,"grad_norm_clipped":1.0,"tok_per_s":100,"mfu":1.5})"
    "\n"
    R"({"step":2,"loss":5.0,"lr":2e-4,"grad_norm":null,"grad_norm_clipped":null,"tok_per_s":110,"mfu":null})"
    "\n"
    R"({"step":3,"loss":4.5,"lr":3e-4,"grad_norm":1.5,"grad_norm_clipped":1.0,"tok_per_s":120,"mfu":1.7})"
    "\n";

TEST_F(ReportTest, MetricsBecomeOneSeriesPerFieldWithNullsAsGaps) {
  Write("run/metrics.jsonl", kMetrics);
  RunData run = LoadRun(Dir("run"));
  EXPECT_EQ(run.name, "run");
  EXPECT_EQ(run.metrics_lines, 3);
  EXPECT_EQ(run.loss.x, (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(run.loss.y, (std::vector<double>{5.5, 5.0, 4.5}));
  EXPECT_DOUBLE_EQ(run.lr.y[2], 3e-4);
  ASSERT_EQ(run.grad_norm.size(), 3u);  // the null stays a point, drawn as a gap
  EXPECT_TRUE(std::isnan(run.grad_norm.y[1]));
  EXPECT_DOUBLE_EQ(run.grad_norm_clipped.y[2], 1.0);
  EXPECT_EQ(run.tokens_per_second.y, (std::vector<double>{100, 110, 120}));
  EXPECT_TRUE(run.mfu.HasValues());
  // Nothing else was there.
  EXPECT_FALSE(run.held_out_loss.HasValues());
  EXPECT_TRUE(run.evals.empty());
  EXPECT_TRUE(run.attempts.empty());
  EXPECT_TRUE(run.memory.empty());
  EXPECT_EQ(run.checkpoint_source, "");
}

TEST_F(ReportTest, AnUnfinishedLastLineIsLeftOutButABadLineIsAnError) {
  Write("live/metrics.jsonl", std::string(kMetrics) + R"({"step":4,"loss":4.)");
  EXPECT_EQ(LoadRun(Dir("live")).metrics_lines, 3);

  Write("bad/metrics.jsonl", std::string(R"({"step":1,"loss":5.5})") + "\nnot json\n");
  try {
    LoadRun(Dir("bad"));
    FAIL() << "a malformed line was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitBadData);
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl:2:"), std::string::npos) << e.what();
  }
  Write("nostep/metrics.jsonl", R"({"loss":5.5})"
                                "\n");
  EXPECT_THROW(LoadRun(Dir("nostep")), Error);
  Write("badtype/metrics.jsonl", R"({"step":1,"loss":"high"})"
                                 "\n");
  try {
    LoadRun(Dir("badtype"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl:1: 'loss' should be a number"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(ReportTest, AFolderWithoutRunFilesOrAMissingOneIsAUsageError) {
  fs::create_directories(root_ / "empty");
  for (const std::string& dir : {Dir("empty"), Dir("missing"), Write("file", "x")}) {
    try {
      LoadRun(dir);
      FAIL() << dir;
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), kExitUsage);
      EXPECT_NE(std::string(e.what()).find(dir + ": not a run directory"), std::string::npos)
          << e.what();
    }
  }
}

TEST_F(ReportTest, ValidationAndEvalFilesGiveHeldOutLossAndScoresWithStandardErrors) {
  Write(
      "run/eval/validation.jsonl",
      R"({"step":10,"held_out":{"name":"h","loss":4.0,"bits_per_byte":2.0,"tokens":50},)"
      R"("tasks":{"arc":{"items":20,"acc":0.3,"acc_stderr":0.1,"acc_norm":0.35,"acc_norm_stderr":0.1,"chance":0.25}}})"
      "\n"
      R"({"step":20,"held_out":{"name":"h","loss":3.5,"bits_per_byte":1.8,"tokens":50},)"
      R"("tasks":{"arc":{"items":20,"acc":0.4,"acc_stderr":0.11,"acc_norm":0.45,"acc_norm_stderr":0.11,"chance":0.25}}})"
      "\n");
  Write("run/eval/final.json",
        R"({"model":"m","tasks":{"arc":{"items":40,"acc":0.5,"acc_stderr":0.08,"acc_norm":0.55,)"
        R"("acc_norm_stderr":0.08,"chance":0.25},"hella":{"items":40,"acc":0.3,"acc_stderr":0.07,)"
        R"("acc_norm":0.3,"acc_norm_stderr":0.07,"chance":0.25}},"perplexity":{}})");
  Write("run/eval/other.json", R"({"something":"else"})");
  RunData run = LoadRun(Dir("run"));
  EXPECT_EQ(run.metrics_lines, 0);
  EXPECT_EQ(run.held_out_loss.x, (std::vector<double>{10, 20}));
  EXPECT_EQ(run.held_out_loss.y, (std::vector<double>{4.0, 3.5}));
  ASSERT_EQ(run.validation_accuracy.count("arc"), 1u);
  EXPECT_EQ(run.validation_accuracy["arc"].y, (std::vector<double>{0.3, 0.4}));
  EXPECT_EQ(run.validation_accuracy["arc"].error, (std::vector<double>{0.1, 0.11}));
  ASSERT_EQ(run.evals.size(), 2u);  // the eval --json file first, then the last validation
  EXPECT_EQ(run.evals[0].source, "eval/final.json");
  ASSERT_EQ(run.evals[0].scores.size(), 2u);
  EXPECT_EQ(run.evals[0].scores[1].task, "hella");
  EXPECT_DOUBLE_EQ(run.evals[0].scores[1].acc_stderr, 0.07);
  EXPECT_EQ(run.evals[1].source, "validation step 20");
  EXPECT_DOUBLE_EQ(run.evals[1].scores[0].acc, 0.4);
  ASSERT_EQ(run.notes.size(), 1u);
  EXPECT_NE(run.notes[0].find("eval/other.json"), std::string::npos);

  Write("broken/eval/final.json", "{\"tasks\":");
  EXPECT_THROW(LoadRun(Dir("broken")), Error);
}

const char kAttempts[] =
    R"({"kind":"preflight","attempt":1,"time":"2024-05-01T10:00:00","nodes":["a"],"seconds":0.5,"failed":{}})"
    "\n"
    R"({"kind":"attempt","attempt":1,"started":"2024-05-01T10:00:00","wall_s":5.5,"nodes":["a","b"],)"
    R"("exit_code":137,"verdict":"node_failure","action":"swap","detail":"b->c","evidence":"killed",)"
    R"("blamed_node":"b","first_step":1,"last_step":7,"backoff_seconds":1.0})"
    "\n"
    R"({"kind":"attempt","attempt":2,"started":"2024-05-01T10:00:08","wall_s":4.0,"nodes":["a","c"],)"
    R"("exit_code":0,"verdict":"success","action":"done","detail":"","evidence":"",)"
    R"("blamed_node":"","first_step":6,"last_step":12,"backoff_seconds":0})"
    "\n";

TEST_F(ReportTest, AttemptsArePlacedOnATimeLineWithTheDowntimeBetweenThem) {
  Write("run/launch/attempts.jsonl", kAttempts);
  RunData run = LoadRun(Dir("run"));
  ASSERT_EQ(run.attempts.size(), 2u);  // the preflight record is not an attempt
  const LaunchAttempt &first = run.attempts[0], &second = run.attempts[1];
  EXPECT_EQ(first.attempt, 1);
  EXPECT_DOUBLE_EQ(first.start_seconds, 0);
  EXPECT_DOUBLE_EQ(first.wall_seconds, 5.5);
  EXPECT_EQ(first.verdict, "node_failure");
  EXPECT_EQ(first.detail, "b->c");
  EXPECT_EQ(first.nodes, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(first.last_step, 7);
  EXPECT_DOUBLE_EQ(second.start_seconds, 8);
  EXPECT_DOUBLE_EQ(second.downtime_before, 2.5);
  EXPECT_EQ(second.exit_code, 0);
  EXPECT_DOUBLE_EQ(ParseLaunchTime("1970-01-01T00:01:40"), 100);
  EXPECT_TRUE(std::isnan(ParseLaunchTime("yesterday")));
}

TEST_F(ReportTest, MemoryAndStallsComeFromTheAttemptLogsUnlessCheckpointsJsonlExists) {
  Write("run/launch/attempts.jsonl", kAttempts);
  Write("run/launch/attempt-1.log",
        "0: phase=memory_check host=h ranks_on_host=2 asked_bytes=2097152 "
        "available_bytes=8388608 available_source=\"MemAvailable of /proc/meminfo\" "
        "activations_bytes=1048576 batch_bytes=1024 model_state_bytes=524288 "
        "checkpoint_bytes=0\n"
        "0: phase=checkpoint step=5 mode=async reason=interval stall_s=0.0100 copy_s=0.01 "
        "wait_s=0.0000 state_bytes=100\n"
        "0: step=6 loss=4.0\n");
  Write("run/launch/attempt-2.log",
        "0: phase=checkpoint step=10 mode=sync reason=final stall_s=0.2500 copy_s=0.01 "
        "wait_s=0.0000 state_bytes=100\n"
        "0: phase=checkpoint step=10 status=complete path=x bytes=1 write_s=0.2\n"
        "0: phase=memory_peak rss_bytes_per_rank=3145728,4194304\n");
  RunData run = LoadRun(Dir("run"));
  EXPECT_EQ(run.checkpoint_source, "launch/attempt-<k>.log");
  EXPECT_EQ(run.checkpoint_stall.x, (std::vector<double>{5, 10}));
  EXPECT_EQ(run.checkpoint_stall.y, (std::vector<double>{0.01, 0.25}));
  EXPECT_EQ(run.memory_source, "launch/attempt-2.log");
  ASSERT_EQ(run.memory.size(), 7u);
  EXPECT_EQ(run.memory[0], (std::pair<std::string, double>{"activations (plan)", 1048576}));
  EXPECT_EQ(run.memory[4], (std::pair<std::string, double>{"asked on host (plan)", 2097152}));
  EXPECT_EQ(run.memory[6], (std::pair<std::string, double>{"peak RSS (largest rank)", 4194304}));

  Write("run/checkpoints.jsonl", R"({"step":5,"mode":"async","reason":"interval","stall_s":0.02})"
                                 "\n");
  run = LoadRun(Dir("run"));
  EXPECT_EQ(run.checkpoint_source, "checkpoints.jsonl");
  EXPECT_EQ(run.checkpoint_stall.y, (std::vector<double>{0.02}));
}

TEST_F(ReportTest, ChartSpecsOverlayRunsAndSayWhatIsMissing) {
  Write("a/metrics.jsonl", kMetrics);
  Write("a/launch/attempts.jsonl", kAttempts);
  Write("b/metrics.jsonl", std::string(kMetrics) + R"({"step":4,"loss":4.0,"lr":4e-4})"
                                                   "\n");
  Write("b/eval/final.json",
        R"({"tasks":{"arc":{"items":40,"acc":0.5,"acc_stderr":0.08,"acc_norm":0.5,)"
        R"("acc_norm_stderr":0.08,"chance":0.25}}})");
  const std::vector<RunData> runs = {LoadRun(Dir("a")), LoadRun(Dir("b"))};
  const nlohmann::json specs = ChartSpecs(runs);
  auto chart = [&](const std::string& id) {
    for (const auto& spec : specs)
      if (spec["id"] == id) return spec;
    ADD_FAILURE() << "no chart " << id;
    return nlohmann::json();
  };
  const auto loss = chart("loss");
  EXPECT_EQ(loss["empty"], "");
  ASSERT_EQ(loss["datasets"].size(), 2u);
  EXPECT_EQ(loss["datasets"][0]["label"], "a train");
  EXPECT_EQ(loss["datasets"][0]["points"].size(), 3u);
  EXPECT_EQ(loss["datasets"][1]["points"].size(), 4u);
  EXPECT_NE(loss["datasets"][0]["color"], loss["datasets"][1]["color"]);
  EXPECT_TRUE(chart("grad_norm")["datasets"][0]["points"][1][1].is_null());
  const auto eval = chart("eval_accuracy");
  ASSERT_EQ(eval["datasets"].size(), 1u);
  EXPECT_EQ(eval["categories"], nlohmann::json({"arc"}));
  EXPECT_EQ(eval["datasets"][0]["errors"], nlohmann::json({0.08}));
  const auto timeline = chart("launch_timeline");
  ASSERT_EQ(timeline["datasets"].size(), 2u);  // a's attempts and its downtime
  EXPECT_EQ(timeline["datasets"][0]["bars"], nlohmann::json({{0.0, 5.5}, {8.0, 12.0}}));
  EXPECT_EQ(timeline["datasets"][1]["bars"], nlohmann::json({{5.5, 8.0}}));
  for (const char* missing : {"memory", "checkpoint_stall", "validation_accuracy"}) {
    EXPECT_TRUE(chart(missing)["datasets"].empty()) << missing;
    EXPECT_EQ(chart(missing)["empty"].get<std::string>().rfind("no data: ", 0), 0u) << missing;
  }
}

// Two steps of a `crucible grpo` run's metrics.jsonl (rl/grpo_trainer.cc): the usual fields and
// the GRPO ones; a command reward writes no accuracy (step 2 here has none).
const char kGrpoMetrics[] =
    R"({"step":1,"loss":0.5,"lr":1e-5,"grad_norm":0.3,"tok_per_s":50,"rollout_step":1,)"
    R"("reward_mean":0.25,"reward_std":0.4,"accuracy":0.125,"format_rate":0.5,)"
    R"("completion_length":31.5,"truncated_rate":0.0625,"grpo_loss":-0.01,"kl":0.0,)"
    R"("entropy":1.75,"mean_ratio":1.0,"generation_s":2.5,"reward_s":0.01,"score_s":0.5,)"
    R"("train_s":1.25})"
    "\n"
    R"({"step":2,"loss":0.4,"lr":2e-5,"grad_norm":0.2,"tok_per_s":55,"rollout_step":2,)"
    R"("reward_mean":0.5,"reward_std":0.45,"completion_length":28.0,"truncated_rate":0.0,)"
    R"("grpo_loss":-0.02,"kl":0.003,"entropy":1.5,"mean_ratio":1.0,"generation_s":2.0,)"
    R"("reward_s":0.02,"score_s":0.25,"train_s":1.5})"
    "\n";

TEST_F(ReportTest, AGrpoRunGetsRewardKlLengthAndStepTimeChartsAndAPreTrainingRunNone) {
  Write("grpo/metrics.jsonl", kGrpoMetrics);
  Write("pre/metrics.jsonl", kMetrics);
  const RunData grpo = LoadRun(Dir("grpo")), pre = LoadRun(Dir("pre"));
  EXPECT_TRUE(grpo.grpo);
  EXPECT_EQ(grpo.grpo_metrics.reward_mean.x, (std::vector<double>{1, 2}));
  EXPECT_EQ(grpo.grpo_metrics.reward_mean.y, (std::vector<double>{0.25, 0.5}));
  EXPECT_DOUBLE_EQ(grpo.grpo_metrics.accuracy.y[0], 0.125);
  EXPECT_TRUE(std::isnan(grpo.grpo_metrics.accuracy.y[1]));
  EXPECT_FALSE(pre.grpo);
  EXPECT_EQ(pre.grpo_metrics.reward_mean.size(), 0u);

  auto find = [](const nlohmann::json& specs, const std::string& id) {
    for (const auto& spec : specs)
      if (spec["id"] == id) return spec;
    return nlohmann::json();
  };
  auto values = [](const nlohmann::json& dataset) {
    std::vector<nlohmann::json> y;
    for (const auto& point : dataset["points"]) y.push_back(point[1]);
    return nlohmann::json(y);
  };
  // A pre-training report has no GRPO chart, and its charts are as before.
  const nlohmann::json pre_specs = ChartSpecs({pre});
  for (const auto& spec : pre_specs)
    EXPECT_NE(spec["id"].get<std::string>().rfind("grpo", 0), 0u) << spec["id"];
  EXPECT_EQ(pre_specs.size(), 11u);
  EXPECT_EQ(pre_specs[0]["id"], "loss");

  // The GRPO charts come first; the pre-training run overlaid with the GRPO run adds no line.
  const nlohmann::json specs = ChartSpecs({grpo, pre});
  ASSERT_EQ(specs.size(), 15u);
  EXPECT_EQ(specs[0]["id"], "grpo_reward");
  EXPECT_EQ(specs[4]["id"], "loss");

  const auto reward = find(specs, "grpo_reward");
  EXPECT_EQ(reward["empty"], "");
  ASSERT_EQ(reward["datasets"].size(), 2u);
  EXPECT_EQ(reward["datasets"][0]["label"], "grpo reward_mean");
  EXPECT_EQ(values(reward["datasets"][0]), nlohmann::json({0.25, 0.5}));
  EXPECT_EQ(reward["datasets"][1]["label"], "grpo accuracy");
  EXPECT_EQ(values(reward["datasets"][1]), nlohmann::json({0.125, nullptr}));
  EXPECT_EQ(reward["datasets"][1]["dash"], true);
  EXPECT_FALSE(reward.contains("y2_title"));

  const auto kl = find(specs, "grpo_kl_entropy");
  ASSERT_EQ(kl["datasets"].size(), 2u);
  EXPECT_EQ(kl["datasets"][0]["label"], "grpo kl");
  EXPECT_EQ(values(kl["datasets"][0]), nlohmann::json({0.0, 0.003}));
  EXPECT_FALSE(kl["datasets"][0].contains("axis"));
  EXPECT_EQ(kl["datasets"][1]["label"], "grpo entropy");
  EXPECT_EQ(values(kl["datasets"][1]), nlohmann::json({1.75, 1.5}));
  EXPECT_EQ(kl["datasets"][1]["axis"], "y2");
  EXPECT_TRUE(kl.contains("y2_title"));

  const auto length = find(specs, "grpo_completion_length");
  ASSERT_EQ(length["datasets"].size(), 2u);
  EXPECT_EQ(values(length["datasets"][0]), nlohmann::json({31.5, 28.0}));
  EXPECT_EQ(length["datasets"][1]["label"], "grpo truncated_rate");
  EXPECT_EQ(values(length["datasets"][1]), nlohmann::json({0.0625, 0.0}));
  EXPECT_EQ(length["datasets"][1]["axis"], "y2");
  EXPECT_EQ(length["y2_max"], 1);

  const auto time = find(specs, "grpo_step_time");
  EXPECT_EQ(time["stacked"], true);
  ASSERT_EQ(time["datasets"].size(), 4u);  // one stack: the GRPO run's four parts, in order
  const char* const parts[] = {"generation_s", "reward_s", "score_s", "train_s"};
  const double seconds[4][2] = {{2.5, 2.0}, {0.01, 0.02}, {0.5, 0.25}, {1.25, 1.5}};
  for (size_t k = 0; k < 4; ++k) {
    const auto& dataset = time["datasets"][k];
    EXPECT_EQ(dataset["label"], std::string("grpo ") + parts[k]);
    EXPECT_EQ(values(dataset), nlohmann::json({seconds[k][0], seconds[k][1]})) << parts[k];
    EXPECT_EQ(dataset["stack"], "grpo");
    EXPECT_EQ(dataset["color"], RunColor(0));
  }
  EXPECT_NE(time["datasets"][0]["fill_color"], time["datasets"][3]["fill_color"]);
}

TEST_F(ReportTest, ThePageInlinesTheLibraryAndEscapesRunText) {
  Write("run</script><b>/metrics.jsonl", kMetrics);
  const std::vector<RunData> runs = {LoadRun(Dir("run</script><b>"))};
  const std::string html = RenderReport(runs, "T & <T>", "/*chart*/ var s = '</script>';");
  EXPECT_NE(html.find("<title>T &amp; &lt;T&gt;</title>"), std::string::npos);
  EXPECT_NE(html.find("/*chart*/ var s = '<\\/script>';"), std::string::npos);
  EXPECT_EQ(html.find("run</script>"), std::string::npos);
  EXPECT_NE(html.find("run&lt;/script&gt;&lt;b&gt;"), std::string::npos);
  EXPECT_NE(html.find("id=\"report-data\""), std::string::npos);
  EXPECT_EQ(html.find("src=\"http"), std::string::npos);
  EXPECT_EQ(html.find("href=\"http"), std::string::npos);
}

}  // namespace
}  // namespace crucible
