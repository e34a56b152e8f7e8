// The CUDA backend, registered as device "cuda" by builds made with the CUDA toolkit
// (-DCRUCIBLE_CUDA=AUTO finds nvcc; ON requires it). It runs on the GPU that LOCAL_RANK names
// (BackendOptions::local_rank), one stream per backend:
//   - memory: cudaMalloc (never managed memory), zero-filled; Allocate failing is one Error
//     (exit 1) naming the bytes asked and what cudaMemGetInfo says is free of the total.
//   - copies: synchronous (cudaMemcpyAsync on the stream, then a wait): a first version.
//   - kernels: compute/cuda/cuda_kernels.h (their determinism), matrix products: gemm.h.
//   - precision: kFloat32 and kBfloat16 (bf16 operands, fp32 accumulation and outputs).
// Building it needs no GPU: the factory, not the build or the binary's start, asks the driver,
// and without a GPU it fails in one line (exit 2) naming training.device and what
// cudaGetDeviceCount said.
#pragma once

#include <memory>
#include <string>

#include "compute/backend.h"

namespace crucible::cuda {

// Whether a CUDA GPU can be used here; when not, `why` says what the runtime answered.
bool GpuAvailable(std::string* why);

std::unique_ptr<ComputeBackend> MakeCudaBackend(const BackendOptions& options);

}  // namespace crucible::cuda
