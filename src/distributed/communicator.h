// The MPI communicator of a training job. A process started by an MPI launcher (mpirun, srun,
// mpiexec: detected from OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK or PMI_RANK) initialises MPI;
// any other process is a single-rank job that never touches MPI, so `crucible train` works both
// ways. Every collective is issued non-blocking and waited for with a deadline
// ([comm] train_timeout_seconds): a rank stuck longer than that prints which collective at which
// step it was waiting for, on which host, and aborts the whole job instead of hanging until the
// walltime runs out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace crucible {

class Communicator {
 public:
  // The process-wide communicator; initialises MPI on first use when launched by MPI.
  static Communicator& Get();
  // True when the environment shows an MPI launcher started this process.
  static bool LaunchedByMpi();

  int rank() const { return rank_; }
  int world() const { return world_; }
  bool distributed() const { return world_ > 1; }
  const std::string& host() const { return host_; }

  void SetTimeout(double seconds) { timeout_seconds_ = seconds; }
  void SetStep(int64_t step) { step_ = step; }

  // Exact sums of 128-bit integers (order-independent: integer addition is associative).
  void AllReduceInt128(__int128* data, size_t count, const char* what);
  // Every rank contributes world blocks of `count` elements, in place; on return data[0, count)
  // holds the exact sum of this rank's block.
  void ReduceScatterInt128InPlace(__int128* data, size_t count, const char* what);
  void AllReduceInt64(int64_t* data, size_t count, const char* what);
  void AllReduceOr(bool* flag, const char* what);
  // Rank r contributes `count` values; everyone receives all world*count in rank order.
  void AllGatherFloat(const float* send, float* receive, size_t count, const char* what);
  void AllGatherDouble(const double* send, double* receive, size_t count, const char* what);
  void AllGatherU64(const uint64_t* send, uint64_t* receive, size_t count, const char* what);
  // Rank r contributes `count` floats; rank 0 receives all world*count in rank order (`receive`
  // is ignored elsewhere).
  void GatherFloatToRoot(const float* send, float* receive, size_t count, const char* what);

  // Non-blocking collectives for overlapping communication with computation. Start* returns a
  // handle; Test() lets MPI make progress and reports completion; WaitFor() blocks with the
  // collective deadline. Every rank must start the same operations in the same order.
  using Handle = int64_t;  // never reused; -1 for an operation that needed no MPI
  // In place over `buffer`: rank r's block [displs[r], displs[r] + counts[r]) is already there.
  Handle StartAllGatherV(float* buffer, const std::vector<int>& counts,
                         const std::vector<int>& displs, const char* what);
  // `send` holds consecutive blocks of counts[0], counts[1], ... elements; rank r receives the
  // exact sum of block r.
  // `receive` (counts[rank] elements) must not overlap `send`: MPICH 4.0.2 aborts on an
  // in-place MPI_Ireduce_scatter whose block for rank > 0 starts at offset 0.
  Handle StartReduceScatterInt128(const __int128* send, __int128* receive,
                                  const std::vector<int>& counts, const char* what);
  Handle StartAllReduceInt128(__int128* data, size_t count, const char* what);
  bool Test(Handle handle);
  void WaitFor(Handle handle);

  // Gathers variable-length strings (host names) to every rank.
  std::vector<std::string> AllGatherString(const std::string& value, const char* what);
  // Rank `root`'s *value, of any length, to every rank.
  void BroadcastString(std::string* value, int root, const char* what);
  void Barrier(const char* what);
  // Aborts every rank of the job with `exit_code` after printing `message` (this rank only).
  [[noreturn]] void Abort(const std::string& message, int exit_code);
  void Finalize();

 private:
  Communicator();
  void Wait(void* request, const char* what);
  int rank_ = 0, world_ = 1;
  bool mpi_ = false;
  std::string host_;
  double timeout_seconds_ = 600;
  int64_t step_ = 0;
};

}  // namespace crucible
