// Compile check (not run): every function of compute/portable/ instantiated in __global__ kernels,
// so nvcc proves the header it shares with the CPU builds for the GPU. Built by
// tests/integration/test_portable_exact.py where nvcc exists:
//   nvcc -std=c++20 -x cu -Isrc -c tests/cuda/portable_kernels_check.cu
#include "compute/portable/portable_kernels.h"

namespace p = crucible::portable;

__global__ void Math(double* d, float* f) {
  const int i = threadIdx.x;
  d[i] = p::Exp(d[i]) + p::Log(d[i]) + p::Sin(d[i]) + p::Cos(d[i]) + p::Pow(d[i], 0.5);
  f[i] = p::ExpF(f[i]) + p::LogF(f[i]) + p::SinF(f[i]) + p::CosF(f[i]) + p::RsqrtF(f[i]) +
         p::SigmoidF(f[i]);
}

__global__ void Kernels(float* a, float* b, float* c, float* d, float* e, float* f,
                        const int32_t* tokens) {
  const int64_t i = threadIdx.x;
  p::MatmulForwardElement(a, b, c, i, 0, 4, 4);
  p::MatmulBackwardInputElement(a, b, c, i, 0, 4, 4, true);
  p::MatmulBackwardWeightElement(a, b, c, i, 0, 4, 4, 4, false);
  p::EmbeddingForwardElement(a, tokens, b, i, 0, 4);
  p::EmbeddingBackwardChannel(a, b, tokens, i, 4, 4);
  p::RmsnormForwardRow(a, b, c, d, i, 4, 1e-5f);
  p::RmsnormBackwardInputRow(a, b, c, d, e, i, 4);
  p::RmsnormBackwardWeightChannel(a, b, c, d, i, 4, 4);
  p::RopeRotatePair(a, b, c, i, 0, 0, 4, 1, 4, 1.0f);
  p::AttentionForwardRow(a, b, c, d, e, 0, 0, i, 4, 2, 1, 4);
  p::AttentionBackwardDeltaRow(a, b, c, 0, 0, i, 4, 2, 4);
  p::AttentionBackwardQueryRow(a, b, c, d, e, f, e, 0, 0, i, 4, 2, 1, 4);
  p::AttentionBackwardKeyRow(a, b, c, d, e, f, e, e, 0, 0, i, 4, 2, 1, 4);
  p::SwigluForwardElement(a, b, c, i);
  p::SwigluBackwardElement(a, b, c, d, e, i);
  p::CrossEntropyForwardRow(a, b, c, tokens, i, 4);
  p::CrossEntropyBackwardRow(a, b, tokens, i, 4, 0.5f, c);
}
