// Row kernels: embedding, RMSNorm and cross-entropy (the determinism of each: cuda_kernels.h).
#include <cub/device/device_radix_sort.cuh>

#include "compute/cuda/cuda_check.h"
#include "compute/cuda/cuda_kernels.h"

namespace crucible::cuda {
namespace {

constexpr int kThreads = 256;      // one block per row; a power of two for the tree
constexpr int64_t kRowChunk = 64;  // rows per partial sum of a weight gradient

unsigned Blocks(size_t n) {
  size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535u * 16u ? blocks : 65535u * 16u);
}

// Sum of `value` over the block's kThreads threads in a fixed tree; every thread gets the sum.
__device__ float block_sum(float value, float* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  float sum = shared[0];
  __syncthreads();
  return sum;
}

// ---- embedding ----
__global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const float* table,
                                         int64_t C, size_t n) {
  for (size_t e = blockIdx.x * size_t(blockDim.x) + threadIdx.x; e < n;
       e += size_t(gridDim.x) * blockDim.x) {
    int64_t i = static_cast<int64_t>(e / C), c = static_cast<int64_t>(e % C);
    out[e] = table[static_cast<int64_t>(tokens[i]) * C + c];
  }
}

__global__ void iota_kernel(int32_t* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = static_cast<int32_t>(i);
}

// keys: tokens sorted (stable); positions: where each came from. The thread of (s, c) where s
// starts a run of one token adds that run's rows in position order onto dtable.
__global__ void embedding_backward_kernel(float* dtable, const float* dout, const int32_t* keys,
                                          const int32_t* positions, int64_t N, int64_t C,
                                          size_t n) {
  for (size_t e = blockIdx.x * size_t(blockDim.x) + threadIdx.x; e < n;
       e += size_t(gridDim.x) * blockDim.x) {
    int64_t s = static_cast<int64_t>(e / C), c = static_cast<int64_t>(e % C);
    int32_t token = keys[s];
    if (s > 0 && keys[s - 1] == token) continue;
    float* cell = dtable + static_cast<int64_t>(token) * C + c;
    float acc = *cell;
    for (int64_t u = s; u < N && keys[u] == token; ++u)
      acc += dout[static_cast<int64_t>(positions[u]) * C + c];
    *cell = acc;
  }
}

// ---- RMSNorm ----
__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* inp,
                                       const float* weight, int64_t C, float eps) {
  __shared__ float shared[kThreads];
  const int64_t row = blockIdx.x;
  const float* x = inp + row * C;
  float partial = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += kThreads) partial += x[c] * x[c];
  float mean_square = block_sum(partial, shared) / static_cast<float>(C);
  float r = 1.0f / sqrtf(mean_square + eps);
  if (threadIdx.x == 0) rstd[row] = r;
  float* y = out + row * C;
  for (int64_t c = threadIdx.x; c < C; c += kThreads) y[c] = (x[c] * r) * weight[c];
}

// dinp (added to) of one row per block.
__global__ void rmsnorm_backward_dinp_kernel(float* dinp, const float* dout, const float* inp,
                                             const float* weight, const float* rstd, int64_t C) {
  __shared__ float shared[kThreads];
  const int64_t row = blockIdx.x;
  const float* x = inp + row * C;
  const float* dy = dout + row * C;
  const float r = rstd[row];
  float partial = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += kThreads) partial += (dy[c] * weight[c]) * x[c];
  float mean_gx = block_sum(partial, shared) * r / static_cast<float>(C);
  float* dx = dinp + row * C;
  for (int64_t c = threadIdx.x; c < C; c += kThreads)
    dx[c] += r * (dy[c] * weight[c] - (x[c] * r) * mean_gx);
}

// partials (chunks, C): the sum over one chunk's rows of dy * x * r, in row order.
__global__ void rmsnorm_backward_partials_kernel(float* partials, const float* dout,
                                                 const float* inp, const float* rstd, int64_t N,
                                                 int64_t C) {
  const int64_t c = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  if (c >= C) return;
  float acc = 0.0f;
  const int64_t end = min(N, (chunk + 1) * kRowChunk);
  for (int64_t i = chunk * kRowChunk; i < end; ++i)
    acc += dout[i * C + c] * (inp[i * C + c] * rstd[i]);
  partials[chunk * C + c] = acc;
}

__global__ void rmsnorm_backward_dweight_kernel(float* dweight, const float* partials,
                                                int64_t chunks, int64_t C) {
  const int64_t c = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  if (c >= C) return;
  float acc = 0.0f;
  for (int64_t chunk = 0; chunk < chunks; ++chunk) acc += partials[chunk * C + c];
  dweight[c] = acc;
}

// ---- cross-entropy ----
// One block per row: each thread keeps an online (max, sum of exp) over its strided slice; the
// pairs are combined in a fixed tree.
__global__ void cross_entropy_forward_kernel(float* losses, float* lse, const float* logits,
                                             const int32_t* targets, int64_t V) {
  __shared__ float shared_max[kThreads];
  __shared__ float shared_sum[kThreads];
  const int64_t row = blockIdx.x;
  const float* x = logits + row * V;
  float m = -INFINITY, s = 0.0f;
  for (int64_t j = threadIdx.x; j < V; j += kThreads) {
    float value = x[j];
    if (value > m) {
      s = s * expf(m - value) + 1.0f;
      m = value;
    } else {
      s += expf(value - m);
    }
  }
  shared_max[threadIdx.x] = m;
  shared_sum[threadIdx.x] = s;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      float m1 = shared_max[threadIdx.x], m2 = shared_max[threadIdx.x + stride];
      float s1 = shared_sum[threadIdx.x], s2 = shared_sum[threadIdx.x + stride];
      float mm = fmaxf(m1, m2);
      float t1 = m1 == -INFINITY ? 0.0f : s1 * expf(m1 - mm);
      float t2 = m2 == -INFINITY ? 0.0f : s2 * expf(m2 - mm);
      shared_max[threadIdx.x] = mm;
      shared_sum[threadIdx.x] = t1 + t2;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    float row_lse = shared_max[0] + logf(shared_sum[0]);
    lse[row] = row_lse;
    int32_t target = targets[row];
    losses[row] = target < 0 ? 0.0f : row_lse - x[target];
  }
}

__global__ void cross_entropy_backward_kernel(float* logits, const float* lse,
                                              const int32_t* targets, int64_t V, float scale,
                                              const float* weights, size_t n) {
  for (size_t e = blockIdx.x * size_t(blockDim.x) + threadIdx.x; e < n;
       e += size_t(gridDim.x) * blockDim.x) {
    int64_t row = static_cast<int64_t>(e / V), j = static_cast<int64_t>(e % V);
    int32_t target = targets[row];
    if (target < 0) {
      logits[e] = 0.0f;
      continue;
    }
    float row_scale = weights ? scale * weights[row] : scale;
    float value = expf(logits[e] - lse[row]) * row_scale;
    if (j == target) value -= row_scale;
    logits[e] = value;
  }
}

}  // namespace

void EmbeddingForward(cudaStream_t stream, float* out, const int32_t* tokens, const float* table,
                      int64_t N, int64_t C) {
  size_t n = static_cast<size_t>(N * C);
  if (!n) return;
  embedding_forward_kernel<<<Blocks(n), kThreads, 0, stream>>>(out, tokens, table, C, n);
  CRUCIBLE_CUDA_LAUNCHED();
}

void EmbeddingBackward(cudaStream_t stream, Workspace& workspace, float* dtable, const float* dout,
                       const int32_t* tokens, int64_t N, int64_t C) {
  size_t n = static_cast<size_t>(N * C);
  if (!n) return;
  const int count = static_cast<int>(N);
  auto* keys = static_cast<int32_t*>(workspace.Get(kSlotSortKeys, N * sizeof(int32_t)));
  auto* values = static_cast<int32_t*>(workspace.Get(kSlotSortValues, 2 * N * sizeof(int32_t)));
  int32_t* positions_in = values;
  int32_t* positions = values + N;
  iota_kernel<<<Blocks(N), kThreads, 0, stream>>>(positions_in, N);
  CRUCIBLE_CUDA_LAUNCHED();
  size_t temp_bytes = 0;
  CRUCIBLE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, temp_bytes, tokens, keys, positions_in, positions, count, 0, 32, stream));
  void* temp = workspace.Get(kSlotCubTemp, temp_bytes);
  CRUCIBLE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, tokens, keys, positions_in,
                                                      positions, count, 0, 32, stream));
  embedding_backward_kernel<<<Blocks(n), kThreads, 0, stream>>>(dtable, dout, keys, positions, N, C,
                                                                n);
  CRUCIBLE_CUDA_LAUNCHED();
}

void RmsnormForward(cudaStream_t stream, float* out, float* rstd, const float* inp,
                    const float* weight, int64_t N, int64_t C, float eps) {
  if (!N) return;
  rmsnorm_forward_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(out, rstd, inp, weight,
                                                                            C, eps);
  CRUCIBLE_CUDA_LAUNCHED();
}

void RmsnormBackward(cudaStream_t stream, Workspace& workspace, float* dinp, float* dweight,
                     const float* dout, const float* inp, const float* weight, const float* rstd,
                     int64_t N, int64_t C) {
  if (!C) return;
  const int64_t chunks = (N + kRowChunk - 1) / kRowChunk;
  const unsigned column_blocks = static_cast<unsigned>((C + kThreads - 1) / kThreads);
  if (N) {
    rmsnorm_backward_dinp_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
        dinp, dout, inp, weight, rstd, C);
    CRUCIBLE_CUDA_LAUNCHED();
    auto* partials =
        static_cast<float*>(workspace.Get(kSlotRowPartials, chunks * C * sizeof(float)));
    rmsnorm_backward_partials_kernel<<<dim3(column_blocks, static_cast<unsigned>(chunks)), kThreads,
                                       0, stream>>>(partials, dout, inp, rstd, N, C);
    CRUCIBLE_CUDA_LAUNCHED();
    rmsnorm_backward_dweight_kernel<<<column_blocks, kThreads, 0, stream>>>(dweight, partials,
                                                                            chunks, C);
  } else {
    Fill(stream, dweight, static_cast<size_t>(C), 0.0f);
  }
  CRUCIBLE_CUDA_LAUNCHED();
}

void CrossEntropyForward(cudaStream_t stream, float* losses, float* lse, const float* logits,
                         const int32_t* targets, int64_t N, int64_t V) {
  if (!N) return;
  cross_entropy_forward_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
      losses, lse, logits, targets, V);
  CRUCIBLE_CUDA_LAUNCHED();
}

void CrossEntropyBackward(cudaStream_t stream, float* logits_to_dlogits, const float* lse,
                          const int32_t* targets, int64_t N, int64_t V, float scale,
                          const float* weights) {
  size_t n = static_cast<size_t>(N * V);
  if (!n) return;
  cross_entropy_backward_kernel<<<Blocks(n), kThreads, 0, stream>>>(logits_to_dlogits, lse, targets,
                                                                    V, scale, weights, n);
  CRUCIBLE_CUDA_LAUNCHED();
}

}  // namespace crucible::cuda
