// The ranks of a job laid out over the parallelism dimensions, and the communicator of each.
//
// MeshLayout is the arithmetic: named dimensions with their degrees, row-major with the last
// dimension varying fastest, so that the ranks of one group along the last dimension are
// consecutive (one node, where launchers place consecutive ranks). ProcessMesh is the job: it
// owns MPI's lifetime (MPI_Init_thread when an MPI launcher started this process, MPI_Finalize
// once) and one communicator per dimension. A process not started by an MPI launcher is a
// one-rank job that never touches MPI.
//
// The trainer's dimensions are data parallelism (the replicas of the same parameters), expert
// parallelism (ranks that split the experts between them and read different data: with the
// data-parallel ranks they are the ranks of different micro-batches) and, last in the rank order
// so that its groups are consecutive ranks (one node), tensor parallelism. A later dimension is
// added in one place: a field of MeshShape, its entry in MeshShape::Dimensions() (the position
// gives its place in the rank order), and an accessor like data_parallel(). Its groups are then
// split from the world with MPI_Comm_split by ProcessMesh (tests/mpi/ runs 2 x 2 and 1 x 4
// layouts).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "distributed/communicator.h"

namespace crucible {

struct MeshDimension {
  std::string name;  // e.g. "data_parallel"
  int degree = 1;    // ranks per group along this dimension; -1: whatever the others leave
};

class MeshLayout {
 public:
  // The layout of `dimensions` over `world_size` ranks. At most one degree may be -1 (it takes
  // world_size / the product of the others); throws UsageError unless the degrees are positive
  // and multiply to world_size, naming each degree.
  MeshLayout(std::vector<MeshDimension> dimensions, int world_size);

  const std::vector<MeshDimension>& dimensions() const { return dimensions_; }
  int size() const { return size_; }
  // The index of the dimension called `name`; throws Error if there is none.
  int Find(std::string_view name) const;
  // Rank r's coordinate along each dimension (r = sum of coordinate[d] * stride[d]).
  std::vector<int> Coordinates(int rank) const;
  int RankAt(const std::vector<int>& coordinates) const;
  // The ranks of `rank`'s group along `dimension` (the same coordinates elsewhere), in the order
  // of their coordinate along it, which is their rank in the group.
  std::vector<int> Group(int rank, int dimension) const;
  // Which group along `dimension` `rank` belongs to, numbered 0, 1, ... (MPI_Comm_split's color).
  int GroupIndex(int rank, int dimension) const;

 private:
  std::vector<MeshDimension> dimensions_;
  std::vector<int> strides_;
  int size_ = 1;
};

// The groups of `group_size` consecutive ranks (the mesh's tensor-parallel groups; the last may
// be short) of a job whose rank r runs on hosts[r], each with the hosts it spans in rank order.
// crucible launch --tp (from its node list) and crucible train (from its ranks' host names)
// both warn of a group that spans hosts from these.
struct ConsecutiveGroup {
  int first = 0, last = 0;         // job ranks
  std::vector<std::string> hosts;  // distinct, in rank order
};
std::vector<ConsecutiveGroup> ConsecutiveGroups(const std::vector<std::string>& hosts,
                                                int group_size);

// The degrees of the dimensions the trainer knows. -1 takes what the other degrees leave.
struct MeshShape {
  int data_parallel = -1;   // ranks that hold the same parameters (replicas)
  int expert_parallel = 1;  // ranks that split the experts between them (and read other data)
  int tensor_parallel = 1;
  std::vector<MeshDimension> Dimensions() const;  // in rank order, outermost first
};

inline constexpr char kDataParallel[] = "data_parallel";
inline constexpr char kTensorParallel[] = "tensor_parallel";
inline constexpr char kExpertParallel[] = "expert_parallel";

class ProcessMesh {
 public:
  // The mesh of this process's job: initialises MPI when an MPI launcher started the process,
  // lays `shape` over the world (UsageError when the degrees do not multiply to the world size)
  // and creates each dimension's communicator. `timeout_seconds`: the collective deadline of
  // every communicator. One mesh per process: MPI cannot start twice.
  static std::unique_ptr<ProcessMesh> Create(const MeshShape& shape, double timeout_seconds);
  // The same for any named dimensions (the ones MeshShape does not know yet; tests).
  static std::unique_ptr<ProcessMesh> Create(const std::vector<MeshDimension>& dimensions,
                                             double timeout_seconds);
  // Finalize(), unless an exception is unwinding: then MPI is left for the process exit to tear
  // down, because MPI_Finalize could wait for ranks that are still inside a collective.
  ~ProcessMesh();
  ProcessMesh(const ProcessMesh&) = delete;
  ProcessMesh& operator=(const ProcessMesh&) = delete;

  // True when the environment shows an MPI launcher started this process (OMPI_COMM_WORLD_SIZE,
  // PMI_SIZE, PMIX_RANK, PMI_RANK or MPI_LOCALNRANKS is set).
  static bool LaunchedByMpi();

  const MeshLayout& layout() const { return layout_; }
  int rank() const { return world_->rank(); }  // in the job
  // Every rank of the job (agreement, barriers, the checkpoint writer's gathers).
  Communicator& world() { return *world_; }
  // This rank's group along `dimension` (by name, as in the layout). A group that spans the
  // world is world() itself; a group of one rank communicates nothing.
  Communicator& group(std::string_view dimension);
  Communicator& data_parallel() { return group(kDataParallel); }
  Communicator& tensor_parallel() { return group(kTensorParallel); }
  Communicator& expert_parallel() { return group(kExpertParallel); }

  // The step the communicators name in timeout messages.
  void SetStep(int64_t step);
  // Frees every communicator's MPI objects and finalises MPI (once; nothing without MPI). The
  // communicators stay valid as one-rank objects that no longer communicate.
  void Finalize();

 private:
  ProcessMesh(MeshLayout layout, std::unique_ptr<Communicator> world);
  void CreateGroups(double timeout_seconds);
  MeshLayout layout_;
  std::unique_ptr<Communicator> world_;
  std::vector<std::unique_ptr<Communicator>> split_;  // groups that are neither world nor one rank
  std::vector<Communicator*> groups_;                 // by dimension
  bool mpi_ = false;
};

}  // namespace crucible
