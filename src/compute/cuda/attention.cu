// Causal grouped-query attention, flash style: no (T,T) matrix in memory. One warp per query row
// keeps an online softmax (running max m, running sum l, the output accumulator) over the keys
// in tiles of 64, the CPU's tile (kernels/cpu/attention.cc), lanes scoring keys j0 + lane and
// j0 + 32 + lane: the running max after each tile, so the unnormalised probabilities exp(s - m)
// that bf16 rounds, are the CPU's up to fp32 rounding. The backward recomputes P = exp(S - lse) in
// tiles of 32. dQ is owned per query row (one warp), dK and dV per key row (one warp, adding the
// group's query heads in head order), so nothing is combined with atomics. Each lane owns the
// output dimensions lane, lane + 32, ... (at most kMaxHeadDim / 32 of them, held in registers). A
// first version for correctness: the key and query rows are read from global memory by each lane,
// not staged in shared tiles, and no tensor cores are used.
#include <cuda_bf16.h>

#include "compute/cuda/cuda_check.h"
#include "compute/cuda/cuda_kernels.h"

namespace crucible::cuda {
namespace {

constexpr int kWarp = 32;
// Keys per tile of the forward: kernels/cpu/attention.cc's kTile, which the bf16 contract's
// rounding of exp(s - m) depends on (compute/backend.h, "Precision"). Two keys per lane.
constexpr int kKeyTile = 64;
constexpr int kKeysPerLane = kKeyTile / kWarp;
constexpr int kWarpsPerBlock = 4;
constexpr int kSlots = static_cast<int>(kMaxHeadDim / kWarp);
constexpr unsigned kFullMask = 0xffffffffu;

template <bool kBf16>
__device__ __forceinline__ float operand(float x) {
  if constexpr (kBf16) return __bfloat162float(__float2bfloat16_rn(x));
  return x;
}

// Butterfly reductions: every lane ends with the same value (a + b == b + a), the same tree on
// every run.
__device__ __forceinline__ float warp_sum(float value) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    value += __shfl_xor_sync(kFullMask, value, offset);
  return value;
}
__device__ __forceinline__ float warp_max(float value) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    value = fmaxf(value, __shfl_xor_sync(kFullMask, value, offset));
  return value;
}

// How many of a tile's 32 rows exist when `remaining` rows are left (the same on every lane).
__device__ __forceinline__ int TileCount(int64_t remaining) {
  return remaining < kWarp ? static_cast<int>(remaining) : kWarp;
}

struct Shape {
  int64_t B, T, H, KV, D;
  float scale;
  __host__ __device__ int64_t rows() const { return B * H * T; }
};

// q (B,T,H,D), k,v (B,T,KV,D) -> out (B,T,H,D), lse (B,H,T). Warp row = (b*H + h)*T + i.
template <bool kBf16>
__global__ void attention_forward_kernel(float* out, float* lse, const float* q, const float* k,
                                         const float* v, Shape shape) {
  __shared__ float shared_q[kWarpsPerBlock][kMaxHeadDim];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t row = blockIdx.x * int64_t(kWarpsPerBlock) + warp;
  if (row >= shape.rows()) return;  // whole warps leave together
  const int64_t T = shape.T, H = shape.H, KV = shape.KV, D = shape.D;
  const int64_t i = row % T, h = (row / T) % H, b = row / (T * H);
  const int64_t kvh = h / (H / KV), ldq = H * D, ldk = KV * D;
  const float* Q = q + (b * T + i) * ldq + h * D;
  const float* K = k + b * T * ldk + kvh * D;
  const float* V = v + b * T * ldk + kvh * D;
  float* qs = shared_q[warp];
  for (int64_t d = lane; d < D; d += kWarp) qs[d] = operand<kBf16>(Q[d]);
  __syncwarp();

  // Per 64-key tile, as the CPU: the tile's scores s, m_new = max(m, tile max), P~ = exp(s -
  // m_new), l = l exp(m - m_new) + sum(P~) over the fp32 P~, then P~ rounded (bf16) for P~ V and
  // acc = acc exp(m - m_new) + P~ V.
  float m = -INFINITY, l = 0.0f, acc[kSlots];
#pragma unroll
  for (int e = 0; e < kSlots; ++e) acc[e] = 0.0f;
  for (int64_t j0 = 0; j0 <= i; j0 += kKeyTile) {
    float s[kKeysPerLane], p[kKeysPerLane];
    float tile_max = -INFINITY;
#pragma unroll
    for (int half = 0; half < kKeysPerLane; ++half) {
      const int64_t j = j0 + half * kWarp + lane;
      s[half] = -INFINITY;
      if (j <= i) {
        float dot = 0.0f;
        for (int64_t d = 0; d < D; ++d) dot += qs[d] * operand<kBf16>(K[j * ldk + d]);
        s[half] = shape.scale * dot;
      }
      tile_max = fmaxf(tile_max, s[half]);
    }
    const float m_new = fmaxf(m, warp_max(tile_max));  // finite: key j0 <= i is in the tile
    float p_sum = 0.0f;
#pragma unroll
    for (int half = 0; half < kKeysPerLane; ++half) {
      p[half] = j0 + half * kWarp + lane <= i ? expf(s[half] - m_new) : 0.0f;
      p_sum += p[half];
    }
    const float alpha = expf(m - m_new);  // 0 on the first tile (m = -inf)
    l = l * alpha + warp_sum(p_sum);
    m = m_new;
#pragma unroll
    for (int e = 0; e < kSlots; ++e) acc[e] *= alpha;
#pragma unroll
    for (int half = 0; half < kKeysPerLane; ++half) {
      const int64_t u0 = j0 + half * kWarp;
      const float p_operand = operand<kBf16>(p[half]);
      const int count = u0 <= i ? TileCount(i - u0 + 1) : 0;
      for (int u = 0; u < count; ++u) {
        const float pu = __shfl_sync(kFullMask, p_operand, u);
        const float* Vrow = V + (u0 + u) * ldk;
#pragma unroll
        for (int e = 0; e < kSlots; ++e) {
          const int64_t d = lane + e * kWarp;
          if (d < D) acc[e] += pu * operand<kBf16>(Vrow[d]);
        }
      }
    }
  }
  const float inv = 1.0f / l;
  float* O = out + (b * T + i) * ldq + h * D;
#pragma unroll
  for (int e = 0; e < kSlots; ++e) {
    const int64_t d = lane + e * kWarp;
    if (d < D) O[d] = acc[e] * inv;
  }
  if (lane == 0) lse[row] = m + logf(l);
}

// delta (B,H,T) = rowsum(dO * O), fp32.
__global__ void attention_delta_kernel(float* delta, const float* dout, const float* out,
                                       Shape shape) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t row = blockIdx.x * int64_t(kWarpsPerBlock) + warp;
  if (row >= shape.rows()) return;
  const int64_t T = shape.T, H = shape.H, D = shape.D;
  const int64_t i = row % T, h = (row / T) % H, b = row / (T * H);
  const int64_t offset = (b * T + i) * H * D + h * D;
  float partial = 0.0f;
  for (int64_t d = lane; d < D; d += kWarp) partial += dout[offset + d] * out[offset + d];
  const float sum = warp_sum(partial);
  if (lane == 0) delta[row] = sum;
}

// dQ of one query row per warp: sum over keys j <= i of dS_ij k_j, in key order.
template <bool kBf16>
__global__ void attention_backward_dq_kernel(float* dq, const float* dout, const float* lse,
                                             const float* delta, const float* q, const float* k,
                                             const float* v, Shape shape) {
  __shared__ float shared_q[kWarpsPerBlock][kMaxHeadDim];
  __shared__ float shared_do[kWarpsPerBlock][kMaxHeadDim];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t row = blockIdx.x * int64_t(kWarpsPerBlock) + warp;
  if (row >= shape.rows()) return;
  const int64_t T = shape.T, H = shape.H, KV = shape.KV, D = shape.D;
  const int64_t i = row % T, h = (row / T) % H, b = row / (T * H);
  const int64_t kvh = h / (H / KV), ldq = H * D, ldk = KV * D;
  const int64_t offset = (b * T + i) * ldq + h * D;
  const float* K = k + b * T * ldk + kvh * D;
  const float* V = v + b * T * ldk + kvh * D;
  float* qs = shared_q[warp];
  float* dos = shared_do[warp];
  for (int64_t d = lane; d < D; d += kWarp) {
    qs[d] = operand<kBf16>(q[offset + d]);
    dos[d] = operand<kBf16>(dout[offset + d]);
  }
  __syncwarp();
  const float row_lse = lse[row], row_delta = delta[row];

  float acc[kSlots];
#pragma unroll
  for (int e = 0; e < kSlots; ++e) acc[e] = 0.0f;
  for (int64_t j0 = 0; j0 <= i; j0 += kWarp) {
    const int64_t j = j0 + lane;
    float ds = 0.0f;
    if (j <= i) {
      float score = 0.0f, dp = 0.0f;
      for (int64_t d = 0; d < D; ++d) {
        score += qs[d] * operand<kBf16>(K[j * ldk + d]);
        dp += dos[d] * operand<kBf16>(V[j * ldk + d]);
      }
      const float p = expf(shape.scale * score - row_lse);
      ds = p * (dp - row_delta) * shape.scale;
    }
    const float ds_operand = operand<kBf16>(ds);
    const int count = TileCount(i - j0 + 1);
    for (int u = 0; u < count; ++u) {
      const float dsu = __shfl_sync(kFullMask, ds_operand, u);
      const float* Krow = K + (j0 + u) * ldk;
#pragma unroll
      for (int e = 0; e < kSlots; ++e) {
        const int64_t d = lane + e * kWarp;
        if (d < D) acc[e] += dsu * operand<kBf16>(Krow[d]);
      }
    }
  }
#pragma unroll
  for (int e = 0; e < kSlots; ++e) {
    const int64_t d = lane + e * kWarp;
    if (d < D) dq[offset + d] = acc[e];
  }
}

// dK, dV of one key row per warp (row = (b*KV + kvh)*T + j): over the group's query heads in
// head order, then queries i >= j in query order.
template <bool kBf16>
__global__ void attention_backward_dkv_kernel(float* dk, float* dv, const float* dout,
                                              const float* lse, const float* delta, const float* q,
                                              const float* k, const float* v, Shape shape) {
  __shared__ float shared_k[kWarpsPerBlock][kMaxHeadDim];
  __shared__ float shared_v[kWarpsPerBlock][kMaxHeadDim];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t T = shape.T, H = shape.H, KV = shape.KV, D = shape.D;
  const int64_t row = blockIdx.x * int64_t(kWarpsPerBlock) + warp;
  if (row >= shape.B * KV * T) return;
  const int64_t j = row % T, kvh = (row / T) % KV, b = row / (T * KV);
  const int64_t group = H / KV, ldq = H * D, ldk = KV * D;
  const int64_t kv_offset = (b * T + j) * ldk + kvh * D;
  float* ks = shared_k[warp];
  float* vs = shared_v[warp];
  for (int64_t d = lane; d < D; d += kWarp) {
    ks[d] = operand<kBf16>(k[kv_offset + d]);
    vs[d] = operand<kBf16>(v[kv_offset + d]);
  }
  __syncwarp();

  float acc_k[kSlots], acc_v[kSlots];
#pragma unroll
  for (int e = 0; e < kSlots; ++e) acc_k[e] = acc_v[e] = 0.0f;
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    const float* Q = q + b * T * ldq + h * D;
    const float* dO = dout + b * T * ldq + h * D;
    const float* row_lse = lse + (b * H + h) * T;
    const float* row_delta = delta + (b * H + h) * T;
    for (int64_t i0 = j; i0 < T; i0 += kWarp) {
      const int64_t i = i0 + lane;
      float p = 0.0f, ds = 0.0f;
      if (i < T) {
        float score = 0.0f, dp = 0.0f;
        for (int64_t d = 0; d < D; ++d) {
          score += operand<kBf16>(Q[i * ldq + d]) * ks[d];
          dp += operand<kBf16>(dO[i * ldq + d]) * vs[d];
        }
        p = expf(shape.scale * score - row_lse[i]);
        ds = p * (dp - row_delta[i]) * shape.scale;
      }
      const float p_operand = operand<kBf16>(p), ds_operand = operand<kBf16>(ds);
      const int count = TileCount(T - i0);
      for (int u = 0; u < count; ++u) {
        const float pu = __shfl_sync(kFullMask, p_operand, u);
        const float dsu = __shfl_sync(kFullMask, ds_operand, u);
        const float* Qrow = Q + (i0 + u) * ldq;
        const float* dOrow = dO + (i0 + u) * ldq;
#pragma unroll
        for (int e = 0; e < kSlots; ++e) {
          const int64_t d = lane + e * kWarp;
          if (d < D) {
            acc_v[e] += pu * operand<kBf16>(dOrow[d]);
            acc_k[e] += dsu * operand<kBf16>(Qrow[d]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int e = 0; e < kSlots; ++e) {
    const int64_t d = lane + e * kWarp;
    if (d < D) {
      dk[kv_offset + d] = acc_k[e];
      dv[kv_offset + d] = acc_v[e];
    }
  }
}

unsigned WarpBlocks(int64_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

Shape MakeShape(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
  if (D > kMaxHeadDim || KV <= 0 || H % KV != 0)
    throw Error(kExitUsage, "attention on cuda: head_dim " + std::to_string(D) + " with " +
                                std::to_string(H) + " heads and " + std::to_string(KV) +
                                " kv heads is not supported (head_dim <= " +
                                std::to_string(kMaxHeadDim) + ", heads a multiple of kv heads)");
  return Shape{B, T, H, KV, D, 1.0f / sqrtf(static_cast<float>(D))};
}

}  // namespace

void AttentionForward(cudaStream_t stream, bool bf16, float* out, float* lse, const float* q,
                      const float* k, const float* v, int64_t B, int64_t T, int64_t H, int64_t KV,
                      int64_t D) {
  const Shape shape = MakeShape(B, T, H, KV, D);
  if (!shape.rows()) return;
  const unsigned blocks = WarpBlocks(shape.rows()), threads = kWarpsPerBlock * kWarp;
  if (bf16)
    attention_forward_kernel<true><<<blocks, threads, 0, stream>>>(out, lse, q, k, v, shape);
  else
    attention_forward_kernel<false><<<blocks, threads, 0, stream>>>(out, lse, q, k, v, shape);
  CRUCIBLE_CUDA_LAUNCHED();
}

void AttentionBackward(cudaStream_t stream, Workspace& workspace, bool bf16, float* dq, float* dk,
                       float* dv, const float* dout, const float* out, const float* lse,
                       const float* q, const float* k, const float* v, int64_t B, int64_t T,
                       int64_t H, int64_t KV, int64_t D) {
  const Shape shape = MakeShape(B, T, H, KV, D);
  if (!shape.rows()) return;
  const unsigned threads = kWarpsPerBlock * kWarp;
  auto* delta =
      static_cast<float*>(workspace.Get(kSlotAttentionDelta, shape.rows() * sizeof(float)));
  attention_delta_kernel<<<WarpBlocks(shape.rows()), threads, 0, stream>>>(delta, dout, out, shape);
  CRUCIBLE_CUDA_LAUNCHED();
  const unsigned q_blocks = WarpBlocks(shape.rows()), kv_blocks = WarpBlocks(B * KV * T);
  if (bf16) {
    attention_backward_dq_kernel<true>
        <<<q_blocks, threads, 0, stream>>>(dq, dout, lse, delta, q, k, v, shape);
    CRUCIBLE_CUDA_LAUNCHED();
    attention_backward_dkv_kernel<true>
        <<<kv_blocks, threads, 0, stream>>>(dk, dv, dout, lse, delta, q, k, v, shape);
  } else {
    attention_backward_dq_kernel<false>
        <<<q_blocks, threads, 0, stream>>>(dq, dout, lse, delta, q, k, v, shape);
    CRUCIBLE_CUDA_LAUNCHED();
    attention_backward_dkv_kernel<false>
        <<<kv_blocks, threads, 0, stream>>>(dk, dv, dout, lse, delta, q, k, v, shape);
  }
  CRUCIBLE_CUDA_LAUNCHED();
}

}  // namespace crucible::cuda
