// A group of ranks that run collectives together: the whole job (ProcessMesh::world()) or one
// parallelism dimension of it (ProcessMesh::data_parallel(); tensor-, expert- or pipeline-parallel
// groups are split from the world the same way, distributed/mesh.h). A communicator wraps one MPI
// communicator, or none: a one-rank communicator that never touches MPI (a process not started by
// an MPI launcher, a unit test).
//
// Every collective is issued non-blocking and waited for with a deadline (the timeout given at
// construction, [comm] train_timeout_seconds): a rank stuck longer prints which collective at
// which step it was waiting for, on which host, and aborts the whole job instead of hanging until
// the walltime runs out. Every rank of the group must start the same collectives in the same
// order. On one rank every collective is a copy (or nothing) and no MPI function is called.
//
// Ownership: ProcessMesh creates and owns a job's communicators and frees their MPI objects before
// MPI_Finalize; everyone else is handed a reference. A communicator keeps all its state itself
// (its 128-bit datatype and exact sum, its operations in flight, its handles): two communicators
// share nothing, not even over the same MPI communicator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace crucible {

// inout[i] += in[i] for `count` 48-bit little-endian two's-complement integers (6 bytes each),
// modulo 2^48 (the callers leave headroom, so it never wraps): the MPI_Op that sums the narrow
// wire of block48 (exact_group_sum.h). Public for its test.
void AddInt48(const unsigned char* in, unsigned char* inout, size_t count);

struct MpiHandle;  // the MPI communicator a Communicator wraps (distributed/mpi_handle.h)

// The element types the typed collectives (all-to-all) move; communicator.cc instantiates each.
// Fixed-point exact sums travel as __int128, activations and their gradients as float, anything
// else (bf16, packed records) as bytes.
template <typename T>
inline constexpr bool kCommunicable =
    std::is_same_v<T, std::byte> || std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t> ||
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, __int128>;

class Communicator {
 public:
  // One rank, no MPI: every collective is a local copy (and nothing ever waits).
  static std::unique_ptr<Communicator> OneRank();
  // Over an MPI communicator (ProcessMesh creates these). `job_rank`: this process's rank in the
  // whole job, which the timeout and abort messages name.
  Communicator(const MpiHandle& handle, int job_rank, double timeout_seconds);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }  // in this group, 0 .. size() - 1
  int size() const { return size_; }
  bool distributed() const { return size_ > 1; }
  const std::string& host() const { return host_; }
  // The step named in timeout messages (ProcessMesh::SetStep sets it on every communicator).
  void SetStep(int64_t step) { step_ = step; }
  // The group a timeout message names, e.g. "tensor_parallel group: job ranks 0-1" (ProcessMesh
  // names each group it creates; "world" until then).
  const std::string& group_name() const { return group_name_; }
  void SetGroupName(std::string name) { group_name_ = std::move(name); }

  // Exact sums of 128-bit integers (order-independent: integer addition is associative).
  void AllReduceInt128(__int128* data, size_t count, const char* what);
  // Every rank contributes size() blocks of `count` elements, in place; on return data[0, count)
  // holds the exact sum of this rank's block.
  void ReduceScatterInt128InPlace(__int128* data, size_t count, const char* what);
  void AllReduceInt64(int64_t* data, size_t count, const char* what);
  // Element-wise maximum of bytes (the shared exponents of exact sums, exact_group_sum.h).
  void AllReduceMaxBytes(uint8_t* data, size_t count, const char* what);
  void AllReduceOr(bool* flag, const char* what);
  // Rank r contributes `count` values; everyone receives all size()*count in rank order.
  void AllGatherFloat(const float* send, float* receive, size_t count, const char* what);
  void AllGatherDouble(const double* send, double* receive, size_t count, const char* what);
  void AllGatherU64(const uint64_t* send, uint64_t* receive, size_t count, const char* what);
  // Rank r contributes `count` floats; rank 0 receives all size()*count in rank order (`receive`
  // is ignored elsewhere).
  void GatherFloatToRoot(const float* send, float* receive, size_t count, const char* what);

  // Non-blocking collectives for overlapping communication with computation. Start* returns a
  // handle; Test() lets MPI make progress and reports completion; WaitFor() blocks with the
  // collective deadline. The buffers must stay untouched until the operation completes (the
  // counts are kept by the communicator).
  using Handle = int64_t;  // never reused by this communicator; -1 for one that needed no MPI
  // Per-rank blocks of a buffer: rank r's block is [offsets[r], offsets[r] + counts[r]) elements.
  struct Blocks {
    std::vector<size_t> counts, offsets;
    // Consecutive blocks of these sizes, from offset 0.
    static Blocks Packed(std::vector<size_t> counts);
    size_t total() const;  // elements up to the end of the last block
  };
  // In place over `buffer`: this rank's block is already there; on completion every block is.
  Handle StartAllGatherV(float* buffer, const Blocks& blocks, const char* what);
  // `send` holds consecutive blocks of counts[0], counts[1], ... elements; rank r receives the
  // exact sum of block r in `receive` (counts[rank] elements), which must not overlap `send`:
  // MPICH 4.0.2 aborts on an in-place MPI_Ireduce_scatter whose block for rank > 0 starts at
  // offset 0.
  Handle StartReduceScatterInt128(const __int128* send, __int128* receive,
                                  const std::vector<size_t>& counts, const char* what);
  Handle StartAllReduceInt128(__int128* data, size_t count, const char* what);
  // The element-wise maximum of every rank's bytes, in place (count within one MPI count).
  Handle StartAllReduceMaxBytes(uint8_t* data, size_t count, const char* what);
  // The same sums for narrow two's-complement integers of `width` bytes (4, or 6: 48 bits,
  // little-endian), which the caller guarantees cannot overflow (ExactGroupSum).
  Handle StartAllReduceNarrow(void* data, size_t count, int width, const char* what);
  Handle StartReduceScatterNarrow(const void* send, void* receive,
                                  const std::vector<size_t>& counts, int width, const char* what);
  // All-to-all: `send` holds size() blocks of `count` elements, block q for rank q; on completion
  // block q of `receive` holds what rank q sent to this rank. The buffers must not overlap.
  template <typename T>
  Handle StartAllToAll(const T* send, T* receive, size_t count, const char* what);
  // All-to-all with a size per pair of ranks: rank q receives block q of `send` (send_blocks),
  // and what rank q sent to this rank lands in block q of `receive` (receive_blocks), whose size
  // must be what q sends (exchange the counts first with an all-to-all of one int64 each).
  template <typename T>
  Handle StartAllToAllV(const T* send, const Blocks& send_blocks, T* receive,
                        const Blocks& receive_blocks, const char* what);
  bool Test(Handle handle);
  void WaitFor(Handle handle);
  // Blocking forms: Start, then WaitFor.
  template <typename T>
  void AllToAll(const T* send, T* receive, size_t count, const char* what) {
    WaitFor(StartAllToAll(send, receive, count, what));
  }
  template <typename T>
  void AllToAllV(const T* send, const Blocks& send_blocks, T* receive, const Blocks& receive_blocks,
                 const char* what) {
    WaitFor(StartAllToAllV(send, send_blocks, receive, receive_blocks, what));
  }

  // Gathers variable-length strings (host names) to every rank.
  std::vector<std::string> AllGatherString(const std::string& value, const char* what);
  // Rank `root`'s *value, of any length, to every rank.
  void BroadcastString(std::string* value, int root, const char* what);
  void Barrier(const char* what);
  // Aborts every rank of the job (MPI_COMM_WORLD, whichever group this is) with `exit_code`
  // after printing `message` (this rank only).
  [[noreturn]] void Abort(const std::string& message, int exit_code);

 private:
  friend class ProcessMesh;
  struct Mpi;      // the MPI communicator, datatypes and operations in flight (communicator.cc)
  struct Pending;  // one operation in flight
  Communicator();
  // Frees the MPI objects (before MPI_Finalize); the communicator is one rank without MPI after.
  void ReleaseMpi();
  // More than one rank and MPI running: the collectives communicate.
  bool communicates() const { return mpi_ != nullptr && size_ > 1; }
  // Registers an operation in flight: sets *handle; MPI puts its request in the result.
  Pending& NewOperation(const char* what, Handle* handle);
  void Wait(void* request, const char* what);
  std::unique_ptr<Mpi> mpi_;  // null: one rank without MPI
  int rank_ = 0, size_ = 1, job_rank_ = 0;
  std::string host_;
  double timeout_seconds_ = 0;
  int64_t step_ = 0;
  std::string group_name_ = "world";
};

}  // namespace crucible
