// The attention tile products (attention_tiles.h). A micro-kernel keeps R x NV vector
// accumulators of one output block in registers and walks the inner index once: per step it
// loads NV vectors of B's row p and broadcasts R values of A's column p. AVX-512 blocks are up
// to 6 rows x 4 vectors (64 columns, 24 of the 32 registers); AVX2 blocks up to 6 x 2 (16
// columns, 12 of the 16). The last column block of a row is masked (D or a tile narrower than
// the block), the last row block has fewer rows. Column blocks are the outer loop, so a block's
// strip of B stays in L1 while the row blocks pass it.
//
// The build targets x86-64-v3: only the functions marked AVX512 use the wider instructions, and
// they run only after cpu_has_avx512f().
#include "kernels/cpu/attention_tiles.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>

namespace crucible::kernels {
namespace {

#define AVX512 __attribute__((target("avx512f")))

constexpr int kRows = 6;
// Rows [i0, i0 + R) and columns [j0, j0 + cols) of C, the chain over p in [p_begin, p_end).
using BlockFn = void (*)(const TileProduct&, int64_t i0, int64_t j0, int64_t cols, int64_t p_begin,
                         int64_t p_end);

// ---- AVX-512: NV vectors of 16 columns, the last masked to `cols` - 16 (NV - 1) ----
template <int R, int NV>
AVX512 void Block512(const TileProduct& t, int64_t i0, int64_t j0, int64_t cols, int64_t p_begin,
                     int64_t p_end) {
  __mmask16 mask[NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    const int64_t n = std::min<int64_t>(16, cols - 16 * v);
    mask[v] = n >= 16 ? 0xffff : static_cast<__mmask16>((1u << n) - 1);
  }
  const int64_t ldc = t.ldc, ldb = t.ldb, a_row = t.a_row, a_inner = t.a_inner;
  float* c = t.c + i0 * ldc + j0;
  __m512 acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  if (t.accumulate)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_maskz_loadu_ps(mask[v], c + r * ldc + 16 * v);
  const float* a = t.a + i0 * a_row + p_begin * a_inner;
  const float* b = t.b + j0 + p_begin * ldb;
  for (int64_t p = p_begin; p < p_end; ++p, a += a_inner, b += ldb) {
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_maskz_loadu_ps(mask[v], b + 16 * v);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * a_row]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  const __m512 scale = _mm512_set1_ps(t.scale);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      _mm512_mask_storeu_ps(c + r * ldc + 16 * v, mask[v], _mm512_mul_ps(acc[r][v], scale));
}

// ---- AVX2: NV vectors of 8 columns, the last masked when Masked ----
template <bool Masked>
inline __m256 Load256(const float* x, __m256i mask) {
  return Masked ? _mm256_maskload_ps(x, mask) : _mm256_loadu_ps(x);
}

template <int R, int NV, bool Masked>
void Block256(const TileProduct& t, int64_t i0, int64_t j0, int64_t cols, int64_t p_begin,
              int64_t p_end) {
  const int64_t tail = cols - 8 * (NV - 1);  // columns of the last vector, 1..8
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(tail)),
                                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const int64_t ldc = t.ldc, ldb = t.ldb, a_row = t.a_row, a_inner = t.a_inner;
  float* c = t.c + i0 * ldc + j0;
  __m256 acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_ps();
  if (t.accumulate)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        const float* x = c + r * ldc + 8 * v;
        acc[r][v] = v == NV - 1 ? Load256<Masked>(x, mask) : _mm256_loadu_ps(x);
      }
  const float* a = t.a + i0 * a_row + p_begin * a_inner;
  const float* b = t.b + j0 + p_begin * ldb;
  for (int64_t p = p_begin; p < p_end; ++p, a += a_inner, b += ldb) {
    __m256 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      bv[v] = v == NV - 1 ? Load256<Masked>(b + 8 * v, mask) : _mm256_loadu_ps(b + 8 * v);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * a_row);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  const __m256 scale = _mm256_set1_ps(t.scale);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* x = c + r * ldc + 8 * v;
      const __m256 y = _mm256_mul_ps(acc[r][v], scale);
      if (Masked && v == NV - 1)
        _mm256_maskstore_ps(x, mask, y);
      else
        _mm256_storeu_ps(x, y);
    }
}

// Tables indexed [rows - 1][vectors - 1] (and, for AVX2, [masked]).
template <int R>
constexpr std::array<BlockFn, 4> kRow512 = {Block512<R, 1>, Block512<R, 2>, Block512<R, 3>,
                                            Block512<R, 4>};
constexpr std::array<std::array<BlockFn, 4>, kRows> kTable512 = {
    kRow512<1>, kRow512<2>, kRow512<3>, kRow512<4>, kRow512<5>, kRow512<6>};
template <int R>
constexpr std::array<BlockFn, 4> kRow256 = {Block256<R, 1, false>, Block256<R, 2, false>,
                                            Block256<R, 1, true>, Block256<R, 2, true>};
constexpr std::array<std::array<BlockFn, 4>, kRows> kTable256 = {
    kRow256<1>, kRow256<2>, kRow256<3>, kRow256<4>, kRow256<5>, kRow256<6>};

std::atomic<TileIsa>& SelectedIsa() {
  static std::atomic<TileIsa> isa{cpu_has_avx512f() ? TileIsa::kAvx512 : TileIsa::kAvx2};
  return isa;
}

}  // namespace

bool cpu_has_avx512f() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}

TileIsa tile_isa() {
  return SelectedIsa().load(std::memory_order_relaxed);
}

void set_tile_isa(TileIsa isa) {
  if (isa == TileIsa::kAvx512 && !cpu_has_avx512f()) isa = TileIsa::kAvx2;
  SelectedIsa().store(isa, std::memory_order_relaxed);
}

void tile_product(const TileProduct& t) {
  const bool wide = tile_isa() == TileIsa::kAvx512;
  const int64_t block_cols = wide ? 64 : 16;
  for (int64_t j0 = 0; j0 < t.cols; j0 += block_cols)
    for (int64_t i0 = 0; i0 < t.rows; i0 += kRows) {
      const int64_t rows = std::min<int64_t>(kRows, t.rows - i0);
      int64_t cols = std::min(block_cols, t.cols - j0), p_begin = 0, p_end = t.inner;
      if (t.causal == TileCausal::kOutputsUpToRow) {
        cols = std::min(cols, i0 + rows - j0);
        if (cols <= 0) continue;
      } else if (t.causal == TileCausal::kInnerUpToRow) {
        p_end = std::min(t.inner, i0 + rows);
      } else if (t.causal == TileCausal::kInnerFromRow) {
        p_begin = std::min(t.inner, i0);
      }
      const int64_t vectors = wide ? (cols + 15) / 16 : (cols + 7) / 8;
      const int masked = wide ? 0 : cols % 8 != 0;
      const BlockFn block =
          wide ? kTable512[rows - 1][vectors - 1] : kTable256[rows - 1][2 * masked + vectors - 1];
      block(t, i0, j0, cols, p_begin, p_end);
    }
}

namespace {
// dst rows 0..7 (leading dimension ldd) = the 8 x 8 block at src transposed.
void Transpose8x8(const float* src, int64_t ld, float* dst, int64_t ldd) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * ld);
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i)
    for (int h = 0; h < 2; ++h) {
      r[4 * i + 2 * h] = _mm256_shuffle_ps(t[4 * i + h], t[4 * i + h + 2], 0x44);
      r[4 * i + 2 * h + 1] = _mm256_shuffle_ps(t[4 * i + h], t[4 * i + h + 2], 0xee);
    }
  for (int j = 0; j < 4; ++j) {
    _mm256_storeu_ps(dst + j * ldd, _mm256_permute2f128_ps(r[j], r[j + 4], 0x20));
    _mm256_storeu_ps(dst + (j + 4) * ldd, _mm256_permute2f128_ps(r[j], r[j + 4], 0x31));
  }
}
}  // namespace

void transpose_tile(const float* src, int64_t ld, int64_t rows, int64_t cols, float* dst,
                    int64_t ldd) {
  const int64_t rows8 = rows / 8 * 8, cols8 = cols / 8 * 8;
  for (int64_t i = 0; i < rows8; i += 8)
    for (int64_t j = 0; j < cols8; j += 8)
      Transpose8x8(src + i * ld + j, ld, dst + j * ldd + i, ldd);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = i < rows8 ? cols8 : 0; j < cols; ++j) dst[j * ldd + i] = src[i * ld + j];
}

}  // namespace crucible::kernels
