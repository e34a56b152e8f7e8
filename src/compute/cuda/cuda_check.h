// Error checks for CUDA runtime and cuBLASLt calls: a failure throws crucible::Error (exit 1)
// naming the call, the file:line and the runtime's own message. Kernel launches are checked with
// CRUCIBLE_CUDA_LAUNCHED() right after the <<<...>>>.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "common/error.h"

namespace crucible::cuda {

[[noreturn]] void ThrowCudaError(cudaError_t status, const char* call, const char* file, int line);
[[noreturn]] void ThrowCublasError(cublasStatus_t status, const char* call, const char* file,
                                   int line);

}  // namespace crucible::cuda

#define CRUCIBLE_CUDA_CHECK(call)                                                    \
  do {                                                                               \
    cudaError_t crucible_status_ = (call);                                           \
    if (crucible_status_ != cudaSuccess)                                             \
      ::crucible::cuda::ThrowCudaError(crucible_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define CRUCIBLE_CUBLAS_CHECK(call)                                                    \
  do {                                                                                 \
    cublasStatus_t crucible_status_ = (call);                                          \
    if (crucible_status_ != CUBLAS_STATUS_SUCCESS)                                     \
      ::crucible::cuda::ThrowCublasError(crucible_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define CRUCIBLE_CUDA_LAUNCHED() CRUCIBLE_CUDA_CHECK(cudaGetLastError())
