#include "distributed/communicator.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <unordered_map>

#include "common/error.h"
#include "common/strings.h"

namespace crucible {
namespace {

MPI_Datatype g_int128_type = MPI_DATATYPE_NULL;
MPI_Op g_int128_sum = MPI_OP_NULL;

void SumInt128(void* in, void* inout, int* count, MPI_Datatype*) {
  const __int128* a = static_cast<const __int128*>(in);
  __int128* b = static_cast<__int128*>(inout);
  for (int i = 0; i < *count; ++i) b[i] += a[i];
}

std::string Hostname() {
  char name[256] = {0};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

// MPI counts are int: large buffers go in pieces of at most this many elements.
constexpr size_t kMaxCount = size_t{1} << 28;

// Non-blocking operations in flight, by handle (the communicator is a process-wide singleton).
// Handles are never reused: a completed operation is erased, and testing or waiting for a handle
// that is gone reports it complete.
struct Pending {
  MPI_Request request = MPI_REQUEST_NULL;
  const char* what = "";
};
std::unordered_map<int64_t, Pending> g_pending;  // element addresses are stable
int64_t g_next_handle = 0;

// Registers a new operation: sets *handle, returns where MPI puts its request.
MPI_Request* NewRequest(const char* what, int64_t* handle) {
  *handle = g_next_handle++;
  return &g_pending.emplace(*handle, Pending{MPI_REQUEST_NULL, what}).first->second.request;
}

}  // namespace

bool Communicator::LaunchedByMpi() {
  for (const char* name :
       {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(name)) return true;
  return false;
}

Communicator& Communicator::Get() {
  static Communicator communicator;
  return communicator;
}

Communicator::Communicator() : host_(Hostname()) {
  if (!LaunchedByMpi()) return;
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    throw Error(kExitFailure, "MPI_Init_thread failed on host " + host_);
  mpi_ = true;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_);
  // A binary built against one MPI and started by another's launcher runs as N unconnected
  // single-rank jobs that would all write the same run directory.
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    const char* value = std::getenv(name);
    if (value && std::atoi(value) > 1 && world_ == 1)
      throw UsageError(StrFormat(
          "the launcher started %s ranks (%s) but MPI sees a world of 1: this crucible was built "
          "against another MPI (use the launcher of the MPI it links, e.g. mpiexec.mpich for "
          "build-mpich/crucible)",
          value, name));
  }
  MPI_Type_contiguous(16, MPI_BYTE, &g_int128_type);
  MPI_Type_commit(&g_int128_type);
  MPI_Op_create(&SumInt128, /*commute=*/1, &g_int128_sum);
}

void Communicator::Wait(void* request_ptr, const char* what) {
  MPI_Request* request = static_cast<MPI_Request*>(request_ptr);
  auto start = std::chrono::steady_clock::now();
  int done = 0;
  int spins = 0;
  while (true) {
    MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > timeout_seconds_) {
      Abort(StrFormat("collective timeout: rank %d on host %s waited %.0f s in %s at step %lld "
                      "(comm.train_timeout_seconds = %.0f); another rank is dead or hung",
                      rank_, host_.c_str(), waited, what, (long long)step_, timeout_seconds_),
            kExitFailure);
    }
    if (++spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void Communicator::AllReduceInt128(__int128* data, size_t count, const char* what) {
  if (!mpi_ || world_ == 1) return;
  for (size_t done = 0; done < count; done += kMaxCount) {
    MPI_Request request;
    MPI_Iallreduce(MPI_IN_PLACE, data + done, static_cast<int>(std::min(kMaxCount, count - done)),
                   g_int128_type, g_int128_sum, MPI_COMM_WORLD, &request);
    Wait(&request, what);
  }
}

void Communicator::ReduceScatterInt128InPlace(__int128* data, size_t count, const char* what) {
  if (!mpi_ || world_ == 1) return;
  if (count > kMaxCount) throw Error(kExitFailure, "reduce-scatter block too large for MPI");
  MPI_Request request;
  MPI_Ireduce_scatter_block(MPI_IN_PLACE, data, static_cast<int>(count), g_int128_type,
                            g_int128_sum, MPI_COMM_WORLD, &request);
  Wait(&request, what);
}

void Communicator::AllReduceInt64(int64_t* data, size_t count, const char* what) {
  if (!mpi_ || world_ == 1) return;
  MPI_Request request;
  MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD,
                 &request);
  Wait(&request, what);
}

void Communicator::AllReduceOr(bool* flag, const char* what) {
  if (!mpi_ || world_ == 1) return;
  int value = *flag ? 1 : 0;
  MPI_Request request;
  MPI_Iallreduce(MPI_IN_PLACE, &value, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD, &request);
  Wait(&request, what);
  *flag = value != 0;
}

namespace {
// Every rank's `count` elements, in rank order, to every rank (root < 0) or to `root` only.
template <typename T>
void GatherImpl(bool mpi, int world, const T* send, T* receive, size_t count, MPI_Datatype type,
                const std::function<void(MPI_Request*)>& wait, int root = -1) {
  if (!mpi || world == 1) {
    if (send != receive) std::memcpy(receive, send, count * sizeof(T));
    return;
  }
  if (count > kMaxCount) throw Error(kExitFailure, "gather block too large for MPI");
  MPI_Request request;
  const int n = static_cast<int>(count);
  if (root < 0)
    MPI_Iallgather(send, n, type, receive, n, type, MPI_COMM_WORLD, &request);
  else
    MPI_Igather(send, n, type, receive, n, type, root, MPI_COMM_WORLD, &request);
  wait(&request);
}
}  // namespace

void Communicator::AllGatherFloat(const float* send, float* receive, size_t count,
                                  const char* what) {
  if (mpi_ && world_ > 1 && send == receive + rank_ * count) {  // this rank's block is in place
    if (count > kMaxCount) throw Error(kExitFailure, "all-gather block too large for MPI");
    MPI_Request request;
    MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, receive, static_cast<int>(count), MPI_FLOAT,
                   MPI_COMM_WORLD, &request);
    Wait(&request, what);
    return;
  }
  GatherImpl(mpi_, world_, send, receive, count, MPI_FLOAT, [&](MPI_Request* r) { Wait(r, what); });
}
void Communicator::AllGatherDouble(const double* send, double* receive, size_t count,
                                   const char* what) {
  GatherImpl(mpi_, world_, send, receive, count, MPI_DOUBLE,
             [&](MPI_Request* r) { Wait(r, what); });
}
void Communicator::AllGatherU64(const uint64_t* send, uint64_t* receive, size_t count,
                                const char* what) {
  GatherImpl(mpi_, world_, send, receive, count, MPI_UINT64_T,
             [&](MPI_Request* r) { Wait(r, what); });
}

void Communicator::GatherFloatToRoot(const float* send, float* receive, size_t count,
                                     const char* what) {
  GatherImpl(
      mpi_, world_, send, receive, count, MPI_FLOAT, [&](MPI_Request* r) { Wait(r, what); },
      /*root=*/0);
}

Communicator::Handle Communicator::StartAllGatherV(float* buffer, const std::vector<int>& counts,
                                                   const std::vector<int>& displs,
                                                   const char* what) {
  Handle handle = -1;
  if (mpi_ && world_ > 1)
    MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buffer, counts.data(), displs.data(),
                    MPI_FLOAT, MPI_COMM_WORLD, NewRequest(what, &handle));
  return handle;  // one rank: its block is the whole buffer, already in place
}

Communicator::Handle Communicator::StartReduceScatterInt128(const __int128* send, __int128* receive,
                                                            const std::vector<int>& counts,
                                                            const char* what) {
  Handle handle = -1;
  if (mpi_ && world_ > 1)
    MPI_Ireduce_scatter(send, receive, counts.data(), g_int128_type, g_int128_sum, MPI_COMM_WORLD,
                        NewRequest(what, &handle));
  else
    std::memcpy(receive, send, static_cast<size_t>(counts[0]) * sizeof(__int128));
  return handle;
}

Communicator::Handle Communicator::StartAllReduceInt128(__int128* data, size_t count,
                                                        const char* what) {
  if (count > kMaxCount) throw Error(kExitFailure, "all-reduce block too large for MPI");
  Handle handle = -1;
  if (mpi_ && world_ > 1)
    MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), g_int128_type, g_int128_sum,
                   MPI_COMM_WORLD, NewRequest(what, &handle));
  return handle;
}

bool Communicator::Test(Handle handle) {
  auto it = g_pending.find(handle);
  if (it == g_pending.end()) return true;
  int done = 0;
  MPI_Test(&it->second.request, &done, MPI_STATUS_IGNORE);
  if (done) g_pending.erase(it);
  return done != 0;
}

void Communicator::WaitFor(Handle handle) {
  auto it = g_pending.find(handle);
  if (it == g_pending.end()) return;
  Wait(&it->second.request, it->second.what);
  g_pending.erase(it);
}

std::vector<std::string> Communicator::AllGatherString(const std::string& value, const char* what) {
  constexpr size_t kWidth = 256;
  std::vector<char> send(kWidth, 0), receive(kWidth * world_, 0);
  std::memcpy(send.data(), value.data(), std::min(value.size(), kWidth - 1));
  if (mpi_ && world_ > 1) {
    MPI_Request request;
    MPI_Iallgather(send.data(), kWidth, MPI_CHAR, receive.data(), kWidth, MPI_CHAR, MPI_COMM_WORLD,
                   &request);
    Wait(&request, what);
  } else {
    receive = send;
  }
  std::vector<std::string> out;
  for (int r = 0; r < world_; ++r) out.emplace_back(receive.data() + r * kWidth);
  return out;
}

void Communicator::BroadcastString(std::string* value, int root, const char* what) {
  if (!mpi_ || world_ == 1) return;
  uint64_t length = value->size();
  MPI_Request request;
  MPI_Ibcast(&length, 1, MPI_UINT64_T, root, MPI_COMM_WORLD, &request);
  Wait(&request, what);
  value->resize(length);
  for (size_t done = 0; done < length; done += kMaxCount) {
    MPI_Ibcast(value->data() + done, static_cast<int>(std::min<size_t>(kMaxCount, length - done)),
               MPI_CHAR, root, MPI_COMM_WORLD, &request);
    Wait(&request, what);
  }
}

void Communicator::Barrier(const char* what) {
  if (!mpi_ || world_ == 1) return;
  MPI_Request request;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  Wait(&request, what);
}

void Communicator::Abort(const std::string& message, int exit_code) {
  std::fprintf(stderr, "crucible: error: %s\n", message.c_str());
  std::fflush(stderr);
  // Give the launcher's output forwarding time to carry the line before MPI_Abort tears the job
  // down (MPICH's Hydra lost it in about 4 runs of 100 without a pause): the launcher classifies
  // the failure from it.
  if (mpi_) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  if (mpi_) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

void Communicator::Finalize() {
  if (!mpi_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    MPI_Op_free(&g_int128_sum);
    MPI_Type_free(&g_int128_type);
    MPI_Finalize();
  }
  mpi_ = false;
}

}  // namespace crucible
