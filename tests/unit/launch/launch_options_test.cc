// Every numeric option of `crucible launch` is checked: finite, within range, and a value that was
// given is never mistaken for "not given" (docs/launch.md).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "common/error.h"
#include "launch/launcher.h"

namespace crucible {
namespace {

LaunchOptions Valid() {
  LaunchOptions options;
  options.command = {"true"};
  return options;
}

// The message of the usage error ValidateLaunchOptions throws, or "" when it accepts them.
std::string Rejection(const LaunchOptions& options) {
  try {
    ValidateLaunchOptions(options);
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    return e.what();
  }
  return "";
}

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(LaunchOptions, DefaultsAndOrdinaryValuesAreAccepted) {
  EXPECT_EQ(Rejection(Valid()), "");
  LaunchOptions o = Valid();
  o.np = 8, o.ppn = 4, o.nodes = 2, o.retries = 0, o.timeout_seconds = 600;
  o.kill_grace_seconds = 0, o.backoff_base_seconds = 0, o.walltime_margin_seconds = 0;
  o.auto_retry = true, o.spares = 0;
  EXPECT_EQ(Rejection(o), "");
}

TEST(LaunchOptions, RankAndNodeCountsMustBePositive) {
  for (int bad : {0, -1}) {
    LaunchOptions o = Valid();
    o.np = bad;
    EXPECT_EQ(Rejection(o).rfind("--np: " + std::to_string(bad) + " is out of range", 0), 0u);
    o = Valid();
    o.ppn = bad;
    EXPECT_EQ(Rejection(o).rfind("--ppn: ", 0), 0u);
    o = Valid();
    o.nodes = bad;
    EXPECT_EQ(Rejection(o).rfind("--nodes: ", 0), 0u);
  }
}

TEST(LaunchOptions, AnExplicitMinusOneIsNotTheDefault) {
  LaunchOptions o = Valid();
  o.retries = -1;
  EXPECT_EQ(Rejection(o), "--retries: -1 is out of range; give 0 to 1000000");
  o = Valid();
  o.auto_retry = true;
  o.spares = -1;
  EXPECT_EQ(Rejection(o).rfind("--spares: -1 is out of range", 0), 0u);
}

TEST(LaunchOptions, TimeoutMustBeFiniteAndPositive) {
  for (double bad : {kNan, kInf, -kInf, 0.0, -1.0, 1e8}) {
    LaunchOptions o = Valid();
    o.timeout_seconds = bad;
    EXPECT_EQ(Rejection(o).rfind("--timeout: ", 0), 0u) << bad;
  }
  LaunchOptions o = Valid();
  o.timeout_seconds = kNan;
  EXPECT_EQ(Rejection(o),
            "--timeout: nan is not a finite number; give seconds above 0, at most "
            "10000000");
}

TEST(LaunchOptions, EverySecondsOptionIsChecked) {
  struct Field {
    const char* option;
    double LaunchOptions::*member;
  };
  for (Field f : {Field{"--kill-grace", &LaunchOptions::kill_grace_seconds},
                  Field{"--backoff-base", &LaunchOptions::backoff_base_seconds},
                  Field{"--backoff-cap", &LaunchOptions::backoff_cap_seconds},
                  Field{"--walltime-margin", &LaunchOptions::walltime_margin_seconds},
                  Field{"--preflight-timeout", &LaunchOptions::preflight_timeout_seconds}}) {
    for (double bad : {kNan, kInf, -1.0, 1e300}) {
      LaunchOptions o = Valid();
      o.*f.member = bad;
      EXPECT_EQ(Rejection(o).rfind(std::string(f.option) + ": ", 0), 0u) << f.option << " " << bad;
    }
  }
  LaunchOptions o = Valid();
  o.preflight_timeout_seconds = 0;  // a health check that may take no time at all
  EXPECT_EQ(Rejection(o).rfind("--preflight-timeout: 0 is out of range", 0), 0u);
}

TEST(LaunchOptions, SparesNeedAutoRetry) {
  LaunchOptions o = Valid();
  o.spares = 1;
  EXPECT_EQ(Rejection(o), "--spares needs --auto-retry");
}

}  // namespace
}  // namespace crucible

namespace crucible {
namespace {

// --tp passes the degree on to the command; the command's own --set is read when --tp is not
// given; the two disagreeing is a usage error in one line.
TEST(LaunchTensorParallel, TheDegreeIsPassedToTheCommandOrReadFromIt) {
  LaunchOptions options;
  options.command = {"crucible", "train", "--config", "a.toml"};
  std::vector<std::string> command;
  EXPECT_EQ(TensorParallelDegree(options, &command), 1);
  EXPECT_EQ(command, options.command);
  options.tensor_parallel = 2;
  EXPECT_EQ(TensorParallelDegree(options, &command), 2);
  EXPECT_EQ(command, (std::vector<std::string>{"crucible", "train", "--config", "a.toml", "--set",
                                               "parallelism.tensor_parallel_degree=2"}));
  options.tensor_parallel.reset();
  options.command = {"crucible", "train", "--set", "parallelism.tensor_parallel_degree=4"};
  EXPECT_EQ(TensorParallelDegree(options, &command), 4);
  EXPECT_EQ(command, options.command);  // already there
  options.tensor_parallel = 2;
  try {
    TensorParallelDegree(options, &command);
    ADD_FAILURE() << "--tp 2 against the command's 4 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    EXPECT_NE(std::string(e.what()).find("--tp 2, but the command sets"), std::string::npos);
  }
}

// Consecutive ranks form a group; a group across a node boundary is warned about, naming it.
TEST(LaunchTensorParallel, AGroupThatSpansNodesIsWarnedAboutByName) {
  std::vector<std::string> warnings;
  const std::vector<std::string> nodes = {"n1", "n2"};
  EXPECT_EQ(DescribeTensorParallelGroups(8, 4, 2, nodes, &warnings),
            (std::vector<std::string>{"  group 0: ranks 0-1 on n1", "  group 1: ranks 2-3 on n1",
                                      "  group 2: ranks 4-5 on n2", "  group 3: ranks 6-7 on n2"}));
  EXPECT_TRUE(warnings.empty());
  // 3 ranks per node: the second group of 2 straddles the nodes.
  const std::vector<std::string> lines = DescribeTensorParallelGroups(6, 3, 2, nodes, &warnings);
  EXPECT_EQ(lines[1], "  group 1: ranks 2-3 on n1,n2");
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("tensor-parallel group 1 (ranks 2-3) spans 2 nodes"),
            std::string::npos)
      << warnings[0];
}

}  // namespace
}  // namespace crucible
