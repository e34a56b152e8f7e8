// What each kernel of a model costs, for the per-kernel profile (common/profile.h): its name in
// the profile table, its floating-point operations and the bytes it must move at least (each
// operand read once, each result written once). One definition serves every backend, so the CPU's
// table and the GPU's count the same work. Shapes as in kernels/cpu/kernels.h.
#pragma once

#include <cstdint>

#include "common/profile.h"
#include "kernels/head_dims.h"

namespace crucible::kernels {

inline KernelCost MatmulForwardCost(int64_t N, int64_t C, int64_t OC) {
  return {"matmul", 2.0 * N * C * OC, 4.0 * (1.0 * N * C + 1.0 * OC * C + 1.0 * N * OC)};
}
// inp inp^T (N,C) -> (N,N): the flops of the tiles on and above the diagonal of a grid of
// `tile` x `tile` (what matmul_gram multiplies), inp read once and the whole result written.
inline KernelCost MatmulGramCost(int64_t N, int64_t C, int64_t tile) {
  const int64_t tiles = (N + tile - 1) / tile;
  double products = 0;  // output elements the upper tiles hold
  for (int64_t i = 0; i < tiles; ++i)
    for (int64_t j = i; j < tiles; ++j) {
      const int64_t rows = (i + 1) * tile < N ? tile : N - i * tile;
      const int64_t cols = (j + 1) * tile < N ? tile : N - j * tile;
      products += 1.0 * rows * cols;
    }
  return {"matmul_gram", 2.0 * products * C, 4.0 * (1.0 * N * C + 1.0 * N * N)};
}
// dinp and dweight: two products of 2 N C OC each, reading dout twice (dweight alone without
// dinp).
inline KernelCost MatmulBackwardCost(int64_t N, int64_t C, int64_t OC, bool dinp) {
  return {"matmul_backward", (dinp ? 4.0 : 2.0) * N * C * OC,
          4.0 * ((dinp ? 2.0 : 1.0) * N * OC + 1.0 * N * C * (dinp ? 2 : 1) + 2.0 * OC * C)};
}
inline KernelCost EmbeddingForwardCost(int64_t N, int64_t C) {
  return {"embedding", 0, 4.0 * (2.0 * N * C + N)};
}
inline KernelCost EmbeddingBackwardCost(int64_t N, int64_t C) {
  return {"embedding_backward", 1.0 * N * C, 4.0 * (2.0 * N * C + N)};
}
inline KernelCost RmsnormForwardCost(int64_t N, int64_t C) {
  return {"rmsnorm", 4.0 * N * C, 4.0 * (2.0 * N * C + C + N)};
}
inline KernelCost RmsnormBackwardCost(int64_t N, int64_t C) {
  return {"rmsnorm_backward", 8.0 * N * C, 4.0 * (4.0 * N * C + 2.0 * C + N)};
}
inline KernelCost RopeCost(bool backward, int64_t B, int64_t T, int64_t heads, int64_t D) {
  return {backward ? "rope_backward" : "rope", 3.0 * B * T * heads * D,
          4.0 * (2.0 * B * T * heads * D + T * D)};
}
// The causal half of Q K^T and P V: 2 x 2 B H D T(T+1)/2 flops.
// Two causal products: Q K^T over D.qk, P V over D.v.
inline KernelCost AttentionForwardCost(int64_t B, int64_t T, int64_t H, int64_t KV, HeadDims D) {
  const double qk = static_cast<double>(D.qk), v = static_cast<double>(D.v);
  return {"attention", 1.0 * B * H * (qk + v) * T * (T + 1.0),
          4.0 * (1.0 * B * T * H * (qk + v) + 1.0 * B * T * KV * (qk + v) + 1.0 * B * H * T)};
}
// Five causal products (S recomputed and dQ, dK over D.qk; dP and dV over D.v): 2.5 times the
// forward's when D.qk = D.v.
inline KernelCost AttentionBackwardCost(int64_t B, int64_t T, int64_t H, int64_t KV, HeadDims D) {
  const double qk = static_cast<double>(D.qk), v = static_cast<double>(D.v);
  return {"attention_backward", 0.5 * B * H * (3 * qk + 2 * v) * T * (T + 1.0),
          4.0 * (2.0 * B * T * H * (qk + v) + 2.0 * B * T * KV * (qk + v) + 1.0 * B * H * T)};
}
inline KernelCost SwigluForwardCost(int64_t N, int64_t F) {
  return {"swiglu", 5.0 * N * F, 4.0 * 3.0 * N * F};
}
inline KernelCost SwigluBackwardCost(int64_t N, int64_t F) {
  return {"swiglu_backward", 10.0 * N * F, 4.0 * 5.0 * N * F};
}
// Max, exp and sum over each row of logits: about 4 flops per logit (the exp counted as one).
inline KernelCost CrossEntropyForwardCost(int64_t N, int64_t V) {
  return {"cross_entropy", 4.0 * N * V, 4.0 * (1.0 * N * V + 3.0 * N)};
}
inline KernelCost CrossEntropyBackwardCost(int64_t N, int64_t V) {
  return {"cross_entropy_backward", 3.0 * N * V, 4.0 * (2.0 * N * V + 3.0 * N)};
}

}  // namespace crucible::kernels
