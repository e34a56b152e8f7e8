#include "train/rank_agreement.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace crucible {
namespace {

std::string Toml(const std::vector<std::string>& overrides) {
  Config config = Config::Defaults();
  for (const auto& o : overrides) config.ApplyOverride(o);
  return config.ToToml();
}

TEST(RankAgreement, NamesTheFirstDifferingKeyWithBothValuesAndTheOthersByName) {
  EXPECT_EQ(DescribeConfigDifference(Toml({}), Toml({}), 1), "");
  EXPECT_EQ(DescribeConfigDifference(Toml({"training.seq_len=32", "optimizer.lr=0.001"}),
                                     Toml({"training.seq_len=64", "optimizer.lr=0.002"}), 3),
            "the ranks got different configs: training.seq_len is 32 on rank 0 but 64 on rank 3; "
            "other keys that differ: optimizer.lr (every rank must get the same config file and "
            "--set overrides)");
  EXPECT_NE(DescribeConfigDifference(Toml({"job.name=a"}), Toml({"job.name=b"}), 1)
                .find("job.name is 'a' on rank 0 but 'b' on rank 1"),
            std::string::npos);
}

TEST(RankAgreement, NodeLocalFoldersOfLaunchYeetCompareAsTheirPattern) {
  const std::string n1 = Toml({"training.dataset_path=/local/node-n1/data/x.bin",
                               "model.tokenizer_path=/local/node-n10/tok.json"});
  ASSERT_EQ(unsetenv("CRUCIBLE_NODE_LOCAL"), 0);
  EXPECT_EQ(NodeLocalPathsAsPattern(n1), n1);  // not launched with --yeet: unchanged
  setenv("CRUCIBLE_NODE_LOCAL", "/local/node-%N", 1);
  setenv("CRUCIBLE_NODE_LOCAL_DIR", "/local/node-n1", 1);
  // The node's own folder becomes the pattern; node-n10 is another folder and stays.
  EXPECT_EQ(NodeLocalPathsAsPattern(n1),
            Toml({"training.dataset_path=/local/node-%N/data/x.bin",
                  "model.tokenizer_path=/local/node-n10/tok.json"}));
  setenv("CRUCIBLE_NODE_LOCAL_DIR", "/local/node-n2", 1);
  EXPECT_EQ(NodeLocalPathsAsPattern(Toml({"training.dataset_path=/local/node-n2/data/x.bin"})),
            Toml({"training.dataset_path=/local/node-%N/data/x.bin"}));
  unsetenv("CRUCIBLE_NODE_LOCAL");
  unsetenv("CRUCIBLE_NODE_LOCAL_DIR");
}

}  // namespace
}  // namespace crucible
