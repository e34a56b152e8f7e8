// Causal grouped-query attention with the probabilities kept for the backward pass. Products
// run per (batch, head) in the forward pass and per (batch, kv head) in the backward pass,
// through single-threaded sgemm calls inside one OpenMP loop, in row blocks that skip the masked
// upper triangle.
#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "common/profile.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/lanes.h"
#include "kernels/cpu/vec_math.h"

namespace crucible::kernels {
namespace {
constexpr int64_t kBlock = 128;  // rows per causal block
}  // namespace

void attention_forward(float* out, float* probs, const float* q, const float* k, const float* v,
                       int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
  ScopedKernelTimer profile_timer("attention");
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t group = H / KV;
  const int64_t ldq = H * D, ldk = KV * D;
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    int64_t b = bh / H, h = bh % H, g = h / group;
    const float* Q = q + b * T * ldq + h * D;
    const float* K = k + b * T * ldk + g * D;
    const float* V = v + b * T * ldk + g * D;
    float* P = probs + bh * T * T;
    float* O = out + b * T * ldq + h * D;
    for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
      int64_t rows = std::min(kBlock, T - r0), cols = r0 + rows;
      // S[r0:r0+rows, 0:cols] = scale * Q K^T
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, D, scale, Q + r0 * ldq, ldq,
                  K, ldk, 0.0f, P + r0 * T, T);
      for (int64_t i = r0; i < r0 + rows; ++i) {
        float* row = P + i * T;
        const int64_t n = i + 1;
        const float max = lane_max(row, n);
        for (int64_t j = 0; j < n; ++j) row[j] = exp_fast(row[j] - max);
        const float inv = 1.0f / lane_sum(row, n);
        for (int64_t j = 0; j < n; ++j) row[j] *= inv;
        // Zeros up to the block's last column: the products read no further (the backward pass
        // reads P only inside the causal blocks too).
        for (int64_t j = n; j < cols; ++j) row[j] = 0.0f;
      }
      // O[r0:r0+rows] = P[r0:r0+rows, 0:cols] V[0:cols]
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, D, cols, 1.0f, P + r0 * T, T, V,
                  ldk, 0.0f, O + r0 * ldq, ldq);
    }
  }
}

size_t attention_backward_scratch_floats(int64_t B, int64_t T, int64_t KV) {
  return static_cast<size_t>(B * KV) * T * T;
}

void attention_backward(float* dq, float* dk, float* dv, float* scratch, const float* dout,
                        const float* probs, const float* q, const float* k, const float* v,
                        int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
  ScopedKernelTimer profile_timer("attention_backward");
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t group = H / KV;
  const int64_t ldq = H * D, ldk = KV * D;
  // One task per (batch, kv head): it owns dK and dV of that head and adds the contributions of
  // its query heads in head order.
#pragma omp parallel for schedule(static)
  for (int64_t bg = 0; bg < B * KV; ++bg) {
    int64_t b = bg / KV, g = bg % KV;
    float* dS = scratch + bg * T * T;
    const float* K = k + b * T * ldk + g * D;
    const float* V = v + b * T * ldk + g * D;
    float* dK = dk + b * T * ldk + g * D;
    float* dV = dv + b * T * ldk + g * D;
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      const float* Q = q + b * T * ldq + h * D;
      const float* dO = dout + b * T * ldq + h * D;
      const float* P = probs + (b * H + h) * T * T;
      float* dQ = dq + b * T * ldq + h * D;
      float beta = h == g * group ? 0.0f : 1.0f;
      for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
        int64_t rows = std::min(kBlock, T - r0), cols = r0 + rows;
        // dP = dO V^T on the causal block
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, D, 1.0f, dO + r0 * ldq,
                    ldq, V, ldk, 0.0f, dS + r0 * T, T);
        // dS = P * (dP - sum_j dP*P) * scale
        for (int64_t i = r0; i < r0 + rows; ++i) {
          float* ds = dS + i * T;
          const float* p = P + i * T;
          const float dot = lane_dot(ds, p, i + 1);
          for (int64_t j = 0; j <= i; ++j) ds[j] = p[j] * (ds[j] - dot) * scale;
          for (int64_t j = i + 1; j < cols; ++j) ds[j] = 0.0f;
        }
        // dQ[rows] = dS[rows, 0:cols] K[0:cols]
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, D, cols, 1.0f, dS + r0 * T, T,
                    K, ldk, 0.0f, dQ + r0 * ldq, ldq);
      }
      // dV[c0:c1] (+)= P[c0:T, c0:c1]^T dO[c0:T];  dK[c0:c1] (+)= dS[c0:T, c0:c1]^T Q[c0:T]
      for (int64_t c0 = 0; c0 < T; c0 += kBlock) {
        int64_t cols = std::min(kBlock, T - c0), rows = T - c0;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, D, rows, 1.0f, P + c0 * T + c0,
                    T, dO + c0 * ldq, ldq, beta, dV + c0 * ldk, ldk);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, D, rows, 1.0f, dS + c0 * T + c0,
                    T, Q + c0 * ldq, ldq, beta, dK + c0 * ldk, ldk);
      }
    }
  }
}

}  // namespace crucible::kernels
