// The routes of whole-matrix updates under ZeRO-1/3 (distributed/matrix_routes.h), without MPI:
// every rank's routes are built, the two all-to-allv's are played in memory, and each owner must
// receive exactly its tensors, whole and in order, and each holder get back exactly its range.
// ZeRO-1 and ZeRO-3 cut the flat buffer the same way (ShardLayout::Owned); they differ only in
// whether the weight pieces travel the same route as the gradient pieces.
#include "distributed/matrix_routes.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "../optim/optim_test_util.h"
#include "common/config.h"
#include "common/error.h"
#include "common/strings.h"
#include "distributed/data_parallel.h"
#include "model/llama.h"
#include "optim/matrix_owners.h"

namespace crucible {
namespace {

using optim_test::TableOfSizes;

std::vector<Range> Pieces(std::initializer_list<std::pair<size_t, size_t>> list) {
  std::vector<Range> pieces;
  for (auto [b, e] : list) pieces.push_back({b, e});
  return pieces;
}

// Sizes 6 3 5 2 (tensors [0,6) [6,9) [9,14) [14,16)) in chunks of 4 on 3 ranks: shards of 8, so
// rank 0 holds [0,8) (t1 cut at 8), rank 1 [8,16), rank 2 nothing. Owners by hand (largest
// first to the least loaded): t0 -> 0, t2 -> 1, t1 -> 2, t3 -> 2.
TEST(RouteMatrices, AWorkedExampleWithACutTensorAndAnEmptyShard) {
  const ParameterTable table = TableOfSizes({6, 3, 5, 2});
  const std::vector<int> owners = AssignMatrixOwners(table, 3);
  ASSERT_EQ(owners, (std::vector<int>{0, 2, 1, 2}));
  auto routes = [&](int rank) { return RouteMatrices(table, owners, ShardLayout(16, 3, rank, 4)); };

  const MatrixRoutes r0 = routes(0), r1 = routes(1), r2 = routes(2);
  // Holders: pieces by owner, then flat order.
  EXPECT_EQ(r0.pieces, Pieces({{0, 6}, {6, 8}}));
  EXPECT_EQ(r0.to_owners.counts, (std::vector<size_t>{6, 0, 2}));
  EXPECT_EQ(r1.pieces, Pieces({{9, 14}, {8, 9}, {14, 16}}));
  EXPECT_EQ(r1.to_owners.counts, (std::vector<size_t>{0, 5, 3}));
  EXPECT_EQ(r1.to_owners.offsets, (std::vector<size_t>{0, 0, 5}));
  EXPECT_TRUE(r2.pieces.empty());
  EXPECT_EQ(r2.to_owners.counts, (std::vector<size_t>{0, 0, 0}));
  // Owners: their tensors concatenated, block q from holder q.
  EXPECT_EQ(r0.tensors, (std::vector<size_t>{0}));
  EXPECT_EQ(r0.from_holders.counts, (std::vector<size_t>{6, 0, 0}));
  EXPECT_EQ(r1.tensors, (std::vector<size_t>{2}));
  EXPECT_EQ(r1.from_holders.counts, (std::vector<size_t>{0, 5, 0}));
  EXPECT_EQ(r2.tensors, (std::vector<size_t>{1, 3}));
  EXPECT_EQ(r2.tensor_offsets, (std::vector<size_t>{0, 3}));
  EXPECT_EQ(r2.from_holders.counts, (std::vector<size_t>{2, 3, 0}));  // t1[0,2); t1[2,3), t3
  EXPECT_EQ(r2.owned_elements(), 5u);
}

// Plays the gradient all-to-allv (holders -> owners) and the weight all-to-allv back on
// `world` ranks, with flat element i carrying the value i. Checks the block sizes agree on both
// sides of every pair, that each owner's buffer is its tensors concatenated, and that the
// holders get back their ranges whole.
void ExpectRoutesDeliver(const ParameterTable& table, int world, size_t chunk) {
  const size_t n = table.total();
  const std::vector<int> owners = AssignMatrixOwners(table, world);
  std::vector<MatrixRoutes> routes;
  std::vector<ShardLayout> layouts;
  for (int r = 0; r < world; ++r) {
    layouts.emplace_back(n, world, r, chunk);
    routes.push_back(RouteMatrices(table, owners, layouts.back()));
  }
  std::vector<float> flat(n);
  std::iota(flat.begin(), flat.end(), 0.0f);
  const std::string where =
      StrFormat("%zu parameters in chunks of %zu on %d ranks", n, chunk, world);
  // Each holder packs its range.
  std::vector<std::vector<float>> packed(world);
  for (int q = 0; q < world; ++q) {
    for (const Range& piece : routes[q].pieces)
      packed[q].insert(packed[q].end(), flat.begin() + piece.begin, flat.begin() + piece.end);
    EXPECT_EQ(packed[q].size(), layouts[q].Owned().size()) << where;
    EXPECT_EQ(routes[q].to_owners.total(), packed[q].size()) << where;
  }
  // Holders -> owners, then each owner's buffer is its tensors, whole, in ascending order.
  std::vector<std::vector<float>> owned(world);
  for (int o = 0; o < world; ++o) {
    owned[o].resize(routes[o].owned_elements());
    for (int q = 0; q < world; ++q) {
      const size_t count = routes[q].to_owners.counts[o];
      ASSERT_EQ(count, routes[o].from_holders.counts[q]) << where << ", " << q << " -> " << o;
      std::copy_n(packed[q].begin() + routes[q].to_owners.offsets[o], count,
                  owned[o].begin() + routes[o].from_holders.offsets[q]);
    }
    std::vector<float> expected;
    for (size_t t : TensorsOwnedBy(owners, o)) {
      const ParamInfo& p = table.params()[t];
      expected.insert(expected.end(), flat.begin() + p.offset, flat.begin() + p.offset + p.numel);
    }
    EXPECT_EQ(owned[o], expected) << where << ", owner " << o;
    for (size_t k = 0; k < routes[o].tensors.size(); ++k)
      EXPECT_EQ(owned[o][routes[o].tensor_offsets[k]],
                static_cast<float>(table.params()[routes[o].tensors[k]].offset))
          << where;
  }
  // Owners update (negate) and send back; the holders' ranges together are the whole buffer.
  std::vector<float> back(n, 1.0f);
  for (int q = 0; q < world; ++q) {
    std::vector<float> received(packed[q].size());
    for (int o = 0; o < world; ++o)
      for (size_t k = 0; k < routes[q].to_owners.counts[o]; ++k)
        received[routes[q].to_owners.offsets[o] + k] =
            -owned[o][routes[o].from_holders.offsets[q] + k];
    size_t at = 0;
    for (const Range& piece : routes[q].pieces) {
      std::copy_n(received.begin() + at, piece.size(), back.begin() + piece.begin);
      at += piece.size();
    }
  }
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], -flat[i]) << where << ", element " << i;
}

TEST(RouteMatrices, EveryTensorReachesItsOwnerWholeAndComesBackForAnyWorldAndChunk) {
  for (const std::vector<int64_t>& sizes :
       std::vector<std::vector<int64_t>>{{6, 3, 5, 2}, {1}, {17, 1, 1, 9, 4, 30, 2}, {8, 8, 8, 8}})
    for (int world = 1; world <= 6; ++world)  // six ranks are more than most of these tensors
      for (size_t chunk : {1, 2, 4, 16}) ExpectRoutesDeliver(TableOfSizes(sizes), world, chunk);
}

TEST(RouteMatrices, MoreRanksThanTensorsLeavesOwnersAndHoldersWithNothing) {
  const ParameterTable table = TableOfSizes({5, 4});
  const std::vector<int> owners = AssignMatrixOwners(table, 4);
  const MatrixRoutes spare = RouteMatrices(table, owners, ShardLayout(9, 4, 3, 2));
  EXPECT_TRUE(spare.tensors.empty());  // rank 3 owns no tensor ...
  EXPECT_EQ(spare.owned_elements(), 0u);
  EXPECT_EQ(spare.from_holders.counts, (std::vector<size_t>{0, 0, 0, 0}));
  EXPECT_TRUE(spare.pieces.empty());  // ... and holds no element: [8, 9) is rank 2's (shards of 4)
  ExpectRoutesDeliver(table, 4, 2);
}

// A real model under the real chunk: the debug Llama's tensors are cut by the shard boundaries.
TEST(RouteMatrices, TheDebugLlamaUnderTheNormChunkOnOneToFiveRanks) {
  Config config = Config::Defaults();
  config.ApplyOverride("model.flavor=debug");
  const ParameterTable table = LlamaParameterTable(BuildLlamaConfig(config));
  for (int world = 1; world <= 5; ++world)
    ExpectRoutesDeliver(table, world, DataParallel::kNormChunk);
}

TEST(RouteMatrices, RefusesOwnersThatDoNotFitTheTableOrTheRanks) {
  const ParameterTable table = TableOfSizes({3, 2});
  EXPECT_THROW(RouteMatrices(table, {0}, ShardLayout(5, 2, 0, 1)), Error);
  EXPECT_THROW(RouteMatrices(table, {0, 2}, ShardLayout(5, 2, 0, 1)), Error);
  EXPECT_THROW(RouteMatrices(table, {0, 1}, ShardLayout(6, 2, 0, 1)), Error);
}

}  // namespace
}  // namespace crucible
