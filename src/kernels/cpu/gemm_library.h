// Which fp32 GEMM library computes the output tiles of a product (kernels/cpu/matmul.cc): OpenBLAS
// (cblas_sgemm) or oneDNN (dnnl_sgemm), each called single-threaded on one tile.
//
// The choice is fixed per machine and shape, never timed at run time: a pure function of the
// vector ISA the libraries run at, the product (forward, dinp, dweight) and its shape, read from a
// table measured on the development machine (docs/performance.md "GEMM libraries"); today's table
// depends on the ISA alone (no product or shape stood out in the measurements). So a product
// is a pure function of (inputs, shapes, ISA, library), and two runs on one machine give the same
// bits. `[debug] gemm_library` can force one library for every product.
//
// The ISA is the one oneDNN reports as effective (cpuid, lowered by DNNL_MAX_CPU_ISA): the smoke
// gate pins DNNL_MAX_CPU_ISA=AVX2 (with OPENBLAS_CORETYPE=Haswell), so on an AVX-512 machine it
// takes the same table row, and the same kernels, as on an AVX2-only one.
#pragma once

#include <cstdint>
#include <string>

namespace crucible::kernels {

enum class GemmLibrary { kOpenblas, kOnednn };
const char* GemmLibraryName(GemmLibrary library);  // "openblas", "onednn"

// The table's rows: AVX2 (with FMA) and AVX-512 (oneDNN's avx512_core or above).
enum class GemmIsa { kAvx2, kAvx512 };
const char* GemmIsaName(GemmIsa isa);  // "avx2", "avx512"
// oneDNN's effective ISA, read once per process.
GemmIsa gemm_isa();

// Which product of a linear layer (kernels.h): out = inp weight^T, dinp = dout weight,
// dweight = dout^T inp.
enum class GemmProduct { kForward, kDinp, kDweight };

// The table: the library of a product of output (M, N) and inner dimension K on `isa`.
GemmLibrary ChooseGemmLibrary(GemmIsa isa, GemmProduct product, int64_t M, int64_t N, int64_t K);

// The process's rule: "auto" (the table at gemm_isa()), "openblas" or "onednn" for every
// product. Set once by the CPU backend from [debug] gemm_library; "auto" until then. Throws
// UsageError (exit 2) naming the key for any other value.
void SetGemmLibraryRule(const std::string& rule);
const std::string& GemmLibraryRule();
// The library matmul.cc uses for a product under the process's rule.
GemmLibrary GemmLibraryFor(GemmProduct product, int64_t M, int64_t N, int64_t K);
// For the phase=start line: "gemm=<rule> gemm_isa=<isa>", e.g. "gemm=auto gemm_isa=avx512".
std::string GemmLibrarySummary();

// C (M,N) = op(A) (M,K) op(B) (K,N) + beta C, row-major, on the calling thread only: one tile.
void gemm_tile(GemmLibrary library, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
               const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
               int64_t ldc);

}  // namespace crucible::kernels
