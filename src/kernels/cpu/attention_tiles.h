// The products inside attention's tiles (kernels/cpu/attention.cc): register-blocked
// micro-kernels for the small shapes flash attention multiplies (64 x 64 or 64 x D outputs, an
// inner dimension of 64 keys or D), instead of a library sgemm whose call and packing are large
// next to such a tile's arithmetic (bench/kernels_bench AttentionTileProduct compares the two).
//
// The bits: every output is one fixed chain over the inner index, c = fma(a(i,p), b(p,j), c) for
// p = 0, 1, ..., inner - 1, starting at 0 (or at C's value when accumulating), then times `scale`.
// The kernels vectorise across output columns only, so the chain, and with it the result, is the
// same for the AVX-512 path (16 lanes, 6 x 64 blocks) and the AVX2 path (8 lanes, 6 x 16 blocks)
// on any machine: tests/unit/kernels/attention_tiles_test.cc runs both here.
// Each call is single-threaded.
#pragma once

#include <cstdint>

#include "kernels/cpu/vec16.h"  // cpu_has_avx512f

namespace crucible::kernels {

// What a product on a diagonal tile of causal attention (rows and columns, or rows and the inner
// index, number the same positions) may skip. The terms skipped are products with a zero of A,
// so a result differs from the full chain at most in the sign of a zero (or where B holds an
// inf or NaN). The skips follow the row blocks of 6, the same on both paths, so the bits do not
// depend on the vector width either.
enum class TileCausal {
  kNone,
  kOutputsUpToRow,  // only C[i][j] for j <= i are needed: blocks past the diagonal are not written
  kInnerUpToRow,    // A(i, p) = 0 for p > i: a row block's chain stops after its last row
  kInnerFromRow,    // A(i, p) = 0 for p < i: a row block's chain starts at its first row
};

// C (rows x cols, leading dimension ldc) = scale * ([C] + A B), A rows x inner read as
// a[i * a_row + p * a_inner] (a_row = 1 reads A transposed), B inner x cols row-major.
struct TileProduct {
  const float* a;
  int64_t a_row, a_inner;
  const float* b;
  int64_t ldb;
  float* c;
  int64_t ldc;
  int64_t rows, cols, inner;
  bool accumulate;     // the chain starts at C's value, else at 0
  float scale = 1.0f;  // applied once, after the chain
  TileCausal causal = TileCausal::kNone;
};
void tile_product(const TileProduct& product);

// dst[j * ldd + i] = src[i * ld + j] for rows x cols at src: a key tile packed transposed, so
// that Q K^T reads its columns as vectors.
void transpose_tile(const float* src, int64_t ld, int64_t rows, int64_t cols, float* dst,
                    int64_t ldd);

// The instruction set the tile products, the forward's softmax loop (attention.cc) and the decode
// kernels (decode.cc) use: AVX-512 where the CPU has it, else AVX2 (the build's baseline). The
// same bits either way; the setter exists for the tests that check it.
enum class TileIsa { kAvx2, kAvx512 };
TileIsa tile_isa();
// Selects `isa` for later calls (kAvx512 only where cpu_has_avx512f()); not for use while
// attention runs on another thread.
void set_tile_isa(TileIsa isa);

}  // namespace crucible::kernels
