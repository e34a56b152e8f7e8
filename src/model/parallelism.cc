#include "model/parallelism.h"

#include <cstring>

#include "common/error.h"
#include "common/profile.h"
#include "common/strings.h"
#include "common/timer.h"
#include "compute/backend.h"
#include "distributed/communicator.h"

namespace crucible {
namespace {

bool PowerOfTwo(int n) {
  return n > 0 && (n & (n - 1)) == 0;
}

}  // namespace

ModelParallelism ModelParallelism::TensorParallel(Communicator& group, int tp_chunks) {
  ModelParallelism p = Layout(group.size(), group.rank(), tp_chunks);
  p.tensor_parallel = group.distributed() ? &group : nullptr;
  return p;
}

ModelParallelism ModelParallelism::Layout(int tp_degree, int tp_rank, int tp_chunks) {
  ModelParallelism p;
  p.tp_degree = tp_degree;
  p.tp_rank = tp_rank;
  p.tp_chunks = tp_chunks;
  return p;
}

std::string ModelParallelism::Check() const {
  if (!PowerOfTwo(tp_degree))
    return StrFormat("the tensor-parallel degree %d is not a power of two (1, 2, 4, 8, ...)",
                     tp_degree);
  if (!PowerOfTwo(tp_chunks) || tp_chunks % tp_degree != 0)
    return StrFormat(
        "the tensor-parallel chunks %d are not a power of two that the degree %d divides",
        tp_chunks, tp_degree);
  if (tp_rank < 0 || tp_rank >= tp_degree)
    return StrFormat("rank %d is not in a tensor-parallel group of %d", tp_rank, tp_degree);
  if (ep_degree < 1 || ep_rank < 0 || ep_rank >= ep_degree)
    return StrFormat("rank %d is not in an expert-parallel group of %d", ep_rank, ep_degree);
  if (sequence_parallel && tp_chunks == 1)
    return "parallelism.sequence_parallel = true splits the rows of a tensor-parallel model, and "
           "this run has none: set parallelism.tensor_parallel_degree > 1 (or "
           "tensor_parallel_chunks > 1), or turn sequence parallelism off";
  return "";
}

ModelParallelism ModelParallelism::WithExperts(Communicator& group) const {
  ModelParallelism p = *this;
  p.ep_degree = group.size();
  p.ep_rank = group.rank();
  p.expert_parallel = group.distributed() ? &group : nullptr;
  return p;
}

TensorParallelOps::TensorParallelOps(const ModelParallelism& parallelism, ComputeBackend& backend)
    : parallelism_(parallelism), backend_(backend) {
  if (std::string why = parallelism.Check(); !why.empty())
    throw Error(kExitFailure, "internal: " + why);
  if (parallelism.distributed() && !parallelism.tensor_parallel)
    throw Error(kExitFailure, "internal: a tensor-parallel model without its group");
}

void TensorParallelOps::TreeSum(float* const* partials, int count, size_t n) {
  for (int step = 1; step < count; step *= 2)
    for (int i = 0; i + step < count; i += 2 * step)
      backend_.Add(partials[i], partials[i + step], n);
}

namespace {

// The levels of the tree above the ranks' subtrees: `roots` holds `ranks` consecutive blocks of
// n floats, block 0 gets their sum (the same additions in the same order as the chunks' tree).
void SumRoots(float* roots, int ranks, size_t n) {
  for (int step = 1; step < ranks; step *= 2)
    for (int i = 0; i + step < ranks; i += 2 * step) {
      float* y = roots + static_cast<size_t>(i) * n;
      const float* x = roots + static_cast<size_t>(i + step) * n;
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < static_cast<int64_t>(n); ++j) y[j] += x[j];
    }
}

}  // namespace

void TensorParallelOps::SumChunks(float* const* partials, size_t n, const char* what) {
  // This rank's subtree: chunks [first, first + local) are an aligned, complete one.
  TreeSum(partials, parallelism_.chunks_per_rank(), n);
  if (!parallelism_.distributed()) return;
  // The roots of every rank's subtree, and the levels above them in the same order.
  const int ranks = parallelism_.tp_degree;
  float* roots = const_cast<float*>(AllGather(partials[0], n, what));
  ScopedKernelTimer profile_timer("tensor_parallel_sum", static_cast<double>(n) * (ranks - 1));
  SumRoots(roots, ranks, n);
  backend_.CopyToDevice(partials[0], roots, n * sizeof(float));
}

void TensorParallelOps::SumChunksScatter(float* const* partials, size_t n, float* out,
                                         const char* what) {
  TreeSum(partials, parallelism_.chunks_per_rank(), n);
  ScatterSum(partials[0], n, out, what);
}

void TensorParallelOps::ScatterSum(const float* root, size_t n, float* out, const char* what) {
  const int ranks = parallelism_.tp_degree;
  if (n % static_cast<size_t>(ranks) != 0)
    throw Error(kExitFailure,
                StrFormat("internal: %s: %zu floats do not split over %d ranks", what, n, ranks));
  const size_t block = n / static_cast<size_t>(ranks);
  if (!parallelism_.distributed()) {  // the whole sum is this rank's block
    if (backend_.host_memory()) {
      if (out != root) std::memcpy(out, root, n * sizeof(float));
      return;
    }
    send_.resize(n);
    backend_.CopyToHost(send_.data(), root, n * sizeof(float));
    backend_.CopyToDevice(out, send_.data(), n * sizeof(float));
    return;
  }
  // Block q of every rank's root to rank q; this rank adds the blocks it received in the tree.
  float* roots = const_cast<float*>(AllToAll(root, block, what));
  ScopedKernelTimer profile_timer("tensor_parallel_sum", static_cast<double>(block) * (ranks - 1));
  SumRoots(roots, ranks, block);
  backend_.CopyToDevice(out, roots, block * sizeof(float));
}

const float* TensorParallelOps::AllGather(const float* mine, size_t count, const char* what) {
  if (backend_.host_memory()) return AllGatherHost(mine, count, what);
  send_.resize(count);
  backend_.CopyToHost(send_.data(), mine, count * sizeof(float));
  return AllGatherHost(send_.data(), count, what);
}

const float* TensorParallelOps::AllGatherHost(const float* mine, size_t count, const char* what) {
  gathered_.resize(count * static_cast<size_t>(parallelism_.tp_degree));
  if (!parallelism_.distributed()) {
    std::memcpy(gathered_.data(), mine, count * sizeof(float));
    return gathered_.data();
  }
  const Timer timer;
  {
    ScopedKernelTimer profile_timer("tensor_parallel_exchange", 0,
                                    4.0 * count * parallelism_.tp_degree);
    parallelism_.tensor_parallel->AllGatherFloat(mine, gathered_.data(), count, what);
  }
  Count(static_cast<double>(count) * (parallelism_.tp_degree - 1), timer.Seconds());
  return gathered_.data();
}

void TensorParallelOps::AllGatherTo(const float* mine, size_t count, float* out, const char* what) {
  const size_t total = count * static_cast<size_t>(parallelism_.tp_degree);
  if (!backend_.host_memory() || !parallelism_.distributed()) {
    const float* all = AllGather(mine, count, what);
    backend_.CopyToDevice(out, all, total * sizeof(float));
    return;
  }
  const Timer timer;
  {
    ScopedKernelTimer profile_timer("tensor_parallel_exchange", 0, 4.0 * total);
    parallelism_.tensor_parallel->AllGatherFloat(mine, out, count, what);
  }
  Count(static_cast<double>(count) * (parallelism_.tp_degree - 1), timer.Seconds());
}

const float* TensorParallelOps::AllToAll(const float* send, size_t block, const char* what) {
  const size_t total = block * static_cast<size_t>(parallelism_.tp_degree);
  if (!backend_.host_memory()) {
    send_.resize(total);
    backend_.CopyToHost(send_.data(), send, total * sizeof(float));
    send = send_.data();
  }
  gathered_.resize(total);
  if (!parallelism_.distributed()) {
    std::memcpy(gathered_.data(), send, total * sizeof(float));
    return gathered_.data();
  }
  const Timer timer;
  {
    ScopedKernelTimer profile_timer("tensor_parallel_exchange", 0, 4.0 * total);
    parallelism_.tensor_parallel->AllToAll(send, gathered_.data(), block, what);
  }
  Count(static_cast<double>(block) * (parallelism_.tp_degree - 1), timer.Seconds());
  return gathered_.data();
}

void TensorParallelOps::Count(double floats_received, double seconds) {
  if (ExchangeTraffic* traffic = parallelism_.traffic) traffic->Add(4.0 * floats_received, seconds);
}

}  // namespace crucible
