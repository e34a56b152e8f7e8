#include "common/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <variant>
#include <vector>

#include "common/error.h"
#include "common/files.h"

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

TEST(Config, DefaultsAreNotMarkedSet) {
  Config config = Config::Defaults();
  EXPECT_EQ(config.Int("training.steps"), 100);
  EXPECT_FALSE(config.IsSet("training.steps"));
}

// Defaults() copies each schema default as it is; a default of another type than its key's
// would only fail when the key is read.
TEST(Config, EveryDefaultHasTheTypeOfItsKey) {
  for (const auto& spec : Config::Schema()) {
    const ConfigValue& value = spec.default_value;
    bool matches = false;
    switch (spec.type) {
      case ConfigType::kBool:
        matches = std::holds_alternative<bool>(value);
        break;
      case ConfigType::kInt:
        matches = std::holds_alternative<int64_t>(value);
        break;
      case ConfigType::kFloat:
        matches = std::holds_alternative<double>(value);
        break;
      case ConfigType::kString:
        matches = std::holds_alternative<std::string>(value);
        break;
      case ConfigType::kStringList:
      case ConfigType::kTableList:
        matches = std::holds_alternative<std::vector<std::string>>(value);
        break;
      case ConfigType::kIntOrString:
        matches =
            std::holds_alternative<int64_t>(value) || std::holds_alternative<std::string>(value);
        break;
      case ConfigType::kBoolOrString:
        matches = std::holds_alternative<std::string>(value);
        break;
    }
    EXPECT_TRUE(matches) << spec.key << " defaults to " << FormatConfigValue(value) << ", not "
                         << ConfigTypeName(spec.type);
  }
}

// `crucible config keys`, the list users read, is TOML: read back as a config it gives every key
// of the schema (each one comes out set), each at its default (nothing differs from Defaults()).
TEST(Config, ConfigKeysListsEveryKeyAtItsDefault) {
  const std::string path =
      ::testing::TempDir() + "/config_keys-" + std::to_string(getpid()) + ".toml";
  ASSERT_EQ(std::system((std::string(CRUCIBLE_BINARY) + " config keys > " + path).c_str()), 0);
  Config listed = Config::Parse(ReadFile(path), "crucible config keys");
  std::remove(path.c_str());
  for (const auto& spec : Config::Schema()) EXPECT_TRUE(listed.IsSet(spec.key)) << spec.key;
  for (const auto& key : listed.Diff(Config::Defaults()))
    ADD_FAILURE() << key << " is listed as " << FormatConfigValue(listed.Value(key))
                  << ", its default is " << FormatConfigValue(Config::Defaults().Value(key));
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

TEST(ConfigRange, DefaultsAreInRange) {
  EXPECT_NO_THROW(Config::Defaults().Validate());
}

TEST(ConfigRange, EveryNumericKeyDeclaresItsValidRange) {
  for (const auto& spec : Config::Schema()) {
    if (spec.type != ConfigType::kInt && spec.type != ConfigType::kFloat &&
        spec.type != ConfigType::kIntOrString)
      continue;
    if (spec.key == "debug.seed") continue;  // any integer seeds the generator
    EXPECT_TRUE(std::isfinite(spec.range.min) || std::isfinite(spec.range.max)) << spec.key;
  }
}

TEST(ConfigRange, OutOfRangeValueNamesWhereKeyValueAndRange) {
  std::string message;
  Config from_file = Config::Parse("[job]\nname = \"x\"\n[optimizer]\nlr = inf\n", "c.toml");
  EXPECT_EQ(ExitCodeOf([&] { from_file.Validate(); }, &message), kExitUsage);
  EXPECT_EQ(message, "c.toml:4: optimizer.lr = inf is out of range: expected a finite number >= 0");

  Config overridden = Config::Defaults();
  overridden.ApplyOverride("optimizer.eps=0");
  EXPECT_EQ(ExitCodeOf([&] { overridden.Validate(); }, &message), kExitUsage);
  EXPECT_NE(message.find("--set optimizer.eps=0: optimizer.eps = 0 is out of range"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find(">= 1.17549e-38"), std::string::npos) << message;
}

// `crucible config keys` states the range the optimizer enforces, and a value far out of it is
// printed as written, not through a double (2^63 - 1 would read ...808).
TEST(ConfigRange, NsStepsIsOneToAHundredAndAnOutOfRangeValueIsPrintedAsWritten) {
  const ConfigKeySpec* spec = Config::FindSpec("optimizer.ns_steps");
  ASSERT_NE(spec, nullptr);
  EXPECT_EQ(spec->range.Describe(spec->type), "an integer in [1, 100]");
  std::string message;
  Config config = Config::Parse("[optimizer]\nns_steps = 9223372036854775807\n", "m.toml");
  EXPECT_EQ(ExitCodeOf([&] { config.Validate(); }, &message), kExitUsage);
  EXPECT_EQ(message,
            "m.toml:2: optimizer.ns_steps = 9223372036854775807 is out of range: expected an "
            "integer in [1, 100]");
}

TEST(ConfigRange, RejectsNonFiniteAndMeaninglessValues) {
  for (const char* bad : {"optimizer.lr=inf",
                          "optimizer.lr=nan",
                          "optimizer.lr=-1e-3",
                          "model.init_std=inf",
                          "model.init_std=0",
                          "model.norm_eps=1e-50",
                          "optimizer.eps=0",
                          "optimizer.beta1=1",
                          "optimizer.beta2=-0.1",
                          "optimizer.weight_decay=-0.1",
                          "training.max_norm=-1",
                          "training.max_norm=inf",
                          "comm.train_timeout_seconds=0",
                          "comm.train_timeout_seconds=nan",
                          "comm.train_timeout_seconds=inf",
                          "metrics.log_freq=0",
                          "metrics.peak_gflops=-1",
                          "validation.freq=0",
                          "lr_scheduler.min_lr_factor=1.5",
                          "lr_scheduler.decay_ratio=nan",
                          "training.seq_len=0",
                          "training.seq_len=4294967296",
                          "training.local_batch_size=0",
                          "training.steps=-1",
                          "model.dim=-8",
                          "model.vocab_size=4294967296",
                          "checkpoint.interval=0",
                          "checkpoint.mtbf_hours=nan",
                          "parallelism.zero_stage=4",
                          "parallelism.consistency_check_steps=-1",
                          "debug.fake_loss_divisor=0"}) {
    Config config = Config::Defaults();
    config.ApplyOverride(bad);
    std::string message;
    EXPECT_EQ(ExitCodeOf([&] { config.Validate(); }, &message), kExitUsage) << bad;
    const std::string key = std::string(bad).substr(0, std::string(bad).find('='));
    EXPECT_NE(message.find(key + " = "), std::string::npos) << message;
  }
}

TEST(ConfigRange, AcceptsTheEndsOfEachRange) {
  for (const char* good :
       {"optimizer.lr=0", "optimizer.beta1=0", "optimizer.beta2=0.999999", "training.max_norm=0",
        "optimizer.weight_decay=0", "lr_scheduler.min_lr_factor=1", "checkpoint.interval=\"auto\"",
        "checkpoint.interval=1", "debug.seed=-5", "training.seq_len=2147483647",
        "optimizer.eps=1.2e-38"}) {
    Config config = Config::Defaults();
    config.ApplyOverride(good);
    EXPECT_NO_THROW(config.Validate()) << good;
  }
}

}  // namespace
}  // namespace crucible
