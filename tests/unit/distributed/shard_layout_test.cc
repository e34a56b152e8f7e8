// The ZeRO shard arithmetic (distributed/shard_layout.h) for every world size from 1 to 5, and
// DataParallel on one rank.
#include "distributed/shard_layout.h"

#include <gtest/gtest.h>

#include <vector>

#include "common/error.h"
#include "distributed/data_parallel.h"

namespace crucible {
namespace {

constexpr size_t kChunk = 4;

TEST(ShardLayout, ShardsAreTheFewestWholeChunksThatCoverTheParameters) {
  for (int world = 1; world <= 5; ++world) {
    for (size_t n : {1, 3, 4, 5, 7, 17, 23, 41, 99}) {
      const ShardLayout layout(n, world, 0, kChunk);
      const size_t chunks = (n + kChunk - 1) / kChunk;
      const size_t shard_chunks = (chunks + world - 1) / world;
      EXPECT_EQ(layout.shard_size(), shard_chunks * kChunk) << n << " on " << world;
      EXPECT_EQ(layout.padded_size(), layout.shard_size() * world);
      EXPECT_GE(layout.padded_size(), n);
      // One chunk fewer per rank would not cover them.
      EXPECT_LT((shard_chunks - 1) * kChunk * world, n);
    }
  }
}

TEST(ShardLayout, TheRanksOwnConsecutiveShardsThatTileTheParameters) {
  for (int world = 1; world <= 5; ++world) {
    for (size_t n : {1, 3, 5, 7, 17, 23, 41, 99}) {
      size_t next = 0;
      for (int rank = 0; rank < world; ++rank) {
        const ShardLayout layout(n, world, rank, kChunk);
        const Range owned = layout.Owned();
        EXPECT_EQ(owned, layout.Owned(rank));
        EXPECT_EQ(layout.shard_begin(), rank * layout.shard_size());
        EXPECT_EQ(owned.begin, std::min(n, layout.shard_begin())) << n << " rank " << rank;
        EXPECT_EQ(owned.begin, next);
        EXPECT_LE(owned.size(), layout.shard_size());
        next = owned.end;
      }
      EXPECT_EQ(next, n) << n << " on " << world;
    }
  }
}

TEST(ShardLayout, ARankWhoseShardIsPaddingOwnsNothing) {
  // 9 parameters are 3 chunks: 5 ranks get one chunk each, and ranks 3 and 4 only padding.
  const ShardLayout layout(9, 5, 0, kChunk);
  EXPECT_EQ(layout.shard_size(), 4u);
  EXPECT_EQ(layout.padded_size(), 20u);
  EXPECT_EQ(layout.Owned(2), (Range{8, 9}));
  EXPECT_EQ(layout.Owned(3), (Range{9, 9}));
  EXPECT_EQ(layout.Owned(4), (Range{9, 9}));
  EXPECT_EQ(layout.Owned(4).size(), 0u);
}

TEST(ShardLayout, AUnitsPartsAreItsIntersectionWithEachShard) {
  // 23 parameters on 3 ranks: shards of 8, [0, 8) [8, 16) [16, 24).
  const ShardLayout layout(23, 3, 1, kChunk);
  const Communicator::Blocks parts = layout.Parts(6, 19);
  EXPECT_EQ(parts.counts, (std::vector<size_t>{2, 8, 3}));
  EXPECT_EQ(parts.offsets, (std::vector<size_t>{0, 2, 10}));
  EXPECT_EQ(parts.total(), 13u);
  EXPECT_EQ(layout.PartIn(1, 6, 19), (Range{8, 16}));
  // A unit inside one shard: the other parts are empty, at offset 0.
  const Communicator::Blocks inside = layout.Parts(9, 12);
  EXPECT_EQ(inside.counts, (std::vector<size_t>{0, 3, 0}));
  EXPECT_EQ(inside.offsets, (std::vector<size_t>{0, 0, 0}));
  EXPECT_EQ(layout.PartIn(2, 9, 12), Range{});
}

TEST(DataParallel, OnOneRankEveryStageUpdatesEveryParameterOfPaddedBuffers) {
  const std::unique_ptr<Communicator> comm = Communicator::OneRank();
  const size_t n = 3 * DataParallel::kNormChunk + 5;
  for (int stage : {0, 1, 3}) {
    DataParallel data_parallel(*comm, n, stage);
    EXPECT_EQ(data_parallel.padded_size(), 4 * DataParallel::kNormChunk);
    EXPECT_EQ(data_parallel.shard_size(), data_parallel.padded_size());
    EXPECT_EQ(data_parallel.shard_begin(), 0u);
    EXPECT_EQ(data_parallel.update_begin(), 0u);
    EXPECT_EQ(data_parallel.update_end(), n);
    EXPECT_EQ(data_parallel.CommunicatedBytesPerStep(4), 0u);
  }
  EXPECT_THROW({ DataParallel unsupported(*comm, n, 2); }, Error);
}

TEST(DataParallel, OnOneRankTheReducedGradientIsTheAccumulatedSum) {
  const std::unique_ptr<Communicator> comm = Communicator::OneRank();
  const size_t n = DataParallel::kNormChunk + 3;
  std::vector<float> micro_batch(n);
  for (size_t i = 0; i < n; ++i) micro_batch[i] = 0.001f * static_cast<float>(i) - 1.0f;
  for (int stage : {0, 1}) {
    DataParallel data_parallel(*comm, n, stage);
    ExactAccumulator accumulator(data_parallel.padded_size());
    accumulator.Zero();
    ASSERT_TRUE(accumulator.AddRange(0, n, micro_batch.data()));
    ASSERT_TRUE(accumulator.AddRange(0, n, micro_batch.data()));
    std::vector<float> grads(data_parallel.padded_size(), -7.0f);
    data_parallel.ReduceGradients(accumulator, grads.data());
    double squares = 0;
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(grads[i], 2 * micro_batch[i]) << i;  // doubling is exact
      squares += static_cast<double>(grads[i]) * grads[i];
    }
    EXPECT_NEAR(data_parallel.GradNormSquared(grads.data()), squares, 1e-9 * squares);
  }
}

}  // namespace
}  // namespace crucible
