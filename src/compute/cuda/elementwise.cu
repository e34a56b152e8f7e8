// Elementwise CUDA kernels: Fill, Add, the bf16 operand conversion, SwiGLU and RoPE. One thread
// per output element (RoPE: per rotated pair), so the results do not depend on the grid.
#include <cuda_bf16.h>

#include "compute/cuda/cuda_check.h"
#include "compute/cuda/cuda_kernels.h"

namespace crucible::cuda {
namespace {

constexpr int kThreads = 256;

unsigned Blocks(size_t n) {
  size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535u * 16u ? blocks : 65535u * 16u);
}

// Grid-stride loops: element i is computed by exactly one thread whatever the grid.
__global__ void fill_kernel(float* x, size_t n, float value) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    x[i] = value;
}

__global__ void add_kernel(float* y, const float* x, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    y[i] += x[i];
}

__global__ void to_bf16_kernel(__nv_bfloat16* out, const float* x, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(x[i]);
}

__device__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

// gate, up (N,F) -> out = silu(gate) * up
__global__ void swiglu_forward_kernel(float* out, const float* gate, const float* up, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    float g = gate[i];
    out[i] = g * sigmoid(g) * up[i];
  }
}

__global__ void swiglu_backward_kernel(float* dgate, float* dup, const float* dout,
                                       const float* gate, const float* up, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    float g = gate[i], d = dout[i];
    float s = sigmoid(g);
    dup[i] = d * (g * s);
    dgate[i] = d * up[i] * (s * (1.0f + g * (1.0f - s)));
  }
}

// x (B,T,heads,D): pair (i, i + D/2) of row (bt, h) rotated by position t = bt % T.
__global__ void rope_kernel(float* x, const float* cos_table, const float* sin_table, int64_t T,
                            int64_t heads, int64_t D, size_t pairs, float sine_sign) {
  const int64_t half = D / 2;
  for (size_t p = blockIdx.x * size_t(blockDim.x) + threadIdx.x; p < pairs;
       p += size_t(gridDim.x) * blockDim.x) {
    int64_t i = static_cast<int64_t>(p % half);
    int64_t row = static_cast<int64_t>(p / half);  // bt * heads + h
    int64_t t = (row / heads) % T;
    float c = cos_table[t * half + i], s = sine_sign * sin_table[t * half + i];
    float* v = x + row * D;
    float x1 = v[i], x2 = v[i + half];
    v[i] = x1 * c - x2 * s;
    v[i + half] = x2 * c + x1 * s;
  }
}

}  // namespace

void Fill(cudaStream_t stream, float* x, size_t n, float value) {
  if (!n) return;
  fill_kernel<<<Blocks(n), kThreads, 0, stream>>>(x, n, value);
  CRUCIBLE_CUDA_LAUNCHED();
}

void Add(cudaStream_t stream, float* y, const float* x, size_t n) {
  if (!n) return;
  add_kernel<<<Blocks(n), kThreads, 0, stream>>>(y, x, n);
  CRUCIBLE_CUDA_LAUNCHED();
}

void ToBfloat16(cudaStream_t stream, void* out, const float* x, size_t n) {
  if (!n) return;
  to_bf16_kernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(out), x, n);
  CRUCIBLE_CUDA_LAUNCHED();
}

void SwigluForward(cudaStream_t stream, float* out, const float* gate, const float* up, int64_t N,
                   int64_t F) {
  size_t n = static_cast<size_t>(N * F);
  if (!n) return;
  swiglu_forward_kernel<<<Blocks(n), kThreads, 0, stream>>>(out, gate, up, n);
  CRUCIBLE_CUDA_LAUNCHED();
}

void SwigluBackward(cudaStream_t stream, float* dgate, float* dup, const float* dout,
                    const float* gate, const float* up, int64_t N, int64_t F) {
  size_t n = static_cast<size_t>(N * F);
  if (!n) return;
  swiglu_backward_kernel<<<Blocks(n), kThreads, 0, stream>>>(dgate, dup, dout, gate, up, n);
  CRUCIBLE_CUDA_LAUNCHED();
}

void RopeForward(cudaStream_t stream, float* x, const float* cos_table, const float* sin_table,
                 int64_t B, int64_t T, int64_t heads, int64_t D) {
  size_t pairs = static_cast<size_t>(B * T * heads * (D / 2));
  if (!pairs) return;
  rope_kernel<<<Blocks(pairs), kThreads, 0, stream>>>(x, cos_table, sin_table, T, heads, D, pairs,
                                                      1.0f);
  CRUCIBLE_CUDA_LAUNCHED();
}

void RopeBackward(cudaStream_t stream, float* dx, const float* cos_table, const float* sin_table,
                  int64_t B, int64_t T, int64_t heads, int64_t D) {
  size_t pairs = static_cast<size_t>(B * T * heads * (D / 2));
  if (!pairs) return;
  rope_kernel<<<Blocks(pairs), kThreads, 0, stream>>>(dx, cos_table, sin_table, T, heads, D, pairs,
                                                      -1.0f);
  CRUCIBLE_CUDA_LAUNCHED();
}

}  // namespace crucible::cuda
