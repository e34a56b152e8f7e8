// The portable exact kernels on the GPU (what they promise: portable_launch.h). Each launcher is
// one grid-stride loop over the outputs (ForEach); the loop body is the CPU portable backend's
// (compute/portable_backend.cc), element by element, index for index.
#include <algorithm>

#include "compute/cuda/cuda_check.h"
#include "compute/cuda/portable_launch.h"
#include "compute/portable/portable_kernels.h"

namespace crucible::cuda {
namespace {

namespace p = ::crucible::portable;

// Threads per block; the row bodies (attention, cross-entropy) are long loops, one per thread.
constexpr int kThreads = 128;

// Element i in [0, n) is computed by exactly one thread, whatever the grid.
template <typename Body>
__global__ void for_each_kernel(int64_t n, Body body) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    body(i);
}

template <typename Body>
void ForEach(cudaStream_t stream, int64_t n, Body body) {
  if (n <= 0) return;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t{65535} * 16);
  for_each_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(n, body);
  CRUCIBLE_CUDA_LAUNCHED();
}

}  // namespace

void PortableMatmulForward(cudaStream_t stream, float* out, const float* inp, const float* weight,
                           int64_t N, int64_t C, int64_t OC) {
  ForEach(stream, N * OC, [=] __device__(int64_t e) {
    p::MatmulForwardElement(out, inp, weight, e / OC, e % OC, C, OC);
  });
}

void PortableMatmulBackward(cudaStream_t stream, float* dinp, float* dweight, const float* dout,
                            const float* inp, const float* weight, int64_t N, int64_t C, int64_t OC,
                            bool accumulate_dinp, bool accumulate_dweight) {
  if (dinp)
    ForEach(stream, N * C, [=] __device__(int64_t e) {
      p::MatmulBackwardInputElement(dinp, dout, weight, e / C, e % C, C, OC, accumulate_dinp);
    });
  ForEach(stream, OC * C, [=] __device__(int64_t e) {
    p::MatmulBackwardWeightElement(dweight, dout, inp, e / C, e % C, N, C, OC, accumulate_dweight);
  });
}

void PortableEmbeddingForward(cudaStream_t stream, float* out, const int32_t* tokens,
                              const float* table, int64_t N, int64_t C) {
  ForEach(stream, N * C, [=] __device__(int64_t e) {
    p::EmbeddingForwardElement(out, tokens, table, e / C, e % C, C);
  });
}

// One thread per channel: its rows in index order, so no two threads touch one cell.
void PortableEmbeddingBackward(cudaStream_t stream, float* dtable, const float* dout,
                               const int32_t* tokens, int64_t N, int64_t C) {
  ForEach(stream, C, [=] __device__(int64_t c) {
    p::EmbeddingBackwardChannel(dtable, dout, tokens, c, N, C);
  });
}

void PortableRmsnormForward(cudaStream_t stream, float* out, float* rstd, const float* inp,
                            const float* weight, int64_t N, int64_t C, float eps) {
  ForEach(stream, N,
          [=] __device__(int64_t i) { p::RmsnormForwardRow(out, rstd, inp, weight, i, C, eps); });
}

void PortableRmsnormBackward(cudaStream_t stream, float* dinp, float* dweight, const float* dout,
                             const float* inp, const float* weight, const float* rstd, int64_t N,
                             int64_t C) {
  ForEach(stream, N, [=] __device__(int64_t i) {
    p::RmsnormBackwardInputRow(dinp, dout, inp, weight, rstd, i, C);
  });
  ForEach(stream, C, [=] __device__(int64_t c) {
    p::RmsnormBackwardWeightChannel(dweight, dout, inp, rstd, c, N, C);
  });
}

void PortableRope(cudaStream_t stream, float* x, const float* cos_table, const float* sin_table,
                  int64_t B, int64_t T, int64_t heads, int64_t D, float sine_sign) {
  const int64_t half = D / 2;
  ForEach(stream, B * T * heads * half, [=] __device__(int64_t e) {
    p::RopeRotatePair(x, cos_table, sin_table, e / (heads * half), e / half % heads, e % half, T,
                      heads, D, sine_sign);
  });
}

void PortableAttentionForward(cudaStream_t stream, float* out, float* lse, const float* q,
                              const float* k, const float* v, int64_t B, int64_t T, int64_t H,
                              int64_t KV, int64_t D) {
  ForEach(stream, B * H * T, [=] __device__(int64_t row) {
    const int64_t b = row / (H * T), h = row / T % H, t = row % T;
    p::AttentionForwardRow(out, lse, q, k, v, b, h, t, T, H, KV, D);
  });
}

void PortableAttentionBackward(cudaStream_t stream, Workspace& workspace, float* dq, float* dk,
                               float* dv, const float* dout, const float* out, const float* lse,
                               const float* q, const float* k, const float* v, int64_t B, int64_t T,
                               int64_t H, int64_t KV, int64_t D) {
  const int64_t rows = B * H * T;
  if (rows <= 0) return;
  auto* delta = static_cast<float*>(
      workspace.Get(kSlotAttentionDelta, static_cast<size_t>(rows) * sizeof(float)));
  ForEach(stream, rows, [=] __device__(int64_t row) {
    const int64_t b = row / (H * T), h = row / T % H, t = row % T;
    p::AttentionBackwardDeltaRow(delta, dout, out, b, h, t, T, H, D);
  });
  ForEach(stream, rows, [=] __device__(int64_t row) {
    const int64_t b = row / (H * T), h = row / T % H, t = row % T;
    p::AttentionBackwardQueryRow(dq, dout, lse, delta, q, k, v, b, h, t, T, H, KV, D);
  });
  ForEach(stream, B * KV * T, [=] __device__(int64_t row) {
    const int64_t b = row / (KV * T), g = row / T % KV, j = row % T;
    p::AttentionBackwardKeyRow(dk, dv, dout, lse, delta, q, k, v, b, g, j, T, H, KV, D);
  });
}

void PortableSwigluForward(cudaStream_t stream, float* out, const float* gate, const float* up,
                           int64_t N, int64_t F) {
  ForEach(stream, N * F, [=] __device__(int64_t i) { p::SwigluForwardElement(out, gate, up, i); });
}

void PortableSwigluBackward(cudaStream_t stream, float* dgate, float* dup, const float* dout,
                            const float* gate, const float* up, int64_t N, int64_t F) {
  ForEach(stream, N * F,
          [=] __device__(int64_t i) { p::SwigluBackwardElement(dgate, dup, dout, gate, up, i); });
}

void PortableCrossEntropyForward(cudaStream_t stream, float* losses, float* lse,
                                 const float* logits, const int32_t* targets, int64_t N,
                                 int64_t V) {
  ForEach(stream, N, [=] __device__(int64_t i) {
    p::CrossEntropyForwardRow(losses, lse, logits, targets, i, V);
  });
}

void PortableCrossEntropyBackward(cudaStream_t stream, float* logits_to_dlogits, const float* lse,
                                  const int32_t* targets, int64_t N, int64_t V, float scale,
                                  const float* weights) {
  ForEach(stream, N, [=] __device__(int64_t i) {
    p::CrossEntropyBackwardRow(logits_to_dlogits, lse, targets, i, V, scale, weights);
  });
}

}  // namespace crucible::cuda
