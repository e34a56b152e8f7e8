#include "distributed/mesh.h"

#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <set>

#include "common/error.h"
#include "common/strings.h"
#include "distributed/mpi_handle.h"

namespace crucible {
namespace {

std::string DescribeDegrees(const std::vector<MeshDimension>& dimensions) {
  std::string out;
  for (const MeshDimension& d : dimensions)
    out += StrFormat("%s%s=%d", out.empty() ? "" : ", ", d.name.c_str(), d.degree);
  return out;
}

}  // namespace

MeshLayout::MeshLayout(std::vector<MeshDimension> dimensions, int world_size)
    : dimensions_(std::move(dimensions)) {
  if (dimensions_.empty()) throw Error(kExitFailure, "internal: a mesh needs a dimension");
  std::set<std::string> names;
  int inferred = -1;  // the dimension whose degree is -1
  int known = 1;      // product of the other degrees
  for (size_t d = 0; d < dimensions_.size(); ++d) {
    const MeshDimension& dimension = dimensions_[d];
    if (dimension.name.empty() || !names.insert(dimension.name).second)
      throw Error(kExitFailure, "internal: mesh dimension names must be distinct and non-empty");
    if (dimension.degree == -1 && inferred < 0) {
      inferred = static_cast<int>(d);
    } else if (dimension.degree < 1) {
      throw UsageError(
          StrFormat("parallelism degrees (%s): each must be a positive number of "
                    "ranks, and at most one -1 (all the ranks the others leave)",
                    DescribeDegrees(dimensions_).c_str()));
    } else {
      known *= dimension.degree;
    }
  }
  if (inferred >= 0) {
    if (world_size % known != 0)
      throw UsageError(StrFormat("parallelism degrees (%s) do not divide the job's %d ranks",
                                 DescribeDegrees(dimensions_).c_str(), world_size));
    dimensions_[inferred].degree = world_size / known;
  } else if (known != world_size) {
    throw UsageError(StrFormat("parallelism degrees (%s) multiply to %d ranks, but the job has %d",
                               DescribeDegrees(dimensions_).c_str(), known, world_size));
  }
  size_ = world_size;
  strides_.assign(dimensions_.size(), 1);
  for (size_t d = dimensions_.size() - 1; d > 0; --d)
    strides_[d - 1] = strides_[d] * dimensions_[d].degree;
}

int MeshLayout::Find(std::string_view name) const {
  for (size_t d = 0; d < dimensions_.size(); ++d)
    if (dimensions_[d].name == name) return static_cast<int>(d);
  throw Error(kExitFailure, "internal: the mesh has no dimension " + std::string(name));
}

std::vector<int> MeshLayout::Coordinates(int rank) const {
  if (rank < 0 || rank >= size_)
    throw Error(kExitFailure, StrFormat("internal: rank %d outside a mesh of %d", rank, size_));
  std::vector<int> coordinates(dimensions_.size());
  for (size_t d = 0; d < dimensions_.size(); ++d)
    coordinates[d] = rank / strides_[d] % dimensions_[d].degree;
  return coordinates;
}

int MeshLayout::RankAt(const std::vector<int>& coordinates) const {
  if (coordinates.size() != dimensions_.size())
    throw Error(kExitFailure, "internal: mesh coordinates of the wrong dimension");
  int rank = 0;
  for (size_t d = 0; d < dimensions_.size(); ++d) {
    if (coordinates[d] < 0 || coordinates[d] >= dimensions_[d].degree)
      throw Error(kExitFailure, "internal: mesh coordinate outside its dimension");
    rank += coordinates[d] * strides_[d];
  }
  return rank;
}

std::vector<int> MeshLayout::Group(int rank, int dimension) const {
  const int first = rank - Coordinates(rank)[dimension] * strides_[dimension];
  std::vector<int> ranks;
  for (int i = 0; i < dimensions_[dimension].degree; ++i)
    ranks.push_back(first + i * strides_[dimension]);
  return ranks;
}

int MeshLayout::GroupIndex(int rank, int dimension) const {
  const std::vector<int> coordinates = Coordinates(rank);
  int index = 0;  // row-major over the other dimensions
  for (size_t d = 0; d < dimensions_.size(); ++d)
    if (static_cast<int>(d) != dimension) index = index * dimensions_[d].degree + coordinates[d];
  return index;
}

std::vector<MeshDimension> MeshShape::Dimensions() const {
  return {{kDataParallel, data_parallel},
          {kExpertParallel, expert_parallel},
          {kTensorParallel, tensor_parallel}};
}

bool ProcessMesh::LaunchedByMpi() {
  for (const char* name :
       {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(name)) return true;
  return false;
}

std::unique_ptr<ProcessMesh> ProcessMesh::Create(const MeshShape& shape, double timeout_seconds) {
  return Create(shape.Dimensions(), timeout_seconds);
}

std::unique_ptr<ProcessMesh> ProcessMesh::Create(const std::vector<MeshDimension>& dimensions,
                                                 double timeout_seconds) {
  if (!LaunchedByMpi()) {
    std::unique_ptr<ProcessMesh> mesh(
        new ProcessMesh(MeshLayout(dimensions, 1), Communicator::OneRank()));
    mesh->CreateGroups(timeout_seconds);
    return mesh;
  }
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized || finalized)
    throw Error(kExitFailure, "internal: one ProcessMesh per process (MPI started already)");
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    throw Error(kExitFailure, "MPI_Init_thread failed on host " + Communicator::OneRank()->host());
  int job_rank = 0, world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &job_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  // A binary built against one MPI and started by another's launcher runs as N unconnected
  // single-rank jobs that would all write the same run directory.
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    const char* value = std::getenv(name);
    if (value && std::atoi(value) > 1 && world_size == 1)
      throw UsageError(StrFormat(
          "the launcher started %s ranks (%s) but MPI sees a world of 1: this crucible was built "
          "against another MPI (use the launcher of the MPI it links, e.g. mpiexec.mpich for "
          "build-mpich/crucible)",
          value, name));
  }
  auto world =
      std::make_unique<Communicator>(MpiHandle{MPI_COMM_WORLD, false}, job_rank, timeout_seconds);
  std::unique_ptr<ProcessMesh> mesh(
      new ProcessMesh(MeshLayout(dimensions, world_size), std::move(world)));
  mesh->mpi_ = true;
  mesh->CreateGroups(timeout_seconds);
  return mesh;
}

ProcessMesh::ProcessMesh(MeshLayout layout, std::unique_ptr<Communicator> world)
    : layout_(std::move(layout)), world_(std::move(world)) {}

namespace {

// Job ranks as runs: "0-3", "0,2", "0-1,4-5".
std::string RankRuns(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += j > i ? StrFormat("%d-%d", ranks[i], ranks[j]) : StrFormat("%d", ranks[i]);
    i = j + 1;
  }
  return out;
}

}  // namespace

void ProcessMesh::CreateGroups(double timeout_seconds) {
  const int rank = world_->rank();
  std::vector<int> everyone(static_cast<size_t>(layout_.size()));
  for (int r = 0; r < layout_.size(); ++r) everyone[static_cast<size_t>(r)] = r;
  world_->SetGroupName("world: job ranks " + RankRuns(everyone));
  for (size_t d = 0; d < layout_.dimensions().size(); ++d) {
    const int degree = layout_.dimensions()[d].degree;
    const std::string& dimension = layout_.dimensions()[d].name;
    // The job ranks of this rank's group along the dimension, which a timeout names.
    std::vector<int> members = layout_.Group(rank, static_cast<int>(d));
    std::sort(members.begin(), members.end());
    if (degree == layout_.size()) {
      world_->SetGroupName("world = " + dimension + " group: job ranks " + RankRuns(members));
      groups_.push_back(world_.get());
      continue;
    }
    // Not the world, so MPI runs: a group of one needs no new MPI communicator.
    MpiHandle handle{MPI_COMM_SELF, false};
    if (degree > 1) {
      // Collective over the world, at start, when every rank reaches it together.
      MPI_Comm_split(MPI_COMM_WORLD, layout_.GroupIndex(rank, static_cast<int>(d)),
                     layout_.Coordinates(rank)[d], &handle.comm);
      handle.owned = true;
    }
    split_.push_back(std::make_unique<Communicator>(handle, rank, timeout_seconds));
    split_.back()->SetGroupName(dimension + " group: job ranks " + RankRuns(members));
    groups_.push_back(split_.back().get());
  }
}

ProcessMesh::~ProcessMesh() {
  if (std::uncaught_exceptions() == 0) Finalize();
}

Communicator& ProcessMesh::group(std::string_view dimension) {
  return *groups_[layout_.Find(dimension)];
}

void ProcessMesh::SetStep(int64_t step) {
  world_->SetStep(step);
  for (auto& group : split_) group->SetStep(step);
}

void ProcessMesh::Finalize() {
  for (auto& group : split_) group->ReleaseMpi();
  world_->ReleaseMpi();
  if (!mpi_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
  mpi_ = false;
}

std::vector<ConsecutiveGroup> ConsecutiveGroups(const std::vector<std::string>& hosts,
                                                int group_size) {
  std::vector<ConsecutiveGroup> groups;
  const int ranks = static_cast<int>(hosts.size());
  for (int first = 0; first < ranks; first += std::max(1, group_size)) {
    ConsecutiveGroup group;
    group.first = first;
    group.last = std::min(ranks, first + std::max(1, group_size)) - 1;
    for (int r = first; r <= group.last; ++r)
      if (std::find(group.hosts.begin(), group.hosts.end(), hosts[r]) == group.hosts.end())
        group.hosts.push_back(hosts[r]);
    groups.push_back(std::move(group));
  }
  return groups;
}

}  // namespace crucible
