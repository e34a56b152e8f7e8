#include "train/rank_agreement.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace crucible
