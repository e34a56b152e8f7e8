// The communicators under a real MPI launcher: `mpirun -np N test_mpi` (run by
// tests/integration/test_collectives.py). Every rank runs every test, so the collectives match;
// each test runs over the world and over every group of the mesh.
//
// CRUCIBLE_TEST_MESH lays the job out ("data_parallel=2,tensor_parallel=2"; default: data
// parallelism over the world) and CRUCIBLE_TEST_TIMEOUT sets the collective deadline (default
// 60 s). One test is disabled by default: it leaves rank 0 alone in an all-to-all until the
// deadline aborts the job.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/strings.h"
#include "distributed/mesh.h"

namespace crucible {

ProcessMesh* g_mesh = nullptr;  // the job's mesh, for every test file of this program

namespace {

std::vector<MeshDimension> TestMesh() {
  const char* spec = std::getenv("CRUCIBLE_TEST_MESH");
  if (!spec || !*spec) return MeshShape{}.Dimensions();
  std::vector<MeshDimension> dimensions;
  for (const std::string& item : Split(spec, ',')) {
    const size_t equals = item.find('=');
    dimensions.push_back({item.substr(0, equals), std::stoi(item.substr(equals + 1))});
  }
  return dimensions;
}

// The world first, then each dimension's group, with a name for failure messages.
std::vector<std::pair<std::string, Communicator*>> Communicators() {
  std::vector<std::pair<std::string, Communicator*>> out = {{"world", &g_mesh->world()}};
  for (const MeshDimension& d : g_mesh->layout().dimensions())
    out.push_back({d.name, &g_mesh->group(d.name)});
  return out;
}

TEST(Mesh, EachGroupHoldsTheRanksItsLayoutNames) {
  const MeshLayout& layout = g_mesh->layout();
  EXPECT_EQ(g_mesh->world().size(), layout.size());
  for (size_t d = 0; d < layout.dimensions().size(); ++d) {
    Communicator& group = g_mesh->group(layout.dimensions()[d].name);
    const uint64_t mine = static_cast<uint64_t>(g_mesh->rank());
    std::vector<uint64_t> members(group.size());
    group.AllGatherU64(&mine, members.data(), 1, "test member all-gather");
    const std::vector<int> expected = layout.Group(g_mesh->rank(), static_cast<int>(d));
    ASSERT_EQ(members.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i)
      EXPECT_EQ(members[i], static_cast<uint64_t>(expected[i])) << layout.dimensions()[d].name;
    EXPECT_EQ(group.rank(), layout.Coordinates(g_mesh->rank())[d]);
    // The name a timeout message gives the group: its dimension and its job ranks.
    const std::string& name = layout.dimensions()[d].name;
    if (group.size() == layout.size()) {
      EXPECT_EQ(&group, &g_mesh->world());  // a group that spans the world is the world
      EXPECT_EQ(group.group_name(),
                StrFormat("world = %s group: job ranks 0-%d", name.c_str(), layout.size() - 1));
    } else {
      EXPECT_EQ(group.group_name().rfind(name + " group: job ranks ", 0), 0u) << group.group_name();
    }
  }
  // On the 2 x 2 mesh, written out: consecutive ranks form a tensor-parallel group.
  if (layout.size() == 4 && layout.dimensions().size() == 2 && layout.dimensions()[0].degree == 2) {
    const int r = g_mesh->rank();
    EXPECT_EQ(
        g_mesh->group("tensor_parallel").group_name(),
        r < 2 ? "tensor_parallel group: job ranks 0-1" : "tensor_parallel group: job ranks 2-3");
    EXPECT_EQ(
        g_mesh->group("data_parallel").group_name(),
        r % 2 == 0 ? "data_parallel group: job ranks 0,2" : "data_parallel group: job ranks 1,3");
    EXPECT_EQ(g_mesh->world().group_name(), "world: job ranks 0-3");
  }
}

TEST(AllToAll, EveryRankReceivesTheBlockEachRankAddressedToIt) {
  for (auto [name, comm] : Communicators()) {
    const int n = comm->size(), r = comm->rank();
    std::vector<int64_t> send(2 * n), receive(2 * n, -1);
    for (int q = 0; q < n; ++q) {
      send[2 * q] = 1000 * r + q;
      send[2 * q + 1] = -send[2 * q];
    }
    comm->AllToAll(send.data(), receive.data(), 2, "test all-to-all");
    for (int q = 0; q < n; ++q) {
      EXPECT_EQ(receive[2 * q], 1000 * q + r) << name;
      EXPECT_EQ(receive[2 * q + 1], -(1000 * q + r)) << name;
    }
  }
}

TEST(AllToAll, Int128ValuesArriveWhole) {
  for (auto [name, comm] : Communicators()) {
    const int n = comm->size(), r = comm->rank();
    std::vector<__int128> send(n), receive(n, 0);
    for (int q = 0; q < n; ++q) send[q] = (static_cast<__int128>(r + 1) << 100) - q;
    comm->AllToAll(send.data(), receive.data(), 1, "test int128 all-to-all");
    for (int q = 0; q < n; ++q)
      EXPECT_TRUE(receive[q] == (static_cast<__int128>(q + 1) << 100) - r) << name << " " << q;
  }
}

// What rank `from` sends rank `to`: some pairs nothing, rank 0 nothing to itself.
size_t Count(int from, int to) {
  return static_cast<size_t>((from + 2 * to) % 3);
}
float Value(int from, int to, size_t i) {
  return 100.0f * from + to + 0.125f * i;
}

TEST(AllToAllV, BlocksOfEverySizeLandAtTheirOffsets) {
  for (auto [name, comm] : Communicators()) {
    const int n = comm->size(), r = comm->rank();
    std::vector<size_t> send_counts(n);
    for (int q = 0; q < n; ++q) send_counts[q] = Count(r, q);
    const Communicator::Blocks send_blocks = Communicator::Blocks::Packed(send_counts);
    std::vector<float> send(send_blocks.total());
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < send_counts[q]; ++i) send[send_blocks.offsets[q] + i] = Value(r, q, i);
    // The receiver learns its counts from the senders, the way expert parallelism would.
    std::vector<int64_t> counts_out(send_counts.begin(), send_counts.end()), counts_in(n);
    comm->AllToAll(counts_out.data(), counts_in.data(), 1, "test count exchange");
    // Receive blocks with a gap of one element before each, to see the offsets are honoured.
    Communicator::Blocks receive_blocks;
    size_t offset = 0;
    for (int q = 0; q < n; ++q) {
      ASSERT_EQ(counts_in[q], static_cast<int64_t>(Count(q, r))) << name;
      receive_blocks.counts.push_back(static_cast<size_t>(counts_in[q]));
      receive_blocks.offsets.push_back(offset + 1);
      offset += 1 + static_cast<size_t>(counts_in[q]);
    }
    std::vector<float> receive(offset, -1.0f);
    comm->AllToAllV(send.data(), send_blocks, receive.data(), receive_blocks, "test all-to-allv");
    for (int q = 0; q < n; ++q) {
      EXPECT_EQ(receive[receive_blocks.offsets[q] - 1], -1.0f) << name << " gap before " << q;
      for (size_t i = 0; i < Count(q, r); ++i)
        EXPECT_EQ(receive[receive_blocks.offsets[q] + i], Value(q, r, i)) << name << " " << q;
    }
  }
}

TEST(AllToAllV, OperationsInFlightTogetherCompleteInAnyOrder) {
  for (auto [name, comm] : Communicators()) {
    const int n = comm->size(), r = comm->rank();
    // Bytes: rank r sends q (q + 1) bytes of value r * 16 + q; the block lists are temporaries,
    // gone before the operation completes.
    std::vector<size_t> send_counts, receive_counts;
    for (int q = 0; q < n; ++q) {
      send_counts.push_back(static_cast<size_t>(q + 1));
      receive_counts.push_back(static_cast<size_t>(r + 1));
    }
    const Communicator::Blocks send_blocks = Communicator::Blocks::Packed(send_counts);
    std::vector<std::byte> bytes(send_blocks.total());
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i <= static_cast<size_t>(q); ++i)
        bytes[send_blocks.offsets[q] + i] = static_cast<std::byte>(r * 16 + q);
    std::vector<std::byte> bytes_in(static_cast<size_t>(n * (r + 1)));
    const Communicator::Handle first = comm->StartAllToAllV(
        bytes.data(), Communicator::Blocks::Packed(send_counts), bytes_in.data(),
        Communicator::Blocks::Packed(receive_counts), "test byte all-to-allv");
    std::vector<double> doubles(n), doubles_in(n);
    for (int q = 0; q < n; ++q) doubles[q] = 0.5 * r - q;
    const Communicator::Handle second =
        comm->StartAllToAll(doubles.data(), doubles_in.data(), 1, "test double all-to-all");
    if (comm->distributed()) {
      EXPECT_NE(first, second) << name;
    }
    comm->WaitFor(second);
    while (!comm->Test(first)) {
    }
    comm->WaitFor(first);  // a completed handle is complete
    for (int q = 0; q < n; ++q) {
      EXPECT_EQ(doubles_in[q], 0.5 * q - r) << name;
      for (int i = 0; i <= r; ++i)
        EXPECT_EQ(bytes_in[q * (r + 1) + i], static_cast<std::byte>(q * 16 + r)) << name;
    }
  }
}

TEST(Deadline, DISABLED_ARankLeftAloneInAnAllToAllAbortsTheJob) {
  g_mesh->SetStep(7);
  Communicator& world = g_mesh->world();
  if (world.rank() != 0) {  // never joins; the abort ends this process too
    std::this_thread::sleep_for(std::chrono::seconds(120));
    return;
  }
  std::vector<float> send(world.size()), receive(world.size());
  world.AllToAll(send.data(), receive.data(), 1, "test all-to-all");
  ADD_FAILURE() << "the all-to-all completed without the other ranks";
}

}  // namespace
}  // namespace crucible

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const char* timeout = std::getenv("CRUCIBLE_TEST_TIMEOUT");
  std::unique_ptr<crucible::ProcessMesh> mesh;
  try {
    mesh = crucible::ProcessMesh::Create(crucible::TestMesh(), timeout ? std::atof(timeout) : 60.0);
  } catch (const crucible::Error& e) {
    std::fprintf(stderr, "test_mpi: %s\n", e.what());
    return e.exit_code();
  }
  crucible::g_mesh = mesh.get();
  const int failed = RUN_ALL_TESTS();
  mesh->Finalize();
  return failed;
}
