#include "common/config.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace crucible {
namespace {

int ExitCodeOf(const std::function<void()>& f, std::string* message = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.exit_code();
  }
  return 0;
}

TEST(Config, DefaultsCoverEverySchemaKey) {
  Config config = Config::Defaults();
  for (const auto& spec : Config::Schema()) EXPECT_NO_THROW(config.Value(spec.key)) << spec.key;
  EXPECT_EQ(config.Int("training.steps"), 100);
  EXPECT_FALSE(config.IsSet("training.steps"));
}

TEST(Config, ParsesSectionsAndMarksKeysSet) {
  Config config =
      Config::Parse("[training]\nsteps = 7\nmax_norm = 2\n[job]\nname = \"x\"\n", "t.toml");
  EXPECT_EQ(config.Int("training.steps"), 7);
  EXPECT_DOUBLE_EQ(config.Float("training.max_norm"), 2.0);  // an integer is accepted as a float
  EXPECT_EQ(config.String("job.name"), "x");
  EXPECT_TRUE(config.IsSet("training.steps"));
}

TEST(Config, UnknownKeySuggestsClosest) {
  std::string message;
  EXPECT_EQ(ExitCodeOf([] { Config::Parse("[optimizer]\nlearning_rat = 1\n", "c.toml"); }),
            kExitUsage);
  ExitCodeOf([] { Config::Parse("[training]\nseq_lne = 1\n", "c.toml"); }, &message);
  EXPECT_NE(message.find("c.toml:2"), std::string::npos) << message;
  EXPECT_NE(message.find("training.seq_len"), std::string::npos) << message;
}

TEST(Config, KeyInTheWrongSectionIsSuggested) {
  EXPECT_EQ(Config::Suggest("training.lr"), "optimizer.lr");
  EXPECT_EQ(Config::Suggest("model.seed"), "debug.seed");
}

TEST(Config, TypeErrorNamesExpectedType) {
  std::string message;
  EXPECT_EQ(ExitCodeOf([] { Config::Parse("[metrics]\nenable_jsonl = 1\n", "c.toml"); }, &message),
            kExitUsage);
  EXPECT_NE(message.find("boolean"), std::string::npos) << message;
}

TEST(Config, OverridesUseTomlSyntaxAndBareWords) {
  Config config = Config::Defaults();
  config.ApplyOverride("training.steps=200");
  config.ApplyOverride("job.name=run-7");
  config.ApplyOverride("job.description=\"two words\"");
  config.ApplyOverride("optimizer.lr = 1e-3");
  config.ApplyOverride("metrics.enable_jsonl=false");
  EXPECT_EQ(config.Int("training.steps"), 200);
  EXPECT_EQ(config.String("job.name"), "run-7");
  EXPECT_EQ(config.String("job.description"), "two words");
  EXPECT_DOUBLE_EQ(config.Float("optimizer.lr"), 1e-3);
  EXPECT_FALSE(config.Bool("metrics.enable_jsonl"));
}

TEST(Config, BadOverridesAreUsageErrors) {
  for (const char* bad : {"training.steps", "steps=1", ".steps=1", "training.=1", "a.b.c=1",
                          "training.steps=", "training.steps=1.5", "training.steps=x y"}) {
    Config config = Config::Defaults();
    EXPECT_EQ(ExitCodeOf([&] { config.ApplyOverride(bad); }), kExitUsage) << bad;
  }
}

TEST(Config, ResolvedTomlRoundTrips) {
  Config config =
      Config::Parse("[training]\nsteps = 9\n[job]\ndescription = \"a \\\"quoted\\\" word\"\n", "t");
  Config again = Config::Parse(config.ToToml(), "resolved");
  EXPECT_TRUE(config.Diff(again).empty());
  EXPECT_EQ(again.String("job.description"), "a \"quoted\" word");
}

TEST(Config, DiffListsChangedKeys) {
  Config a = Config::Defaults(), b = Config::Defaults();
  b.ApplyOverride("training.seq_len=512");
  EXPECT_EQ(a.Diff(b), std::vector<std::string>{"training.seq_len"});
}

}  // namespace
}  // namespace crucible
