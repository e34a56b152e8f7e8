// Linear layers through OpenBLAS sgemm (row-major, Hugging Face weight layout (OC, C)).
//
// OpenBLAS's own threading does not give the same bits for every thread count: for some shapes
// the threaded driver blocks the inner dimension differently from the single-threaded one
// (tests/unit/kernels shows a 200x96x1000 case). So every product here is cut into output
// tiles whose sizes depend only on the matrix shape; each tile is one single-threaded sgemm
// (OpenBLAS's OpenMP build runs single-threaded inside a parallel region), and the OpenMP loop
// over tiles decides only who computes a tile, never how.
#include <cblas.h>

#include <algorithm>

#include "common/profile.h"
#include "kernels/cpu/kernels.h"

namespace crucible::kernels {
namespace {

constexpr int64_t kTileRows = 128;
constexpr int64_t kTileCols = 512;

// C (M,N) = alpha * op(A) (M,K) * op(B) (K,N) + beta * C, row-major, tiled over C.
void gemm_tiled(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
                int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const int64_t row_tiles = (M + kTileRows - 1) / kTileRows;
  const int64_t col_tiles = (N + kTileCols - 1) / kTileCols;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t tile = 0; tile < row_tiles * col_tiles; ++tile) {
    const int64_t i0 = (tile / col_tiles) * kTileRows, j0 = (tile % col_tiles) * kTileCols;
    const int64_t rows = std::min(kTileRows, M - i0), cols = std::min(kTileCols, N - j0);
    const float* a = trans_a ? A + i0 : A + i0 * lda;
    const float* b = trans_b ? B + j0 * ldb : B + j0;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, rows, cols, K, 1.0f, a, lda, b, ldb, beta,
                C + i0 * ldc + j0, ldc);
  }
}

}  // namespace

void matmul_forward(float* out, const float* inp, const float* weight, int64_t N, int64_t C,
                    int64_t OC) {
  ScopedKernelTimer profile_timer("matmul");
  gemm_tiled(false, true, N, OC, C, inp, C, weight, C, 0.0f, out, OC);
}

void matmul_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                     const float* weight, int64_t N, int64_t C, int64_t OC, bool accumulate_dinp,
                     bool accumulate_dweight) {
  ScopedKernelTimer profile_timer("matmul_backward");
  // dinp (N,C) = dout (N,OC) @ weight (OC,C)
  if (dinp)
    gemm_tiled(false, false, N, C, OC, dout, OC, weight, C, accumulate_dinp ? 1.0f : 0.0f, dinp, C);
  // dweight (OC,C) = dout^T (OC,N) @ inp (N,C)
  gemm_tiled(true, false, OC, C, N, dout, OC, inp, C, accumulate_dweight ? 1.0f : 0.0f, dweight, C);
}

}  // namespace crucible::kernels
