// The one-line errors of failed CUDA and cuBLASLt calls.
#include "compute/cuda/cuda_check.h"

namespace crucible::cuda {

void ThrowCudaError(cudaError_t status, const char* call, const char* file, int line) {
  throw Error(kExitFailure, std::string("CUDA error ") + cudaGetErrorName(status) + " (" +
                                cudaGetErrorString(status) + ") in " + call + " at " + file + ":" +
                                std::to_string(line));
}

void ThrowCublasError(cublasStatus_t status, const char* call, const char* file, int line) {
  throw Error(kExitFailure, std::string("cuBLASLt error ") + cublasLtGetStatusName(status) + " (" +
                                cublasLtGetStatusString(status) + ") in " + call + " at " + file +
                                ":" + std::to_string(line));
}

}  // namespace crucible::cuda
