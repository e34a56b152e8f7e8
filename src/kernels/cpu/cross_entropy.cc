// Cross-entropy over the vocabulary, with the log-sum-exp kept so the backward pass can form
// the softmax in place of the logits.
#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/profile.h"
#include "common/strings.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/lanes.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/kernel_costs.h"

namespace crucible::kernels {
namespace {
inline float row_logsumexp(const float* row, int64_t V) {
  float max = row[0];
  for (int64_t j = 1; j < V; ++j) max = std::max(max, row[j]);
  return max + std::log(lane_sum(V, [row, max](int64_t j) { return exp_fast(row[j] - max); }));
}
}  // namespace

void check_targets(const int32_t* targets, int64_t N, int64_t V) {
  for (int64_t i = 0; i < N; ++i) {
    if (targets[i] < -1 || targets[i] >= V)
      throw DataError(
          StrFormat("target token %d at position %lld is outside the vocabulary [0, %lld)",
                    targets[i], static_cast<long long>(i), static_cast<long long>(V)));
  }
}

int64_t cross_entropy_forward(float* losses, float* lse, const float* logits,
                              const int32_t* targets, int64_t N, int64_t V) {
  ScopedKernelTimer profile_timer(CrossEntropyForwardCost(N, V));
  check_targets(targets, N, V);
  int64_t valid = 0;
#pragma omp parallel for schedule(static) reduction(+ : valid)
  for (int64_t i = 0; i < N; ++i) {
    const float* row = logits + i * V;
    lse[i] = row_logsumexp(row, V);
    if (targets[i] < 0) {
      losses[i] = 0.0f;
    } else {
      losses[i] = lse[i] - row[targets[i]];
      ++valid;
    }
  }
  return valid;
}

void cross_entropy_backward(float* logits_to_dlogits, const float* lse, const int32_t* targets,
                            int64_t N, int64_t V, float scale, const float* weights) {
  ScopedKernelTimer profile_timer(CrossEntropyBackwardCost(N, V));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    float* row = logits_to_dlogits + i * V;
    if (targets[i] < 0) {
      for (int64_t j = 0; j < V; ++j) row[j] = 0.0f;
      continue;
    }
    float m = lse[i];
    const float row_scale = weights ? scale * weights[i] : scale;  // scale * 1.0f is scale
    for (int64_t j = 0; j < V; ++j) row[j] = exp_fast(row[j] - m) * row_scale;
    row[targets[i]] -= row_scale;
  }
}

}  // namespace crucible::kernels
