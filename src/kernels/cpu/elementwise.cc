// Embedding, RMSNorm, RoPE, SwiGLU and reductions.
#include <cmath>
#include <cstring>
#include <vector>

#include "common/host_math.h"
#include "common/profile.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/lanes.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/kernel_costs.h"

namespace crucible::kernels {

bool g_perturb_rmsnorm_for_tests = false;

namespace {
// Rows per chunk of a row reduction; fixed so results do not depend on the thread count.
constexpr int64_t kRowChunk = 64;
}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t N,
                       int64_t C) {
  ScopedKernelTimer profile_timer(EmbeddingForwardCost(N, C));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i)
    std::memcpy(out + i * C, table + static_cast<int64_t>(tokens[i]) * C, C * sizeof(float));
}

void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, int64_t N,
                        int64_t C) {
  ScopedKernelTimer profile_timer(EmbeddingBackwardCost(N, C));
  // Each thread owns a slice of channels and adds the rows in token order.
  constexpr int64_t kSlice = 64;
  int64_t slices = (C + kSlice - 1) / kSlice;
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < slices; ++s) {
    int64_t c0 = s * kSlice, c1 = std::min(C, c0 + kSlice);
    for (int64_t i = 0; i < N; ++i) {
      float* row = dtable + static_cast<int64_t>(tokens[i]) * C;
      const float* g = dout + i * C;
      for (int64_t c = c0; c < c1; ++c) row[c] += g[c];
    }
  }
}

void embedding_forward_rows(float* out, const int32_t* tokens, const float* table, int64_t N,
                            int64_t C, int64_t first, int64_t rows) {
  ScopedKernelTimer profile_timer(EmbeddingForwardCost(N, C));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const int64_t row = static_cast<int64_t>(tokens[i]) - first;
    if (row >= 0 && row < rows)
      std::memcpy(out + i * C, table + row * C, C * sizeof(float));
    else
      std::memset(out + i * C, 0, C * sizeof(float));
  }
}

void embedding_backward_rows(float* dtable, const float* dout, const int32_t* tokens, int64_t N,
                             int64_t C, int64_t first, int64_t rows) {
  ScopedKernelTimer profile_timer(EmbeddingBackwardCost(N, C));
  // As embedding_backward: a thread per slice of channels, the rows in token order.
  constexpr int64_t kSlice = 64;
  const int64_t slices = (C + kSlice - 1) / kSlice;
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < slices; ++s) {
    const int64_t c0 = s * kSlice, c1 = std::min(C, c0 + kSlice);
    for (int64_t i = 0; i < N; ++i) {
      const int64_t r = static_cast<int64_t>(tokens[i]) - first;
      if (r < 0 || r >= rows) continue;
      float* row = dtable + r * C;
      const float* g = dout + i * C;
      for (int64_t c = c0; c < c1; ++c) row[c] += g[c];
    }
  }
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                     int64_t C, float eps) {
  // x^2 sums, the scale and the weight: about 4 flops per element.
  ScopedKernelTimer profile_timer(RmsnormForwardCost(N, C));
  // Rows in parallel; a single row (a batch-1 decode step) on the calling thread, with no fork.
#pragma omp parallel for schedule(static) if (N > 1)
  for (int64_t i = 0; i < N; ++i) {
    const float* x = inp + i * C;
    float mean_square = lane_dot(x, x, C) / static_cast<float>(C);
    float r = 1.0f / std::sqrt(mean_square + eps);
    rstd[i] = r;
    float* y = out + i * C;
    for (int64_t c = 0; c < C; ++c) y[c] = (x[c] * r) * weight[c];
    if (g_perturb_rmsnorm_for_tests)
      for (int64_t c = 0; c < C; ++c) y[c] = std::nextafter(y[c], INFINITY);
  }
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int64_t N, int64_t C) {
  ScopedKernelTimer profile_timer(RmsnormBackwardCost(N, C));
  int64_t chunks = (N + kRowChunk - 1) / kRowChunk;
  std::vector<float> partial(static_cast<size_t>(chunks * C), 0.0f);
#pragma omp parallel for schedule(static)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    float* dw = partial.data() + chunk * C;
    std::vector<float> gw(C);
    for (int64_t i = chunk * kRowChunk; i < std::min(N, (chunk + 1) * kRowChunk); ++i) {
      const float* x = inp + i * C;
      const float* dy = dout + i * C;
      float r = rstd[i];
      for (int64_t c = 0; c < C; ++c) {
        dw[c] += dy[c] * (x[c] * r);
        gw[c] = dy[c] * weight[c];
      }
      // dx = r * (g - xhat * mean(g * xhat)), with g = dy * w and xhat = x * r
      float mean_gx = lane_dot(gw.data(), x, C) * r / static_cast<float>(C);
      float* dx = dinp + i * C;
      for (int64_t c = 0; c < C; ++c) dx[c] += r * (gw[c] - (x[c] * r) * mean_gx);
    }
  }
  for (int64_t c = 0; c < C; ++c) dweight[c] = 0.0f;
  for (int64_t chunk = 0; chunk < chunks; ++chunk)
    for (int64_t c = 0; c < C; ++c) dweight[c] += partial[chunk * C + c];
}

void rope_tables(float* cos_table, float* sin_table, int64_t T, int64_t D, double theta) {
  int64_t half = D / 2;
  for (int64_t i = 0; i < half; ++i) {
    // As Hugging Face computes it: inv_freq in float32, angle = t * inv_freq in float32.
    float inv_freq = static_cast<float>(1.0 / HostPow(theta, static_cast<double>(2 * i) / D));
    for (int64_t t = 0; t < T; ++t) {
      float angle = static_cast<float>(t) * inv_freq;
      cos_table[t * half + i] = static_cast<float>(HostCos(static_cast<double>(angle)));
      sin_table[t * half + i] = static_cast<float>(HostSin(static_cast<double>(angle)));
    }
  }
}

namespace {
// Rotates each pair (v[i], v[i + D/2]) of every head at position t by its angle, or by minus its
// angle when sine_sign is -1 (the inverse rotation, which is also the transpose). Negating the
// sine is exact, so the inverse gives the bits of the rotation written out with the signs swapped.
// Head h of row bt starts at x + (bt * heads + h) * stride + offset.
void rope_rotate(float* x, const float* cos_table, const float* sin_table, int64_t B, int64_t T,
                 int64_t heads, int64_t D, int64_t stride, int64_t offset, float sine_sign) {
  int64_t half = D / 2;
#pragma omp parallel for schedule(static) if (B * T > 1)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    int64_t t = bt % T;
    const float* c = cos_table + t * half;
    const float* s = sin_table + t * half;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (bt * heads + h) * stride + offset;
      for (int64_t i = 0; i < half; ++i) {
        float x1 = v[i], x2 = v[i + half], sine = sine_sign * s[i];
        v[i] = x1 * c[i] - x2 * sine;
        v[i + half] = x2 * c[i] + x1 * sine;
      }
    }
  }
}
}  // namespace

void rope_forward(float* x, const float* cos_table, const float* sin_table, int64_t B, int64_t T,
                  int64_t heads, int64_t D) {
  // In place: each pair rotated with 4 multiplies and 2 adds, the tables read once per row.
  ScopedKernelTimer profile_timer(RopeCost(false, B, T, heads, D));
  rope_rotate(x, cos_table, sin_table, B, T, heads, D, D, 0, 1.0f);
}

void rope_backward(float* dx, const float* cos_table, const float* sin_table, int64_t B, int64_t T,
                   int64_t heads, int64_t D) {
  ScopedKernelTimer profile_timer(RopeCost(true, B, T, heads, D));
  rope_rotate(dx, cos_table, sin_table, B, T, heads, D, D, 0, -1.0f);
}

void rope_forward_strided(float* x, const float* cos_table, const float* sin_table, int64_t B,
                          int64_t T, int64_t heads, int64_t D, int64_t stride, int64_t offset) {
  ScopedKernelTimer profile_timer(RopeCost(false, B, T, heads, D));
  rope_rotate(x, cos_table, sin_table, B, T, heads, D, stride, offset, 1.0f);
}

void rope_backward_strided(float* dx, const float* cos_table, const float* sin_table, int64_t B,
                           int64_t T, int64_t heads, int64_t D, int64_t stride, int64_t offset) {
  ScopedKernelTimer profile_timer(RopeCost(true, B, T, heads, D));
  rope_rotate(dx, cos_table, sin_table, B, T, heads, D, stride, offset, -1.0f);
}

void swiglu_forward(float* out, const float* gate, const float* up, int64_t N, int64_t F) {
  ScopedKernelTimer profile_timer(SwigluForwardCost(N, F));
#pragma omp parallel for schedule(static) if (N > 1)
  for (int64_t i = 0; i < N; ++i) {
    const float* g = gate + i * F;
    const float* u = up + i * F;
    float* o = out + i * F;
    for (int64_t j = 0; j < F; ++j) o[j] = g[j] * sigmoid_fast(g[j]) * u[j];
  }
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, int64_t N, int64_t F) {
  ScopedKernelTimer profile_timer(SwigluBackwardCost(N, F));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const float* g = gate + i * F;
    const float* u = up + i * F;
    const float* d = dout + i * F;
    float* dg = dgate + i * F;
    float* du = dup + i * F;
    for (int64_t j = 0; j < F; ++j) {
      float s = sigmoid_fast(g[j]);
      float silu = g[j] * s;
      du[j] = d[j] * silu;
      dg[j] = d[j] * u[j] * (s * (1.0f + g[j] * (1.0f - s)));
    }
  }
}

double sum_of_squares(const float* x, size_t n) {
  constexpr size_t kChunk = 1 << 14;
  size_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(chunks, 0.0);
#pragma omp parallel for schedule(static)
  for (size_t chunk = 0; chunk < chunks; ++chunk) {
    double lanes[8] = {0};
    size_t begin = chunk * kChunk, end = std::min(n, begin + kChunk);
    size_t i = begin;
    for (; i + 8 <= end; i += 8)
      for (int l = 0; l < 8; ++l) lanes[l] += static_cast<double>(x[i + l]) * x[i + l];
    for (int l = 0; i < end; ++i, ++l) lanes[l] += static_cast<double>(x[i]) * x[i];
    partial[chunk] = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
                     ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace crucible::kernels
