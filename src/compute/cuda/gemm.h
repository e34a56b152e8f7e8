// Matrix products through cuBLASLt, column-major: D (m,n) = op(A) op(B) + beta D, fp32 output,
// fp32 accumulation (CUBLAS_COMPUTE_32F: no TF32), operands fp32 or bf16.
//
// Determinism: for each shape (m, n, k, transposes, leading dimensions, operand type, pointer
// alignments) the heuristic's first algorithm is asked once and cached, so every call of a shape
// runs the same algorithm. The preference allows no split-K reduction in place in the output
// (CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = NONE; where the heuristic then offers nothing, the
// out-of-place schemes COMPUTE_TYPE | OUTPUT_TYPE, which reduce in the workspace in a fixed
// order). The workspace is one fixed buffer; one stream. cuBLAS promises the same bits run to run
// on GPUs of one architecture and SM count under these conditions (cuBLAS docs, "Results
// reproducibility"); the GPU tests check it.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>

namespace crucible::cuda {

class LtGemm {
 public:
  LtGemm(cudaStream_t stream, void* workspace, size_t workspace_bytes);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // A and B are float (bf16 false) or __nv_bfloat16 (bf16 true) device arrays, D float.
  // transa: A is stored (k, m) and used transposed; else stored (m, k). transb likewise with
  // (n, k) / (k, n). beta 0 overwrites D, 1 adds to it.
  void Multiply(bool bf16, bool transa, bool transb, int64_t m, int64_t n, int64_t k, const void* A,
                int64_t lda, const void* B, int64_t ldb, float* D, int64_t ldd, float beta);

 private:
  using Key = std::tuple<bool, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                         int, int, int, bool>;
  const cublasLtMatmulAlgo_t& Algorithm(const Key& key, cublasLtMatmulDesc_t desc,
                                        cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                        cublasLtMatrixLayout_t d, int align_a, int align_b,
                                        int align_d);

  cudaStream_t stream_;
  void* workspace_;
  size_t workspace_bytes_;
  cublasLtHandle_t handle_ = nullptr;
  std::map<Key, cublasLtMatmulAlgo_t> algorithms_;
};

}  // namespace crucible::cuda
