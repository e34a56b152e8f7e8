// [[data.stages]] in the config (common/config.h's table lists) and as data/stages.h reads it:
// the round trip through the resolved config, and each bad input refused in one line naming the
// stage, where it was given and what to do.
#include "data/stages.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "common/files.h"
#include "data_test_util.h"

namespace crucible {
namespace {

using testing::ScratchDir;

class StagesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    AtomicWriteFile(dir_ / "one.txt", "1 a\n");
    AtomicWriteFile(dir_ / "two.txt", "1 b\n");
  }
  // A config of two stages; `second` is the second table's extra lines.
  Config TwoStages(const std::string& second, const std::string& first = "steps = 10\n") const {
    return Config::Parse(
        "[training]\ndataset = \"blend\"\n\n[[data.stages]]\nname = \"pre\"\nlist = \"" +
            (dir_ / "one.txt") + "\"\n" + first + "\n[[data.stages]]\nlist = \"" +
            (dir_ / "two.txt") + "\"\n" + second,
        "run.toml");
  }
  // The one-line message a config's stages are refused with (exit 2), or "".
  std::string Refusal(const Config& config, int64_t global_batch = 4, int64_t seq_len = 8) const {
    try {
      ResolvedDataStages(config, BatchSchedule(global_batch), seq_len);
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), kExitUsage) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
      return e.what();
    }
    return "";
  }
  ScratchDir dir_;
};

TEST_F(StagesTest, ReadsTheTablesInOrderAndPlacesThemOnTheSteps) {
  const Config config =
      TwoStages("tokens = 320\nlr_policy = \"gentle\"\npeak_fraction = 0.3\nanneal_steps = 4\n");
  const std::vector<DataStage> stages = ResolvedDataStages(config, BatchSchedule(4), 8);
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_EQ(stages[0].name, "pre");
  EXPECT_EQ(stages[0].first_step, 1);
  EXPECT_EQ(stages[0].last_step(), 10);
  EXPECT_EQ(stages[0].lr_policy, LrPolicy::kContinue);
  EXPECT_EQ(stages[1].name, "stage2");
  EXPECT_EQ(stages[1].steps, 10);  // 320 tokens / (4 samples x 8 tokens a step)
  EXPECT_EQ(stages[1].first_step, 11);
  EXPECT_EQ(stages[1].lr_policy, LrPolicy::kGentle);
  EXPECT_DOUBLE_EQ(stages[1].peak_fraction, 0.3);
  EXPECT_EQ(stages[1].anneal_steps, 4);
  EXPECT_NE(stages[1].where.find("run.toml:9: [[data.stages]] #2 (\"stage2\")"), std::string::npos)
      << stages[1].where;
  EXPECT_EQ(TotalStageSteps(stages), 20);
  EXPECT_EQ(StageOfStep(stages, 10), 0);
  EXPECT_EQ(StageOfStep(stages, 11), 1);
  EXPECT_EQ(StageOfStep(stages, 21), -1);
}

TEST_F(StagesTest, TokensFollowABatchRamp) {
  // Steps 1-2 read 4 samples, from step 3 on 8: 6 steps of the second stage (from step 11) are
  // 48 samples.
  const Config config = TwoStages("tokens = 384\n", "steps = 10\n");
  const std::vector<DataStage> stages =
      ResolvedDataStages(config, BatchSchedule({{1, 4}, {3, 8}}), 1);
  EXPECT_EQ(stages[1].steps, 48);
}

TEST_F(StagesTest, TheResolvedConfigWritesTheTablesBackAndReadsThemAlike) {
  const Config config =
      TwoStages("steps = 5\nlr_policy = \"rewarm\"\nwarmup_steps = 2\nanneal_steps = 1\n");
  const Config again = Config::Parse(config.ToToml(), "config.toml");
  EXPECT_TRUE(again.Diff(config).empty());
  EXPECT_EQ(again.StringList("data.stages"), config.StringList("data.stages"));
  EXPECT_NE(config.ToToml().find("[data]\nstages = [{ list = "), std::string::npos)
      << config.ToToml();
  // An override replaces the list, and names itself as where each table came from.
  Config overridden = config;
  overridden.ApplyOverride("data.stages=[{list=\"" + (dir_ / "two.txt") + "\", steps=3}]");
  const std::vector<DataStage> stages = ReadDataStages(overridden);
  ASSERT_EQ(stages.size(), 1u);
  EXPECT_EQ(stages[0].steps, 3);
  EXPECT_EQ(stages[0].where.rfind("--set data.stages=", 0), 0u) << stages[0].where;
}

// (Arrays of strings are allowed: eval_text takes a list of files; arrays of such tables too:
// blends.)
TEST_F(StagesTest, AStageTableMayHoldOnlyStringsNumbersAndArraysOfStringsOrTables) {
  EXPECT_NO_THROW(
      Config::Parse("[[data.stages]]\neval_text = [\"a\", \"b\"]\nsteps = 1\n", "run.toml"));
  EXPECT_NO_THROW(Config::Parse(
      "[[data.stages]]\nblends = [{ list = \"a\", weight = 1 }]\nsteps = 1\n", "run.toml"));
  try {
    Config::Parse("[[data.stages]]\nlist = [1]\nsteps = 1\n", "run.toml");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    EXPECT_NE(std::string(e.what()).find("data.stages"), std::string::npos) << e.what();
  }
}

TEST_F(StagesTest, BadStagesAreRefusedInOneLineNamingTheStage) {
  struct Case {
    std::string second, expected;
  };
  const std::vector<Case> cases = {
      {"steps = 5\ntokens = 64\n", "#2 (\"stage2\"): both steps and tokens are given"},
      {"lr_policy = \"rewarm\"\n", "#2 (\"stage2\"): no length: give steps = N or tokens = N"},
      {"steps = 5\nlr_policy = \"warm\"\n",
       "lr_policy = \"warm\" is not a policy: choose continue, rewarm or gentle"},
      {"steps = 5\nanneal_steps = 6\n",
       "#2 (\"stage2\"): anneal_steps = 6 is longer than the stage (5 steps)"},
      {"steps = 5\nlr_policy = \"gentle\"\n", "lr_policy = \"gentle\" needs peak_fraction"},
      {"steps = 5\nlr_policy = \"gentle\"\npeak_fraction = 1.5\n",
       "peak_fraction = 1.5 is out of range: expected a number in (0, 1]"},
      {"steps = 5\npeak_fraction = 0.5\n", "peak_fraction is given but lr_policy = \"continue\""},
      {"steps = 5\nwarmup_steps = 2\n", "warmup_steps is given but lr_policy = \"continue\""},
      {"stpes = 5\n", "unknown key 'stpes' (did you mean 'steps'?)"},
      {"steps = 0\n", "steps = 0 is out of range: expected an integer >= 1"},
      {"steps = \"5\"\n", "steps: expected an integer"},
      {"steps = 5\nname = \"pre\"\n", "name \"pre\" is taken by an earlier stage"},
      {"steps = 5\nname = \"a b\"\n", "a stage name is letters, digits"},
      {"tokens = 100\n", "tokens = 100 is not a whole number of samples of training.seq_len = 8"},
      {"tokens = 48\n",
       "tokens = 48 is not a whole number of steps: from step 11, 1 steps read 32 tokens and 2 "
       "read 64 (global batch x training.seq_len = 4 x 8 tokens a step); give tokens = 32 or 64"},
  };
  for (const Case& c : cases) {
    const std::string message = Refusal(TwoStages(c.second));
    EXPECT_NE(message.find(c.expected), std::string::npos) << "stage:\n"
                                                           << c.second << "message: " << message;
  }
}

TEST_F(StagesTest, AStageWithoutAListIsRefused) {
  const std::string message = Refusal(Config::Parse("[[data.stages]]\nsteps = 3\n", "run.toml"));
  EXPECT_NE(message.find("run.toml:1: [[data.stages]] #1 (\"stage1\"): no list: name the stage's "
                         "blend file list"),
            std::string::npos)
      << message;
}

TEST_F(StagesTest, AListThatCannotBeReadIsNamed) {
  const Config config = Config::Parse(
      "[[data.stages]]\nlist = \"" + (dir_ / "missing.txt") + "\"\nsteps = 3\n", "run.toml");
  const std::string message = Refusal(config);
  EXPECT_NE(message.find("run.toml:1: [[data.stages]] #1 (\"stage1\"): list = \"" +
                         (dir_ / "missing.txt") + "\": cannot read the file list: no such file"),
            std::string::npos)
      << message;
  const Config folder =
      Config::Parse("[[data.stages]]\nlist = \"" + dir_.path() + "\"\nsteps = 3\n", "run.toml");
  EXPECT_NE(Refusal(folder).find("is a directory"), std::string::npos) << Refusal(folder);
}

TEST_F(StagesTest, ABlendOfBlendsIsReadWithItsWeightsAndRoundTripsThroughTheResolvedConfig) {
  // Inline, and as [[data.stages.blends]] tables: the same stage.
  const std::string inline_blends =
      "[[data.stages]]\nname = \"mix\"\nsteps = 4\nblends = [{ list = \"" + (dir_ / "one.txt") +
      "\", weight = 0.7 }, { list = \"" + (dir_ / "two.txt") + "\", weight = 3 }]\n";
  const std::string table_blends =
      "[[data.stages]]\nname = \"mix\"\nsteps = 4\n"
      "[[data.stages.blends]]\nlist = \"" +
      (dir_ / "one.txt") + "\"\nweight = 0.7\n[[data.stages.blends]]\nlist = \"" +
      (dir_ / "two.txt") + "\"\nweight = 3\n";
  for (const std::string& text : {inline_blends, table_blends}) {
    const Config config = Config::Parse(text, "run.toml");
    const std::vector<DataStage> stages = ReadDataStages(config);
    ASSERT_EQ(stages.size(), 1u);
    ASSERT_EQ(stages[0].blends.size(), 2u);
    EXPECT_EQ(stages[0].blends[0].list, dir_ / "one.txt");
    EXPECT_EQ(stages[0].blends[0].weight, 0.7);
    EXPECT_EQ(stages[0].blends[1].weight, 3);
    EXPECT_EQ(stages[0].list, "0.7*" + (dir_ / "one.txt") + "+3*" + (dir_ / "two.txt"));
    const Config again = Config::Parse(config.ToToml(), "config.toml");
    EXPECT_TRUE(again.Diff(config).empty());
    EXPECT_EQ(ReadDataStages(again)[0].list, stages[0].list);
  }
}

TEST_F(StagesTest, BadBlendsAreRefusedInOneLineNamingTheStageAndTheEntry) {
  const std::string one = "\"" + (dir_ / "one.txt") + "\"";
  struct Case {
    std::string second, expected;
  };
  const std::vector<Case> cases = {
      {"steps = 5\nblends = [{ list = " + one + ", weight = 1 }]\nlist = " + one + "\n",
       "#2 (\"stage2\"): both list and blends are given; give the stage's data one way"},
      {"steps = 5\nblends = []\n", "#2 (\"stage2\"): blends = []: name at least one file list"},
      {"steps = 5\nblends = " + one + "\n", "blends: expected an array of tables"},
      {"steps = 5\nblends = [" + one + "]\n", "blends #1: expected a table { list = "},
      {"steps = 5\nblends = [{ weight = 1 }]\n",
       "#2 (\"stage2\"): blends #1: no list: name a blend file list"},
      {"steps = 5\nblends = [{ list = \"\", weight = 1 }]\n", "blends #1: no list"},
      {"steps = 5\nblends = [{ list = " + one + " }]\n", "\"): no weight: give the list's share"},
      {"steps = 5\nblends = [{ list = " + one + ", weight = 1 }, { list = " + one +
           ", weight = 0 }]\n",
       "blends #2 (" + one + "): weight = 0 is out of range: expected a positive finite number"},
      {"steps = 5\nblends = [{ list = " + one + ", weight = -0.5 }]\n",
       "weight = -0.5 is out of range"},
      {"steps = 5\nblends = [{ list = " + one + ", weight = inf }]\n",
       "weight = inf is out of range"},
      {"steps = 5\nblends = [{ list = " + one + ", weight = \"1\" }]\n",
       "weight: expected a number"},
      {"steps = 5\nblends = [{ list = " + one + ", wieght = 1 }]\n",
       "blends #1: unknown key 'wieght' (did you mean 'weight'?)"},
      {"steps = 5\nblends = [{ list = \"" + (dir_ / "missing.txt") + "\", weight = 1 }]\n",
       "blends #1: list = \"" + (dir_ / "missing.txt") +
           "\": cannot read the file list: no such file"},
      {"steps = 5\nblends = [{ list = \"" + dir_.path() + "\", weight = 1 }]\n", "is a directory"},
      {"steps = 5\nblend = []\n", "unknown key 'blend' (did you mean 'blends'?)"},
  };
  for (const Case& c : cases) {
    // The second stage without its `list` line: the case gives the data.
    const Config config = Config::Parse(
        "[training]\ndataset = \"blend\"\n\n[[data.stages]]\nname = \"pre\"\nlist = \"" +
            (dir_ / "one.txt") + "\"\nsteps = 10\n\n[[data.stages]]\n" + c.second,
        "run.toml");
    const std::string message = Refusal(config);
    EXPECT_NE(message.find(c.expected), std::string::npos) << "stage:\n"
                                                           << c.second << "message: " << message;
    EXPECT_NE(message.find("run.toml:9: [[data.stages]] #2"), std::string::npos) << message;
  }
}

TEST_F(StagesTest, TheFirstStageHasNothingToAnnealFrom) {
  const std::string message = Refusal(TwoStages("steps = 5\n", "steps = 10\nanneal_steps = 2\n"));
  EXPECT_NE(message.find("#1 (\"pre\"): anneal_steps in the first stage"), std::string::npos)
      << message;
}

}  // namespace
}  // namespace crucible
