// Cross-entropy over the vocabulary, with the log-sum-exp kept so the backward pass can form
// the softmax in place of the logits.
#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/profile.h"
#include "common/strings.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vec16.h"
#include "kernels/kernel_costs.h"

namespace crucible::kernels {
namespace {
// The row loops on 16-lane vectors (vec16.h: exp_fast and lane_sum's bits on either width),
// compiled for AVX-512 and for the build's AVX2; one row is 8192 floats on `small`, so a call
// per row costs nothing.
[[gnu::always_inline]] inline float RowLogsumexp(const float* row, int64_t V) {
  const float max = vec16::Max(row, V);
  return max + std::log(vec16::ExpShiftedSum(row, V, max));
}
__attribute__((target("avx512f"))) float RowLogsumexpAvx512(const float* row, int64_t V) {
  return RowLogsumexp(row, V);
}
float RowLogsumexpAvx2(const float* row, int64_t V) {
  return RowLogsumexp(row, V);
}
__attribute__((target("avx512f"))) void RowSoftmaxScaledAvx512(float* row, int64_t V, float lse,
                                                               float scale) {
  vec16::ExpShiftedScaled(row, V, lse, scale);
}
void RowSoftmaxScaledAvx2(float* row, int64_t V, float lse, float scale) {
  vec16::ExpShiftedScaled(row, V, lse, scale);
}
__attribute__((target("avx512f"))) float RowMaxAvx512(const float* row, int64_t V) {
  return vec16::Max(row, V);
}
float RowMaxAvx2(const float* row, int64_t V) {
  return vec16::Max(row, V);
}
__attribute__((target("avx512f"))) float RowExpSumAvx512(const float* row, int64_t V, float max) {
  return vec16::ExpShiftedSum(row, V, max);
}
float RowExpSumAvx2(const float* row, int64_t V, float max) {
  return vec16::ExpShiftedSum(row, V, max);
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
  const auto row_logsumexp = cpu_has_avx512f() ? RowLogsumexpAvx512 : RowLogsumexpAvx2;
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
  // The whole vocabulary is the slice from 0: every target is in it.
  cross_entropy_backward_rows(logits_to_dlogits, lse, targets, N, V, 0, scale, weights);
}

void row_max(float* max, const float* x, int64_t N, int64_t V) {
  const auto f = cpu_has_avx512f() ? RowMaxAvx512 : RowMaxAvx2;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) max[i] = f(x + i * V, V);
}

void row_exp_sum(float* sum, const float* x, const float* max, int64_t N, int64_t V) {
  ScopedKernelTimer profile_timer(CrossEntropyForwardCost(N, V));
  const auto f = cpu_has_avx512f() ? RowExpSumAvx512 : RowExpSumAvx2;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) sum[i] = f(x + i * V, V, max[i]);
}

void target_logits(float* out, const float* x, const int32_t* targets, int64_t N, int64_t V,
                   int64_t first) {
  for (int64_t i = 0; i < N; ++i) {
    const int64_t j = static_cast<int64_t>(targets[i]) - first;
    out[i] = targets[i] >= 0 && j >= 0 && j < V ? x[i * V + j] : 0.0f;
  }
}

void cross_entropy_backward_rows(float* x_to_dx, const float* lse, const int32_t* targets,
                                 int64_t N, int64_t V, int64_t first, float scale,
                                 const float* weights) {
  ScopedKernelTimer profile_timer(CrossEntropyBackwardCost(N, V));
  const auto softmax_scaled = cpu_has_avx512f() ? RowSoftmaxScaledAvx512 : RowSoftmaxScaledAvx2;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    float* row = x_to_dx + i * V;
    if (targets[i] < 0) {
      for (int64_t j = 0; j < V; ++j) row[j] = 0.0f;
      continue;
    }
    const float row_scale = weights ? scale * weights[i] : scale;  // scale * 1.0f is scale
    softmax_scaled(row, V, lse[i], row_scale);  // row[j] = exp_fast(row[j] - lse) * row_scale
    const int64_t j = static_cast<int64_t>(targets[i]) - first;
    if (j >= 0 && j < V) row[j] -= row_scale;
  }
}

}  // namespace crucible::kernels
