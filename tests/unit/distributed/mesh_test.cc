#include "distributed/mesh.h"

#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>

#include "common/error.h"

namespace crucible {
namespace {

// The message of the UsageError `build` throws ("" if it throws none, "other" for another error).
std::string UsageErrorOf(const std::function<void()>& build) {
  try {
    build();
  } catch (const Error& e) {
    return e.exit_code() == kExitUsage ? e.what() : "other";
  }
  return "";
}

TEST(MeshLayout, RanksAreRowMajorWithTheLastDimensionConsecutive) {
  // 2 data-parallel groups of 3 tensor-parallel ranks: rank = dp * 3 + tp.
  const MeshLayout layout({{"data_parallel", 2}, {"tensor_parallel", 3}}, 6);
  EXPECT_EQ(layout.size(), 6);
  const std::vector<std::vector<int>> expected = {{0, 0}, {0, 1}, {0, 2}, {1, 0}, {1, 1}, {1, 2}};
  for (int rank = 0; rank < 6; ++rank) {
    EXPECT_EQ(layout.Coordinates(rank), expected[rank]) << rank;
    EXPECT_EQ(layout.RankAt(expected[rank]), rank);
  }
  const int dp = layout.Find("data_parallel"), tp = layout.Find("tensor_parallel");
  EXPECT_EQ(layout.Group(4, tp), (std::vector<int>{3, 4, 5}));  // consecutive: one node
  EXPECT_EQ(layout.Group(4, dp), (std::vector<int>{1, 4}));
  EXPECT_EQ(layout.Group(0, dp), (std::vector<int>{0, 3}));
  EXPECT_EQ(layout.GroupIndex(4, tp), 1);  // the second tensor-parallel group
  EXPECT_EQ(layout.GroupIndex(4, dp), 1);  // the data-parallel group of tensor rank 1
  EXPECT_EQ(layout.GroupIndex(2, dp), 2);
}

TEST(MeshLayout, TheGroupsAlongADimensionPartitionTheRanksAndAgreeOnTheirIndex) {
  const MeshLayout layout({{"pipeline_parallel", 2}, {"data_parallel", 3}, {"tensor_parallel", 2}},
                          12);
  for (int d = 0; d < 3; ++d) {
    std::set<int> seen;
    std::set<int> indices;
    for (int rank = 0; rank < 12; ++rank) {
      const std::vector<int> group = layout.Group(rank, d);
      ASSERT_EQ(static_cast<int>(group.size()), layout.dimensions()[d].degree);
      // A rank's position in its group is its coordinate along the dimension, and every member
      // agrees on the group and its index.
      EXPECT_EQ(group[layout.Coordinates(rank)[d]], rank);
      for (int member : group) {
        EXPECT_EQ(layout.Group(member, d), group);
        EXPECT_EQ(layout.GroupIndex(member, d), layout.GroupIndex(rank, d));
      }
      if (group[0] == rank) {
        for (int member : group) EXPECT_TRUE(seen.insert(member).second) << member;
        indices.insert(layout.GroupIndex(rank, d));
      }
    }
    EXPECT_EQ(seen.size(), 12u);
    // Groups are numbered 0 .. count - 1.
    const int groups = 12 / layout.dimensions()[d].degree;
    EXPECT_EQ(static_cast<int>(indices.size()), groups);
    EXPECT_EQ(*indices.rbegin(), groups - 1);
  }
}

TEST(MeshLayout, MinusOneTakesTheRanksTheOtherDegreesLeave) {
  const MeshLayout layout({{"data_parallel", -1}, {"tensor_parallel", 2}}, 8);
  EXPECT_EQ(layout.dimensions()[0].degree, 4);
  EXPECT_EQ(layout.dimensions()[1].degree, 2);
  EXPECT_EQ(MeshLayout(MeshShape{}.Dimensions(), 5).dimensions()[0].degree, 5);
  EXPECT_EQ(MeshLayout(MeshShape{.data_parallel = 3}.Dimensions(), 3).dimensions()[0].degree, 3);
}

TEST(MeshLayout, DegreesThatDoNotMakeTheWorldAreAConfigErrorNamingThem) {
  EXPECT_EQ(UsageErrorOf([] {
              MeshLayout({{"data_parallel", 2}, {"tensor_parallel", 3}}, 4);
            }),
            "parallelism degrees (data_parallel=2, tensor_parallel=3) multiply to 6 ranks, but "
            "the job has 4");
  EXPECT_EQ(UsageErrorOf([] {
              MeshLayout({{"data_parallel", -1}, {"tensor_parallel", 3}}, 4);
            }),
            "parallelism degrees (data_parallel=-1, tensor_parallel=3) do not divide the job's 4 "
            "ranks");
  EXPECT_NE(UsageErrorOf([] {
              MeshLayout({{"data_parallel", -1}, {"tensor_parallel", -1}}, 4);
            }),
            "");
  EXPECT_NE(UsageErrorOf([] { MeshLayout({{"data_parallel", 0}}, 1); }), "");
  EXPECT_EQ(UsageErrorOf([] {
              MeshLayout({{"data_parallel", 2}, {"data_parallel", 2}}, 4);
            }),
            "other");
}

TEST(ProcessMesh, AProcessNotStartedByMpiIsAOneRankJobWhoseDataParallelGroupIsTheWorld) {
  if (ProcessMesh::LaunchedByMpi()) GTEST_SKIP() << "run under an MPI launcher";
  const std::unique_ptr<ProcessMesh> mesh = ProcessMesh::Create(MeshShape{}, 30);
  EXPECT_EQ(mesh->rank(), 0);
  EXPECT_EQ(mesh->world().size(), 1);
  EXPECT_EQ(&mesh->data_parallel(), &mesh->world());
  EXPECT_EQ(&mesh->tensor_parallel(), &mesh->world());  // one rank: every group is the world
  EXPECT_EQ(&mesh->expert_parallel(), &mesh->world());
  EXPECT_EQ(mesh->layout().dimensions()[0].degree, 1);
  // Expert parallelism between the replicas and tensor parallelism (consecutive ranks last).
  EXPECT_EQ(mesh->layout().dimensions()[1].name, "expert_parallel");
  EXPECT_EQ(mesh->layout().dimensions()[2].name, "tensor_parallel");
  mesh->SetStep(7);
  mesh->Finalize();
  mesh->Finalize();  // once is enough; again is harmless
  EXPECT_EQ(UsageErrorOf([] { ProcessMesh::Create(MeshShape{.data_parallel = 2}, 30); }),
            "parallelism degrees (data_parallel=2, expert_parallel=1, tensor_parallel=1) multiply "
            "to 2 ranks, but the job has 1");
}

}  // namespace
}  // namespace crucible
