// The CUDA kernels of the Llama model (compute/cuda/*.cu), launched on one stream. Shapes and
// contracts are those of kernels/cpu/kernels.h (B batch, T time, C channels, H heads, KV kv
// heads, D head dim, F SwiGLU hidden, V vocabulary, N = B*T rows); every pointer is device
// memory. A first version: simple and checkable before fast.
//
// Determinism (run to run bit-identical on one GPU model, for any grid size): no floating-point
// atomics anywhere; every output element is written by one thread in a fixed order.
//   - Row reductions (RMSNorm's mean square, cross-entropy's max and sum, attention's dot
//     products in the backward's delta): a 256-thread block (or a warp) accumulates a strided
//     slice per thread in index order, then combines the threads in a fixed shared-memory (or
//     shuffle) tree.
//   - Reductions over rows (RMSNorm dweight): chunks of 64 rows, each chunk summed in row order,
//     the chunk partials added in chunk order.
//   - Embedding backward: the positions are sorted by token with CUB's stable radix sort (integer
//     keys), then one thread per (token, channel) adds that token's rows in position order onto
//     dtable: the same additions in the same order as the CPU, so the same bits.
//   - Attention: one warp per query row (forward, dQ) or per key row (dK, dV); scores, exps and
//     products are taken key by key (query by query) in index order; dK/dV add the group's query
//     heads in head order. No atomics, so no second pass is needed to combine partials.
// Precision: with bf16 set, attention rounds exactly the operands of compute/backend.h's
// "Precision" contract, as the CPU does (kernels/cpu/attention.cc), and accumulates in fp32:
//   forward   q, k, v; and per 64-key tile (the CPU's tile, keys in order) P~ = exp(s - m), m the
//             running max over the tiles seen so far, rounded after its fp32 sum is added to the
//             running sum l (which stays fp32) and before P~ V; acc is rescaled by exp(m_old - m).
//   backward  P = exp(s - lse) (for P^T dO), dS = P (dP - delta) / sqrt(D) (for dS K, dS^T Q),
//             dO, q, k, v; delta = rowsum(dO * O) in fp32 on the unrounded values.
// What still differs from the CPU is fp32 rounding alone (the order of the dot products' sums,
// expf against the CPU's exp_fast), which can move a value across a bf16 rounding boundary: one
// bf16 ulp of that one probability or score gradient.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace crucible::cuda {

// Grow-only device scratch, one buffer per slot, owned by the backend (cuda_backend.cc).
class Workspace {
 public:
  virtual ~Workspace() = default;
  // At least `bytes` of device memory for `slot`; valid until the next Get of the same slot.
  virtual void* Get(int slot, size_t bytes) = 0;
};
enum WorkspaceSlot : int {
  kSlotRowPartials = 0,
  kSlotSortKeys,
  kSlotSortValues,
  kSlotCubTemp,
  kSlotAttentionDelta,
  kSlotBf16A,
  kSlotBf16B,
  kSlotCount
};

// ---- elementwise (elementwise.cu) ----
void Fill(cudaStream_t stream, float* x, size_t n, float value);
void Add(cudaStream_t stream, float* y, const float* x, size_t n);  // y += x
// x (n) -> out (n) as __nv_bfloat16, round to nearest even.
void ToBfloat16(cudaStream_t stream, void* out, const float* x, size_t n);
void SwigluForward(cudaStream_t stream, float* out, const float* gate, const float* up, int64_t N,
                   int64_t F);
void SwigluBackward(cudaStream_t stream, float* dgate, float* dup, const float* dout,
                    const float* gate, const float* up, int64_t N, int64_t F);
void RopeForward(cudaStream_t stream, float* x, const float* cos_table, const float* sin_table,
                 int64_t B, int64_t T, int64_t heads, int64_t D);
void RopeBackward(cudaStream_t stream, float* dx, const float* cos_table, const float* sin_table,
                  int64_t B, int64_t T, int64_t heads, int64_t D);

// ---- rows (rows.cu): embedding, RMSNorm, cross-entropy ----
void EmbeddingForward(cudaStream_t stream, float* out, const int32_t* tokens, const float* table,
                      int64_t N, int64_t C);
void EmbeddingBackward(cudaStream_t stream, Workspace& workspace, float* dtable, const float* dout,
                       const int32_t* tokens, int64_t N, int64_t C);
void RmsnormForward(cudaStream_t stream, float* out, float* rstd, const float* inp,
                    const float* weight, int64_t N, int64_t C, float eps);
void RmsnormBackward(cudaStream_t stream, Workspace& workspace, float* dinp, float* dweight,
                     const float* dout, const float* inp, const float* weight, const float* rstd,
                     int64_t N, int64_t C);
void CrossEntropyForward(cudaStream_t stream, float* losses, float* lse, const float* logits,
                         const int32_t* targets, int64_t N, int64_t V);
void CrossEntropyBackward(cudaStream_t stream, float* logits_to_dlogits, const float* lse,
                          const int32_t* targets, int64_t N, int64_t V, float scale,
                          const float* weights);

// ---- attention (attention.cu) ----
constexpr int64_t kMaxHeadDim = 256;  // 8 values per lane of a warp
void AttentionForward(cudaStream_t stream, bool bf16, float* out, float* lse, const float* q,
                      const float* k, const float* v, int64_t B, int64_t T, int64_t H, int64_t KV,
                      int64_t D);
void AttentionBackward(cudaStream_t stream, Workspace& workspace, bool bf16, float* dq, float* dk,
                       float* dv, const float* dout, const float* out, const float* lse,
                       const float* q, const float* k, const float* v, int64_t B, int64_t T,
                       int64_t H, int64_t KV, int64_t D);

}  // namespace crucible::cuda
