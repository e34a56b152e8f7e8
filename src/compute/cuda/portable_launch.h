// The portable exact kernels on the GPU (portable_launch.cu): the functions of
// compute/portable/portable_kernels.h, launched one thread per output element or row, each
// thread running the same loop as compute/portable_backend.cc runs for that element on the CPU.
// So every output has the CPU portable backend's bits (no cuBLAS, no CUDA math library, no
// contraction: portable_math.h's __fadd_rn-style operations), for any grid. The backend that
// calls them is cuda_backend.cc's PortableCudaBackend ([debug] portable_exact with device
// "cuda"). Shapes and contracts: kernels/cpu/kernels.h; every pointer is device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "compute/cuda/cuda_kernels.h"

namespace crucible::cuda {

void PortableMatmulForward(cudaStream_t stream, float* out, const float* inp, const float* weight,
                           int64_t N, int64_t C, int64_t OC);
// dinp may be null (no input gradient wanted).
void PortableMatmulBackward(cudaStream_t stream, float* dinp, float* dweight, const float* dout,
                            const float* inp, const float* weight, int64_t N, int64_t C, int64_t OC,
                            bool accumulate_dinp, bool accumulate_dweight);
void PortableEmbeddingForward(cudaStream_t stream, float* out, const int32_t* tokens,
                              const float* table, int64_t N, int64_t C);
void PortableEmbeddingBackward(cudaStream_t stream, float* dtable, const float* dout,
                               const int32_t* tokens, int64_t N, int64_t C);
void PortableRmsnormForward(cudaStream_t stream, float* out, float* rstd, const float* inp,
                            const float* weight, int64_t N, int64_t C, float eps);
void PortableRmsnormBackward(cudaStream_t stream, float* dinp, float* dweight, const float* dout,
                             const float* inp, const float* weight, const float* rstd, int64_t N,
                             int64_t C);
// sine_sign 1 rotates (the forward), -1 rotates back (the backward).
void PortableRope(cudaStream_t stream, float* x, const float* cos_table, const float* sin_table,
                  int64_t B, int64_t T, int64_t heads, int64_t D, float sine_sign);
void PortableAttentionForward(cudaStream_t stream, float* out, float* lse, const float* q,
                              const float* k, const float* v, int64_t B, int64_t T, int64_t H,
                              int64_t KV, int64_t D);
// delta (B*H*T floats) comes from `workspace` (kSlotAttentionDelta).
void PortableAttentionBackward(cudaStream_t stream, Workspace& workspace, float* dq, float* dk,
                               float* dv, const float* dout, const float* out, const float* lse,
                               const float* q, const float* k, const float* v, int64_t B, int64_t T,
                               int64_t H, int64_t KV, int64_t D);
void PortableSwigluForward(cudaStream_t stream, float* out, const float* gate, const float* up,
                           int64_t N, int64_t F);
void PortableSwigluBackward(cudaStream_t stream, float* dgate, float* dup, const float* dout,
                            const float* gate, const float* up, int64_t N, int64_t F);
void PortableCrossEntropyForward(cudaStream_t stream, float* losses, float* lse,
                                 const float* logits, const int32_t* targets, int64_t N, int64_t V);
void PortableCrossEntropyBackward(cudaStream_t stream, float* logits_to_dlogits, const float* lse,
                                  const int32_t* targets, int64_t N, int64_t V, float scale,
                                  const float* weights);

}  // namespace crucible::cuda
