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
  return "";
}

TensorParallelOps::TensorParallelOps(const ModelParallelism& parallelism, ComputeBackend& backend)
    : parallelism_(parallelism), backend_(backend) {
  if (std::string why = parallelism.Check(); !why.empty())
    throw Error(kExitFailure, "internal: " + why);
  if (parallelism.distributed() && !parallelism.tensor_parallel)
    throw Error(kExitFailure, "internal: a tensor-parallel model without its group");
}

void TensorParallelOps::SumChunks(float* const* partials, size_t n, const char* what) {
  const int local = parallelism_.chunks_per_rank();
  // This rank's subtree: chunks [first, first + local) are an aligned, complete one.
  for (int step = 1; step < local; step *= 2)
    for (int i = 0; i + step < local; i += 2 * step)
      backend_.Add(partials[i], partials[i + step], n);
  if (!parallelism_.distributed()) return;
  // The roots of every rank's subtree, and the levels above them in the same order.
  const int ranks = parallelism_.tp_degree;
  float* roots = const_cast<float*>(AllGather(partials[0], n, what));
  ScopedKernelTimer profile_timer("tensor_parallel_sum", static_cast<double>(n) * (ranks - 1));
  for (int step = 1; step < ranks; step *= 2)
    for (int i = 0; i + step < ranks; i += 2 * step) {
      float* y = roots + static_cast<size_t>(i) * n;
      const float* x = roots + static_cast<size_t>(i + step) * n;
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < static_cast<int64_t>(n); ++j) y[j] += x[j];
    }
  backend_.CopyToDevice(partials[0], roots, n * sizeof(float));
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
  const std::string label = std::string("tensor_parallel group: ") + what;
  const Timer timer;
  {
    ScopedKernelTimer profile_timer("tensor_parallel_exchange", 0,
                                    4.0 * count * parallelism_.tp_degree);
    parallelism_.tensor_parallel->AllGatherFloat(mine, gathered_.data(), count, label.c_str());
  }
  if (TensorParallelTraffic* traffic = parallelism_.traffic) {
    traffic->bytes_received += 4.0 * static_cast<double>(count) * (parallelism_.tp_degree - 1);
    traffic->seconds += timer.Seconds();
    ++traffic->exchanges;
  }
  return gathered_.data();
}

}  // namespace crucible
