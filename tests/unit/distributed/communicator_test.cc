// A one-rank communicator: every collective is a copy (or nothing), and no MPI function is
// called (these tests run without an MPI launcher; tests/mpi/ covers several ranks).
#include "distributed/communicator.h"

#include <gtest/gtest.h>

#include <vector>

#include "common/error.h"

namespace crucible {
namespace {

TEST(Communicator, OneRankIsRankZeroOfOne) {
  const std::unique_ptr<Communicator> comm = Communicator::OneRank();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_FALSE(comm->distributed());
  EXPECT_FALSE(comm->host().empty());
}

TEST(Communicator, OneRankCollectivesKeepOrCopyTheValues) {
  const std::unique_ptr<Communicator> comm = Communicator::OneRank();
  __int128 sums[2] = {__int128{1} << 100, -3};
  comm->AllReduceInt128(sums, 2, "test");
  EXPECT_TRUE(sums[0] == (__int128{1} << 100) && sums[1] == -3);
  int64_t count = 5;
  comm->AllReduceInt64(&count, 1, "test");
  EXPECT_EQ(count, 5);
  bool flag = true;
  comm->AllReduceOr(&flag, "test");
  EXPECT_TRUE(flag);
  const double values[2] = {1.5, -2.0};
  double gathered[2] = {};
  comm->AllGatherDouble(values, gathered, 2, "test");
  EXPECT_EQ(gathered[1], -2.0);
  EXPECT_EQ(comm->AllGatherString("host-a", "test"), std::vector<std::string>{"host-a"});
  comm->Barrier("test");
}

TEST(Communicator, OneRankNonBlockingOperationsAreCompleteAtOnce) {
  const std::unique_ptr<Communicator> comm = Communicator::OneRank();
  const __int128 send[3] = {7, 8, 9};
  __int128 receive[3] = {};
  const Communicator::Handle handle =
      comm->StartReduceScatterInt128(send, receive, {3}, "test reduce-scatter");
  EXPECT_EQ(handle, -1);
  EXPECT_TRUE(comm->Test(handle));
  comm->WaitFor(handle);
  EXPECT_TRUE(receive[2] == 9);
  float buffer[4] = {1, 2, 3, 4};
  EXPECT_EQ(comm->StartAllGatherV(buffer, Communicator::Blocks::Packed({4}), "test"), -1);
  EXPECT_EQ(buffer[3], 4.0f);
}

TEST(Communicator, PackedBlocksAreConsecutive) {
  const Communicator::Blocks blocks = Communicator::Blocks::Packed({3, 0, 5, 2});
  EXPECT_EQ(blocks.offsets, (std::vector<size_t>{0, 3, 3, 8}));
  EXPECT_EQ(blocks.total(), 10u);
  EXPECT_EQ(Communicator::Blocks::Packed({0, 0}).total(), 0u);
  // total() is where the last block ends, in any order of the blocks.
  EXPECT_EQ((Communicator::Blocks{{2, 3}, {5, 0}}).total(), 7u);
}

TEST(Communicator, OneRankAllToAllSendsItsOnlyBlockToItself) {
  const std::unique_ptr<Communicator> comm = Communicator::OneRank();
  const float send[2] = {0.25f, -1.0f};
  float receive[2] = {};
  comm->AllToAll(send, receive, 2, "test all-to-all");
  EXPECT_EQ(receive[0], 0.25f);
  EXPECT_EQ(receive[1], -1.0f);
  // All-to-allv: from offset 1 of send to offset 2 of receive.
  const __int128 values[4] = {1, __int128{1} << 90, 3, 4};
  __int128 landed[5] = {};
  comm->AllToAllV(values, Communicator::Blocks{{2}, {1}}, landed, Communicator::Blocks{{2}, {2}},
                  "test all-to-allv");
  EXPECT_TRUE(landed[1] == 0 && landed[2] == (__int128{1} << 90) && landed[3] == 3 &&
              landed[4] == 0);
}

TEST(Communicator, AllToAllVRefusesBlocksThatDoNotFit) {
  const std::unique_ptr<Communicator> comm = Communicator::OneRank();
  const std::byte send[2] = {};
  std::byte receive[2] = {};
  // A block per rank, and what a rank sends itself must be what it expects from itself.
  EXPECT_THROW(comm->AllToAllV(send, Communicator::Blocks::Packed({1, 1}), receive,
                               Communicator::Blocks::Packed({2}), "test"),
               Error);
  EXPECT_THROW(comm->AllToAllV(send, Communicator::Blocks::Packed({1}), receive,
                               Communicator::Blocks::Packed({2}), "test"),
               Error);
}

}  // namespace
}  // namespace crucible
