#include "kernels/cpu/gemm_library.h"

#include <cblas.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <cstdio>
#include <cstdlib>

#include "common/error.h"

namespace crucible::kernels {
namespace {

std::string& Rule() {
  static std::string rule = "auto";
  return rule;
}

}  // namespace

const char* GemmLibraryName(GemmLibrary library) {
  return library == GemmLibrary::kOnednn ? "onednn" : "openblas";
}

const char* GemmIsaName(GemmIsa isa) {
  return isa == GemmIsa::kAvx512 ? "avx512" : "avx2";
}

GemmIsa gemm_isa() {
  static const GemmIsa isa = [] {
    const unsigned effective = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
    const unsigned avx512 = static_cast<unsigned>(dnnl_cpu_isa_avx512_core);
    // oneDNN's ISA values are bit sets: each includes the bits of the ISAs below it.
    return (effective & avx512) == avx512 ? GemmIsa::kAvx512 : GemmIsa::kAvx2;
  }();
  return isa;
}

// Measured per tile (docs/performance.md "GEMM libraries": `small`'s shapes, 4096 rows, tiles of
// 256 x 512, one thread per tile). AVX-512: oneDNN's avx512_core kernels were as fast or faster
// than OpenBLAS's SkylakeX ones on every shape but the head's weight gradient (a tie), so oneDNN
// everywhere. AVX2: OpenBLAS's Haswell kernels and oneDNN's avx2 ones were within 5% of each
// other on the forward and dinp products, and oneDNN's weight gradients were far slower (its
// 8192 x 512 one less than half OpenBLAS's rate), so OpenBLAS (the golden's library) everywhere.
GemmLibrary ChooseGemmLibrary(GemmIsa isa, GemmProduct product, int64_t M, int64_t N, int64_t K) {
  (void)product, (void)M, (void)N, (void)K;
  return isa == GemmIsa::kAvx512 ? GemmLibrary::kOnednn : GemmLibrary::kOpenblas;
}

void SetGemmLibraryRule(const std::string& rule) {
  if (rule != "auto" && rule != "openblas" && rule != "onednn")
    throw UsageError("debug.gemm_library: expected auto, openblas or onednn, got '" + rule + "'");
  Rule() = rule;
}

const std::string& GemmLibraryRule() {
  return Rule();
}

GemmLibrary GemmLibraryFor(GemmProduct product, int64_t M, int64_t N, int64_t K) {
  const std::string& rule = Rule();
  if (rule == "openblas") return GemmLibrary::kOpenblas;
  if (rule == "onednn") return GemmLibrary::kOnednn;
  return ChooseGemmLibrary(gemm_isa(), product, M, N, K);
}

std::string GemmLibrarySummary() {
  return "gemm=" + Rule() + " gemm_isa=" + GemmIsaName(gemm_isa());
}

void gemm_tile(GemmLibrary library, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
               const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
               int64_t ldc) {
  if (library == GemmLibrary::kOpenblas) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  // oneDNN's sgemm runs on one thread inside an active parallel region; inside an inactive one (a
  // team of one) it would ask omp_get_max_threads() for more. Setting this implicit task's
  // nthreads-var to 1 (it ends with the task) keeps the call on this thread in both cases.
  omp_set_num_threads(1);
  const dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, 1.0f,
                                          A, lda, B, ldb, beta, C, ldc);
  if (status != dnnl_success) {
    // Only invalid arguments fail, a bug in the caller; no exception may leave a parallel region.
    std::fprintf(stderr, "dnnl_sgemm(%lld x %lld x %lld) failed: status %d\n", (long long)M,
                 (long long)N, (long long)K, static_cast<int>(status));
    std::abort();
  }
}

}  // namespace crucible::kernels
