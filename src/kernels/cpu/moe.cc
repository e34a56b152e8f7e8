// Row and column movements of MLA's heads and a mixture of experts' tokens (kernels.h).
#include <cstring>

#include "kernels/cpu/kernels.h"

namespace crucible::kernels {

void copy_columns(float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows,
                  int64_t cols, bool accumulate) {
#pragma omp parallel for schedule(static) if (rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    float* d = dst + r * ldd;
    const float* s = src + r * lds;
    if (accumulate)
      for (int64_t c = 0; c < cols; ++c) d[c] += s[c];
    else
      std::memcpy(d, s, cols * sizeof(float));
  }
}

void gather_rows(float* out, const float* x, const int32_t* rows, int64_t N, int64_t K, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t)
    for (int64_t k = 0; k < K; ++k)
      std::memcpy(out + static_cast<int64_t>(rows[t * K + k]) * C, x + t * C, C * sizeof(float));
}

void moe_combine(float* out, const float* y, const int32_t* rows, const float* weights, int64_t N,
                 int64_t K, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    float* o = out + t * C;
    for (int64_t k = 0; k < K; ++k) {
      const float w = weights[t * K + k];
      const float* row = y + static_cast<int64_t>(rows[t * K + k]) * C;
      for (int64_t c = 0; c < C; ++c) o[c] += w * row[c];
    }
  }
}

void moe_combine_backward(float* dy, float* dweights, const float* dout, const float* y,
                          const int32_t* rows, const float* weights, int64_t N, int64_t K,
                          int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    const float* d = dout + t * C;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t row = rows[t * K + k];
      const float w = weights[t * K + k];
      const float* yr = y + row * C;
      float* dr = dy + row * C;
      double dot = 0;
      for (int64_t c = 0; c < C; ++c) {
        dr[c] = w * d[c];
        dot += static_cast<double>(d[c]) * yr[c];
      }
      dweights[t * K + k] = static_cast<float>(dot);
    }
  }
}

void scatter_add_rows(float* dx, const float* drows, const int32_t* rows, int64_t N, int64_t K,
                      int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    float* d = dx + t * C;
    for (int64_t k = 0; k < K; ++k) {
      const float* r = drows + static_cast<int64_t>(rows[t * K + k]) * C;
      for (int64_t c = 0; c < C; ++c) d[c] += r[c];
    }
  }
}

}  // namespace crucible::kernels
