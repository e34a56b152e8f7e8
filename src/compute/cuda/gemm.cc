// cuBLASLt matrix products with a cached, fixed algorithm per shape (see gemm.h).
#include "compute/cuda/gemm.h"

#include <string>

#include "compute/cuda/cuda_check.h"

namespace crucible::cuda {
namespace {

// The largest power of two (at most 256) dividing the address: what the heuristic may assume.
int Alignment(const void* pointer) {
  auto address = reinterpret_cast<uintptr_t>(pointer);
  int alignment = 256;
  while (alignment > 1 && address % alignment) alignment /= 2;
  return alignment;
}

struct Layout {
  cublasLtMatrixLayout_t handle = nullptr;
  Layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
    CRUCIBLE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&handle, type, rows, cols, ld));
  }
  ~Layout() { cublasLtMatrixLayoutDestroy(handle); }
};

struct Preference {
  cublasLtMatmulPreference_t handle = nullptr;
  Preference() { CRUCIBLE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&handle)); }
  ~Preference() { cublasLtMatmulPreferenceDestroy(handle); }
  void Set(cublasLtMatmulPreferenceAttributes_t attribute, uint32_t value) {
    CRUCIBLE_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(handle, attribute, &value, sizeof(value)));
  }
  void Set64(cublasLtMatmulPreferenceAttributes_t attribute, uint64_t value) {
    CRUCIBLE_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(handle, attribute, &value, sizeof(value)));
  }
};

}  // namespace

LtGemm::LtGemm(cudaStream_t stream, void* workspace, size_t workspace_bytes)
    : stream_(stream), workspace_(workspace), workspace_bytes_(workspace_bytes) {
  CRUCIBLE_CUBLAS_CHECK(cublasLtCreate(&handle_));
}

LtGemm::~LtGemm() {
  if (handle_) cublasLtDestroy(handle_);
}

const cublasLtMatmulAlgo_t& LtGemm::Algorithm(const Key& key, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t d, int align_a, int align_b,
                                              int align_d) {
  auto found = algorithms_.find(key);
  if (found != algorithms_.end()) return found->second;
  const uint32_t schemes[] = {
      CUBLASLT_REDUCTION_SCHEME_NONE,
      CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE};
  for (uint32_t scheme : schemes) {
    Preference preference;
    preference.Set64(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace_bytes_);
    preference.Set(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, scheme);
    preference.Set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a);
    preference.Set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b);
    preference.Set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d);
    preference.Set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d);
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        handle_, desc, a, b, d, d, preference.handle, 1, &result, &returned);
    if (status == CUBLAS_STATUS_SUCCESS && returned > 0)
      return algorithms_.emplace(key, result.algo).first->second;
  }
  const auto& [bf16, transa, transb, m, n, k, lda, ldb, ldd, aa, ab, ad, accumulate] = key;
  throw Error(kExitFailure, std::string("cuBLASLt has no algorithm for a ") +
                                (bf16 ? "bf16" : "fp32") + " matmul m=" + std::to_string(m) +
                                " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                                " without atomic split-K reductions");
}

void LtGemm::Multiply(bool bf16, bool transa, bool transb, int64_t m, int64_t n, int64_t k,
                      const void* A, int64_t lda, const void* B, int64_t ldb, float* D, int64_t ldd,
                      float beta) {
  if (m == 0 || n == 0) return;
  const cudaDataType_t operand = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  cublasLtMatmulDesc_t desc = nullptr;
  CRUCIBLE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  struct DescGuard {
    cublasLtMatmulDesc_t d;
    ~DescGuard() { cublasLtMatmulDescDestroy(d); }
  } guard{desc};
  const cublasOperation_t op_a = transa ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
  CRUCIBLE_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  CRUCIBLE_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  Layout a(operand, transa ? k : m, transa ? m : k, lda);
  Layout b(operand, transb ? n : k, transb ? k : n, ldb);
  Layout d(CUDA_R_32F, m, n, ldd);
  if (k == 0) {  // an empty sum: D = beta D
    if (beta == 0.0f)
      for (int64_t column = 0; column < n; ++column)
        CRUCIBLE_CUDA_CHECK(
            cudaMemsetAsync(D + column * ldd, 0, static_cast<size_t>(m) * sizeof(float), stream_));
    return;
  }
  const int align_a = Alignment(A), align_b = Alignment(B), align_d = Alignment(D);
  const Key key{bf16, transa, transb,  m,       n,       k,           lda,
                ldb,  ldd,    align_a, align_b, align_d, beta != 0.0f};
  const cublasLtMatmulAlgo_t& algorithm =
      Algorithm(key, desc, a.handle, b.handle, d.handle, align_a, align_b, align_d);
  const float alpha = 1.0f;
  CRUCIBLE_CUBLAS_CHECK(cublasLtMatmul(handle_, desc, &alpha, A, a.handle, B, b.handle, &beta, D,
                                       d.handle, D, d.handle, &algorithm, workspace_,
                                       workspace_bytes_, stream_));
}

}  // namespace crucible::cuda
