// Owner ranks of whole tensors for kWholeMatrix optimizers across ZeRO ranks.
#include "optim/matrix_owners.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "common/config.h"
#include "common/error.h"
#include "model/llama.h"
#include "optim_test_util.h"

namespace crucible {
namespace {

using optim_test::TableOfSizes;

std::vector<size_t> Loads(const ParameterTable& table, const std::vector<int>& owners, int world) {
  std::vector<size_t> load(world, 0);
  for (size_t t = 0; t < owners.size(); ++t) load[owners[t]] += table.params()[t].numel;
  return load;
}

TEST(AssignMatrixOwners, LargestFirstToTheLeastLoadedRankLowestOnTies) {
  // Sizes 4 9 4 2 7 3 on 3 ranks, by hand: t1 (9) -> 0, t4 (7) -> 1, t0 (4) -> 2, t2 (4) -> 2
  // (loads 9 7 4), t5 (3) -> 1 (loads 9 7 8), t3 (2) -> 2 (loads 9 10 8): loads 9 10 10.
  const ParameterTable table = TableOfSizes({4, 9, 4, 2, 7, 3});
  EXPECT_EQ(AssignMatrixOwners(table, 3), (std::vector<int>{2, 0, 2, 2, 1, 1}));
  EXPECT_EQ(Loads(table, AssignMatrixOwners(table, 3), 3), (std::vector<size_t>{9, 10, 10}));
  EXPECT_EQ(TensorsOwnedBy(AssignMatrixOwners(table, 3), 2), (std::vector<size_t>{0, 2, 3}));
}

TEST(AssignMatrixOwners, OnlyTheWholeTensorsGetOwnersAndOnlyTheyAreBalanced) {
  // Of sizes 4 9 4 2 7 3, t1 and t5 are updated elementwise: t4 (7) -> 0, t0 (4) -> 1,
  // t2 (4) -> 2, t3 (2) -> 1 (loads 7 4 4: the lowest of the least loaded): loads 7 6 4.
  const ParameterTable table = TableOfSizes({4, 9, 4, 2, 7, 3});
  const std::vector<int> owners =
      AssignMatrixOwners(table, 3, {true, false, true, true, true, false});
  EXPECT_EQ(owners, (std::vector<int>{1, kNoOwner, 2, 1, 0, kNoOwner}));
  EXPECT_EQ(TensorsOwnedBy(owners, 1), (std::vector<size_t>{0, 3}));
  EXPECT_THROW(AssignMatrixOwners(table, 3, {true}), Error);
}

TEST(AssignMatrixOwners, OneRankOwnsEverythingAndSpareRanksOwnNothing) {
  const ParameterTable table = TableOfSizes({5, 1, 3});
  EXPECT_EQ(AssignMatrixOwners(table, 1), (std::vector<int>{0, 0, 0}));
  const std::vector<int> owners = AssignMatrixOwners(table, 5);
  EXPECT_EQ(owners, (std::vector<int>{0, 2, 1}));
  EXPECT_TRUE(TensorsOwnedBy(owners, 3).empty() && TensorsOwnedBy(owners, 4).empty());
}

// On a real model table, for every world size: each tensor has one owner in range, the largest
// load exceeds the mean by at most the largest tensor, and the result depends on nothing else
// (a second call, and a table with the same sizes under other names, give the same owners).
TEST(AssignMatrixOwners, BalancedAndAPureFunctionOfTheSizesOnALlamaTable) {
  Config config = Config::Defaults();
  config.ApplyOverride("model.flavor=tiny");
  const LlamaConfig model = BuildLlamaConfig(config);
  const ParameterTable table = LlamaParameterTable(model);
  std::vector<int64_t> sizes;
  size_t largest = 0;
  for (const ParamInfo& p : table.params()) {
    sizes.push_back(static_cast<int64_t>(p.numel));
    largest = std::max(largest, p.numel);
  }
  for (int world = 1; world <= 12; ++world) {
    SCOPED_TRACE(world);
    const std::vector<int> owners = AssignMatrixOwners(table, world);
    ASSERT_EQ(owners.size(), table.params().size());
    for (int owner : owners) EXPECT_TRUE(owner >= 0 && owner < world);
    const std::vector<size_t> load = Loads(table, owners, world);
    const double mean = static_cast<double>(table.total()) / world;
    EXPECT_LE(static_cast<double>(*std::max_element(load.begin(), load.end())), mean + largest);
    EXPECT_EQ(AssignMatrixOwners(table, world), owners);
    EXPECT_EQ(AssignMatrixOwners(TableOfSizes(sizes), world), owners);
  }
}

}  // namespace
}  // namespace crucible
