#include "launch/node_pool.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "launch/launcher.h"

namespace crucible {
namespace {

using Nodes = std::vector<std::string>;

TEST(NodePool, SplitsActiveAndSpares) {
  NodePool all_left({"n1", "n2", "n3", "n4", "n5"}, 3, -1);
  EXPECT_EQ(all_left.active(), (Nodes{"n1", "n2", "n3"}));
  EXPECT_EQ(all_left.spares(), (Nodes{"n4", "n5"}));
  NodePool one({"n1", "n2", "n3", "n4", "n5"}, 3, 1);
  EXPECT_EQ(one.spares(), (Nodes{"n4"}));
  EXPECT_THROW(NodePool({"n1", "n2"}, 3, -1), Error);
  EXPECT_THROW(NodePool({"n1", "n2", "n3"}, 2, 2), Error);
}

TEST(NodePool, SwapKeepsRankPositions) {
  NodePool pool({"n1", "n2", "n3", "n4"}, 3, -1);
  EXPECT_EQ(pool.Swap({"n2", true, 1, "bad_node", "srun: error: n2: task 1: Killed"}), "n4");
  EXPECT_EQ(pool.active(), (Nodes{"n1", "n4", "n3"}));
  EXPECT_TRUE(pool.spares().empty());
  EXPECT_EQ(pool.Swap({"n1", true, 2, "bad_node", ""}), "");  // no spare left: unchanged
  EXPECT_EQ(pool.active(), (Nodes{"n1", "n4", "n3"}));
  ASSERT_EQ(pool.evicted().size(), 1u);
  EXPECT_EQ(pool.evicted()[0].node, "n2");
}

TEST(NodePool, BlindSwapNeverEvictsANodeJustSwappedIn) {
  NodePool pool({"n1", "n2", "n3", "n4", "n5"}, 2, -1);
  pool.NewAttempt();
  pool.CountFailure(pool.active());
  std::string first = pool.BlindCandidate();
  EXPECT_EQ(first, "n1");
  EXPECT_EQ(pool.Swap({first, false, 1, "unknown", ""}), "n3");
  pool.NewAttempt();  // attempt 2 runs on n3, n2
  pool.CountFailure(pool.active());
  EXPECT_EQ(pool.BlindCandidate(), "n2");  // n3 was just swapped in; n2 failed twice
  EXPECT_EQ(pool.Swap({"n2", false, 2, "unknown", ""}), "n4");
  pool.NewAttempt();  // attempt 3 runs on n3, n4: n3 is no longer "just" in
  pool.CountFailure(pool.active());
  EXPECT_EQ(pool.BlindCandidate(), "n3");
  NodePool single({"n1", "n2"}, 1, -1);
  single.Swap({"n1", false, 1, "unknown", ""});
  single.NewAttempt();
  EXPECT_EQ(single.BlindCandidate(), "");  // the only active node was just swapped in
}

TEST(Backoff, DoublesFromBaseUpToCap) {
  std::vector<double> seconds;
  for (int retry = 1; retry <= 6; ++retry) seconds.push_back(BackoffSeconds(retry, 5, 60));
  EXPECT_EQ(seconds, (std::vector<double>{5, 10, 20, 40, 60, 60}));
  EXPECT_DOUBLE_EQ(BackoffSeconds(3, 0.05, 0.1), 0.1);
}

}  // namespace
}  // namespace crucible
