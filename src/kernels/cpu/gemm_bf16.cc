// The native bf16 products (gemm_bf16.h). Each operand is packed once per product into bf16 pair
// words, vectorised: A row-major (pair-major when A is transposed, for kAvx512Bf16, so both
// packings store whole vectors; kAmx always row-major, a transposed A turned through a 16 x 16
// block of words), B as panels of 32 columns, each pair's 32 words contiguous (odd K padded with a
// zero, the pairs to a multiple of 16).
//
// kAvx512Bf16: a tile is walked in column strips of 128 and, inside a strip, K blocks of 128
// pairs; a 6 x 32 micro-kernel keeps 12 accumulators in registers and walks a block's pairs in
// order. Between blocks the accumulators go through C in fp32, which is exact, so every output's
// chain is the same as with one block. A block of a B panel (16 KiB) stays in L1 while the rows
// sweep it, the strip of C (at most 256 x 128 fp32) in L2 while the blocks pass.
//
// kAmx: eight 16 x 64-byte tiles: four accumulators (a 32 x 32 block of C), two of A (32 rows x 16
// pairs), two of B (16 pairs x 32 columns, the panel's layout as it is: tdpbf16ps reads B as pair
// words, one row per pair). A tile is walked in K blocks of 1024 pairs, inside a block by column
// panels, inside a panel by 32-row blocks, so a panel's block (at most 128 KiB) stays in L2 while
// the rows sweep it (blocks of 64, 128, 256, 512, 1024 and 4096 pairs measured on `small`'s
// shapes: 1024 the fastest: 256 took -2% to +25% longer; docs/performance.md). Blocks of C cut by
// the tile's edge go through a 32 x 32 buffer. Rows of the packed A are an odd multiple of 64 bytes
// apart, so the 16 rows of an A tile do not fall into one L1 set.
//
// The build targets x86-64-v3: only the functions marked AVX512_BF16 or AMX use the wider
// instructions, and they run only after cpu_has_avx512_bf16() or cpu_has_amx_bf16() (every such
// CPU also has AVX-512 BW).
#include "kernels/cpu/gemm_bf16.h"

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace crucible::kernels {
namespace {

#define AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))
#define AMX __attribute__((target("avx512f,avx512bw,avx512bf16,amx-tile,amx-bf16")))

constexpr int kRows = 6;              // rows of the micro-kernel
constexpr int64_t kStripCols = 128;   // columns of C per strip
constexpr int64_t kBlockPairs = 128;  // pairs of K per block

// 16 floats rounded to bf16 as RoundToBfloat16 rounds (nearest even; inf and NaN cut), the bf16
// in the upper half of each 32-bit lane.
AVX512_BF16 inline __m512i RoundedBits(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb =
      _mm512_and_si512(_mm512_maskz_srli_epi32(0xffff, bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  const __m512i exponent = _mm512_set1_epi32(0x7f800000);
  const __mmask16 special = _mm512_cmpeq_epi32_mask(_mm512_and_si512(bits, exponent), exponent);
  return _mm512_mask_blend_epi32(special, rounded, bits);
}

// Pair words of 32 consecutive values: word p = bf16(x[2p]) | bf16(x[2p + 1]) << 16. `n` of the
// 32 are read (n <= 32), the rest are zero.
AVX512_BF16 inline __m512i PairsAlong(const float* x, int64_t n) {
  const __mmask16 m0 = n >= 16 ? 0xffff : (1u << n) - 1;
  const __mmask16 m1 = n >= 32 ? 0xffff : n <= 16 ? 0 : (1u << (n - 16)) - 1;
  const __m512i lo = RoundedBits(_mm512_maskz_loadu_ps(m0, x));
  const __m512i hi = RoundedBits(_mm512_maskz_loadu_ps(m1, x + 16));
  // The upper 16-bit half of each lane: element 2e + 1 of lo:hi.
  const __m512i odd =
      _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27,
                       25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  return _mm512_permutex2var_epi16(lo, odd, hi);
}

// Pair words across two rows: word j = bf16(even[j]) | bf16(odd[j]) << 16 for j < n (n <= 16),
// zero beyond; `odd` may be null (the zero pad of an odd K).
AVX512_BF16 inline __m512i PairsAcross(const float* even, const float* odd, int64_t n) {
  const __mmask16 m = n >= 16 ? 0xffff : (1u << n) - 1;
  const __m512i lo = RoundedBits(_mm512_maskz_loadu_ps(m, even));
  const __m512i hi = odd ? RoundedBits(_mm512_maskz_loadu_ps(m, odd)) : _mm512_setzero_si512();
  return _mm512_or_si512(_mm512_maskz_srli_epi32(0xffff, lo, 16),
                         _mm512_and_si512(hi, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

// rows x 32 outputs at C; b: one panel of `pairs` pairs. beta: C holds the chain so far.
template <int R>
AVX512_BF16 void MicroKernel(Bf16PackedA a, const uint32_t* b, int64_t pairs, float* C, int64_t ldc,
                             int64_t cols, bool beta) {
  __m512 acc[R][2];
  const __mmask16 m0 = cols >= 16 ? 0xffff : (1u << cols) - 1;
  const __mmask16 m1 = cols >= 32 ? 0xffff : cols <= 16 ? 0 : (1u << (cols - 16)) - 1;
  for (int r = 0; r < R; ++r) {
    acc[r][0] = beta ? _mm512_maskz_loadu_ps(m0, C + r * ldc) : _mm512_setzero_ps();
    acc[r][1] = beta ? _mm512_maskz_loadu_ps(m1, C + r * ldc + 16) : _mm512_setzero_ps();
  }
  const uint32_t* row[R];
  for (int r = 0; r < R; ++r) row[r] = a.words + r * a.row_stride;
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_load_si512(b + p * kBf16Panel);
    const __m512bh b1 = (__m512bh)_mm512_load_si512(b + p * kBf16Panel + 16);
    for (int r = 0; r < R; ++r) {
      const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int>(row[r][p * a.pair_stride]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, b1);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(C + r * ldc, m0, acc[r][0]);
    _mm512_mask_storeu_ps(C + r * ldc + 16, m1, acc[r][1]);
  }
}

AVX512_BF16 void RunRows(int rows, Bf16PackedA a, const uint32_t* b, int64_t pairs, float* C,
                         int64_t ldc, int64_t cols, bool beta) {
  switch (rows) {
    case 6:
      return MicroKernel<6>(a, b, pairs, C, ldc, cols, beta);
    case 5:
      return MicroKernel<5>(a, b, pairs, C, ldc, cols, beta);
    case 4:
      return MicroKernel<4>(a, b, pairs, C, ldc, cols, beta);
    case 3:
      return MicroKernel<3>(a, b, pairs, C, ldc, cols, beta);
    case 2:
      return MicroKernel<2>(a, b, pairs, C, ldc, cols, beta);
    default:
      return MicroKernel<1>(a, b, pairs, C, ldc, cols, beta);
  }
}

// kAmx's A rows: the pairs rounded up to 16 words (one A tile's row), plus 16 more when that is
// an even multiple of 16, so that rows are an odd number of 64-byte lines apart.
constexpr int64_t AmxRowStride(int64_t pairs) {
  const int64_t words = RoundUp16(pairs);
  return words % 32 == 0 ? words + 16 : words;
}

// r[t][c] -> r[c][t] for 16 vectors of 16 words: words interleaved, then 64-bit pairs, then the
// 128-bit lanes.
AVX512_BF16 inline void Transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int k = 0; k < 8; ++k) {
    t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
  }
  // u[4g + e], lane L: rows 4g .. 4g + 3 at column 4L + e.
  for (int g = 0; g < 4; ++g) {
    u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int e = 0; e < 4; ++e) {
    const __m512i lo01 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0x44);
    const __m512i lo23 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0x44);
    const __m512i hi01 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0xee);
    const __m512i hi23 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0xee);
    r[e] = _mm512_shuffle_i32x4(lo01, lo23, 0x88);
    r[4 + e] = _mm512_shuffle_i32x4(lo01, lo23, 0xdd);
    r[8 + e] = _mm512_shuffle_i32x4(hi01, hi23, 0x88);
    r[12 + e] = _mm512_shuffle_i32x4(hi01, hi23, 0xdd);
  }
}

AVX512_BF16 Bf16PackedA PackA(Bf16Gemm gemm, bool trans_a, int64_t M, int64_t K, const float* A,
                              int64_t lda, Bf16PackBuffer& buffer) {
  const int64_t pairs = (K + 1) / 2;
  if (gemm == Bf16Gemm::kAmx) {
    // Row-major either way (pack_pairs_rows and pack_pairs_columns_transposed, gemm_bf16.h), the
    // threads on slabs of 32 rows of A: of op(A), or of A (16 pairs) when transposed, so each
    // reads whole rows of A in order.
    const int64_t stride = AmxRowStride(pairs);
    uint32_t* pack = buffer.Words(RoundUp32(M) * stride);
    if (trans_a) {
#pragma omp parallel for schedule(static)
      for (int64_t q = 0; q < RoundUp16(pairs); q += 16)
        pack_pairs_columns_transposed(A + 2 * q * lda, lda, std::min<int64_t>(32, K - 2 * q), M,
                                      pack + q, stride);
    } else {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < M; i += 32)
        pack_pairs_rows(A + i * lda, lda, std::min<int64_t>(32, M - i), K, pack + i * stride,
                        stride);
    }
    return {pack, stride, 1};
  }
  if (!trans_a) {
    const int64_t stride = RoundUp16(pairs);
    uint32_t* pack = buffer.Words(M * stride);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t q = 0; q < pairs; q += 16)
        _mm512_store_si512(pack + i * stride + q,
                           PairsAlong(A + i * lda + 2 * q, std::min<int64_t>(32, K - 2 * q)));
    return {pack, stride, 1};
  }
  const int64_t stride = RoundUp16(M);
  uint32_t* pack = buffer.Words(pairs * stride);
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < pairs; ++p) {
    const float* even = A + 2 * p * lda;
    const float* odd = 2 * p + 1 < K ? even + lda : nullptr;
    for (int64_t i = 0; i < M; i += 16)
      _mm512_store_si512(pack + p * stride + i, PairsAcross(even + i, odd ? odd + i : nullptr,
                                                            std::min<int64_t>(16, M - i)));
  }
  return {pack, 1, stride};
}

AVX512_BF16 Bf16PackedB PackB(bool trans_b, int64_t N, int64_t K, const float* B, int64_t ldb,
                              Bf16PackBuffer& buffer) {
  const int64_t pairs = (K + 1) / 2;
  const int64_t panels = (N + kBf16Panel - 1) / kBf16Panel;
  const int64_t panel_stride = RoundUp16(pairs) * kBf16Panel;
  uint32_t* pack = buffer.Words(panels * panel_stride);
  if (!trans_b) {
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < RoundUp16(pairs); ++p) {
      const float* even = B + 2 * p * ldb;
      const float* odd = 2 * p + 1 < K ? even + ldb : nullptr;
      for (int64_t panel = 0; panel < panels; ++panel)
        for (int64_t half = 0; half < 2; ++half) {
          const int64_t j = panel * kBf16Panel + half * 16;
          const int64_t n = p < pairs ? std::clamp<int64_t>(N - j, 0, 16) : 0;
          _mm512_store_si512(
              pack + panel * panel_stride + p * kBf16Panel + half * 16,
              n ? PairsAcross(even + j, odd ? odd + j : nullptr, n) : _mm512_setzero_si512());
        }
    }
    return {pack, panel_stride};
  }
  // B^T: each panel is B^T's pair rows for 32 rows of B (pack_pairs_rows_transposed, gemm_bf16.h).
#pragma omp parallel for schedule(static)
  for (int64_t panel = 0; panel < panels; ++panel)
    pack_pairs_rows_transposed(B + panel * kBf16Panel * ldb, ldb,
                               std::min(kBf16Panel, N - panel * kBf16Panel), K,
                               pack + panel * panel_stride, kBf16Panel);
  return {pack, panel_stride};
}

// ---- kAmx ----

constexpr int64_t kAmxBlockPairs = 1024;  // pairs of K per block: 64 tdpbf16ps

struct TileConfig {  // LDTILECFG's 64-byte operand, palette 1
  uint8_t palette, start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
static_assert(sizeof(TileConfig) == 64);

// Tiles 0..3: C (rows 0-15 x cols 0-15, 0-15 x 16-31, 16-31 x 0-15, 16-31 x 16-31); 4, 5: A rows
// 0-15, 16-31; 6, 7: B columns 0-15, 16-31. Every tile 16 rows of 64 bytes. A constant in memory:
// GCC 12 drops stores to a local configuration before _tile_loadconfig (it does not see the
// instruction read them), which leaves the tiles unconfigured (SIGILL at the first tile op).
alignas(64) constexpr TileConfig kTileConfig = {
    1, 0, {}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

AMX void ConfigureTiles() {
  _tile_loadconfig(&kTileConfig);
}

// The 32 x 32 block of C at c (leading dimension ldc floats): C (load) or 0, plus `groups` x 16
// pairs of 32 A rows at a (stride a_stride words) and 32 columns of B at b (one row of pair words
// per pair, stride b_stride words).
AMX void AmxBlock(const uint32_t* a, int64_t a_stride, const uint32_t* b, int64_t b_stride,
                  int64_t groups, float* c, int64_t ldc, bool load) {
  const int64_t c_bytes = ldc * 4, a_bytes = a_stride * 4, b_bytes = b_stride * 4;
  if (load) {
    _tile_loadd(0, c, c_bytes);
    _tile_loadd(1, c + 16, c_bytes);
    _tile_loadd(2, c + 16 * ldc, c_bytes);
    _tile_loadd(3, c + 16 * ldc + 16, c_bytes);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t g = 0; g < groups; ++g) {
    _tile_loadd(4, a + g * 16, a_bytes);
    _tile_loadd(5, a + 16 * a_stride + g * 16, a_bytes);
    _tile_loadd(6, b + g * 16 * b_stride, b_bytes);
    _tile_loadd(7, b + g * 16 * b_stride + 16, b_bytes);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, c_bytes);
  _tile_stored(1, c + 16, c_bytes);
  _tile_stored(2, c + 16 * ldc, c_bytes);
  _tile_stored(3, c + 16 * ldc + 16, c_bytes);
}

// AmxBlock for a block of m <= 32 rows and n <= 32 columns of C: a cut block goes through a
// 32 x 32 buffer (the rows and columns past the cut are computed and dropped).
AMX inline void AmxEdgeBlock(const uint32_t* a, int64_t a_stride, const uint32_t* b,
                             int64_t b_stride, int64_t groups, float* c, int64_t ldc, int64_t m,
                             int64_t n, bool load) {
  if (m == 32 && n == 32) return AmxBlock(a, a_stride, b, b_stride, groups, c, ldc, load);
  alignas(64) float edge[32 * 32] = {};
  if (load)
    for (int64_t r = 0; r < m; ++r) std::memcpy(edge + r * 32, c + r * ldc, n * 4);
  AmxBlock(a, a_stride, b, b_stride, groups, edge, 32, load);
  for (int64_t r = 0; r < m; ++r) std::memcpy(c + r * ldc, edge + r * 32, n * 4);
}

AMX void AmxTile(const Bf16PackedA& a, const Bf16PackedB& b, int64_t i0, int64_t j0, int64_t rows,
                 int64_t cols, int64_t K, bool beta, float* C, int64_t ldc) {
  ConfigureTiles();
  const int64_t words = RoundUp16((K + 1) / 2);
  for (int64_t p0 = 0; p0 < words; p0 += kAmxBlockPairs) {
    const int64_t groups = std::min(kAmxBlockPairs, words - p0) / 16;
    const bool load = beta || p0 > 0;
    for (int64_t j = 0; j < cols; j += kBf16Panel) {
      const uint32_t* panel = b.words + (j0 + j) / kBf16Panel * b.panel_stride + p0 * kBf16Panel;
      const int64_t n = std::min<int64_t>(32, cols - j);
      for (int64_t i = 0; i < rows; i += 32)
        AmxEdgeBlock(a.words + (i0 + i) * a.row_stride + p0, a.row_stride, panel, kBf16Panel,
                     groups, C + i * ldc + j, ldc, std::min<int64_t>(32, rows - i), n, load);
    }
  }
  _tile_release();
}

// Asks Linux for the AMX tile data state (XTILEDATA, xstate component 18) for this process.
bool AmxPermitted() {
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

}  // namespace

const char* Bf16GemmName(Bf16Gemm gemm) {
  switch (gemm) {
    case Bf16Gemm::kAvx512Bf16:
      return "avx512_bf16";
    case Bf16Gemm::kAmx:
      return "amx";
    default:
      return "off";
  }
}

uint32_t* Bf16PackBuffer::Words(int64_t n) {
  if (storage_.size() < static_cast<size_t>(n + 16)) storage_.resize(n + 16);
  const uintptr_t address = reinterpret_cast<uintptr_t>(storage_.data());
  return storage_.data() + ((64 - address % 64) % 64) / 4;
}

AMX void amx_tiles_begin() {
  ConfigureTiles();
}

AMX void amx_tiles_end() {
  _tile_release();
}

AMX void amx_tile_product(const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb,
                          int64_t pairs, float* c, int64_t ldc, int64_t m, int64_t n,
                          bool accumulate) {
  const int64_t groups = RoundUp16(pairs) / 16;
  for (int64_t i = 0; i < m; i += 32)
    for (int64_t j = 0; j < n; j += 32)
      AmxEdgeBlock(a + i * lda, lda, b + j, ldb, groups, c + i * ldc + j, ldc,
                   std::min<int64_t>(32, m - i), std::min<int64_t>(32, n - j), accumulate);
}

AVX512_BF16 void pack_pairs_rows(const float* x, int64_t ld, int64_t rows, int64_t k, uint32_t* dst,
                                 int64_t ldd) {
  const int64_t pairs = (k + 1) / 2;
  for (int64_t i = 0; i < RoundUp32(rows); ++i)
    for (int64_t q = 0; q < RoundUp16(pairs); q += 16)
      _mm512_store_si512(dst + i * ldd + q,
                         i < rows
                             ? PairsAlong(x + i * ld + 2 * q, std::clamp<int64_t>(k - 2 * q, 0, 32))
                             : _mm512_setzero_si512());
}

AVX512_BF16 void pack_pairs_columns(const float* x, int64_t ld, int64_t k, int64_t cols,
                                    uint32_t* dst, int64_t ldd) {
  const int64_t pairs = (k + 1) / 2;
  for (int64_t p = 0; p < RoundUp16(pairs); ++p) {
    const float* even = x + 2 * p * ld;
    const float* odd = 2 * p + 1 < k ? even + ld : nullptr;
    for (int64_t j = 0; j < RoundUp32(cols); j += 16) {
      const int64_t n = p < pairs ? std::clamp<int64_t>(cols - j, 0, 16) : 0;
      _mm512_store_si512(dst + p * ldd + j, n ? PairsAcross(even + j, odd ? odd + j : nullptr, n)
                                              : _mm512_setzero_si512());
    }
  }
}

#pragma GCC diagnostic push
// GCC 12's unpack intrinsics pass an undefined vector as the unused source, which
// -W(maybe-)uninitialized reports where Transpose16 is inlined (here and, through these, in PackA
// and PackB).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
AVX512_BF16 void pack_pairs_rows_transposed(const float* x, int64_t ld, int64_t rows, int64_t k,
                                            uint32_t* dst, int64_t ldd) {
  const int64_t pairs = (k + 1) / 2;
  for (int64_t j = 0; j < RoundUp32(rows); j += 16)
    for (int64_t q = 0; q < RoundUp16(pairs); q += 16) {
      __m512i r[16];
      for (int64_t t = 0; t < 16; ++t)
        r[t] = j + t < rows
                   ? PairsAlong(x + (j + t) * ld + 2 * q, std::clamp<int64_t>(k - 2 * q, 0, 32))
                   : _mm512_setzero_si512();
      Transpose16(r);
      for (int64_t c = 0; c < 16; ++c) _mm512_store_si512(dst + (q + c) * ldd + j, r[c]);
    }
}

AVX512_BF16 void pack_pairs_columns_transposed(const float* x, int64_t ld, int64_t k, int64_t cols,
                                               uint32_t* dst, int64_t ldd) {
  // 16 pairs x 16 columns at a time: PairsAcross along 32 rows of x (16 columns at one pair each),
  // turned in registers.
  const int64_t pairs = (k + 1) / 2;
  for (int64_t q = 0; q < RoundUp16(pairs); q += 16)
    for (int64_t i = 0; i < RoundUp32(cols); i += 16) {
      const int64_t n = std::clamp<int64_t>(cols - i, 0, 16);
      __m512i r[16];
      for (int64_t t = 0; t < 16; ++t) {
        const int64_t p = q + t;
        r[t] = _mm512_setzero_si512();
        if (p < pairs && n > 0) {
          const float* even = x + 2 * p * ld + i;
          r[t] = PairsAcross(even, 2 * p + 1 < k ? even + ld : nullptr, n);
        }
      }
      Transpose16(r);
      for (int64_t c = 0; c < 16; ++c) _mm512_store_si512(dst + (i + c) * ldd + q, r[c]);
    }
}
#pragma GCC diagnostic pop

bool cpu_has_avx512_bf16() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512bf16");
  return has;
}

bool cpu_has_amx_bf16() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!cpu_has_avx512_bf16() || !__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    const bool amx_bf16 = edx & (1u << 22), amx_tile = edx & (1u << 24);
    return amx_bf16 && amx_tile && AmxPermitted();
  }();
  return has;
}

bool Bf16GemmAvailable(Bf16Gemm gemm) {
  switch (gemm) {
    case Bf16Gemm::kAvx512Bf16:
      return cpu_has_avx512_bf16();
    case Bf16Gemm::kAmx:
      return cpu_has_amx_bf16();
    default:
      return true;
  }
}

Bf16PackedA pack_bf16_a(Bf16Gemm gemm, bool trans_a, int64_t M, int64_t K, const float* A,
                        int64_t lda, Bf16PackBuffer& buffer) {
  return PackA(gemm, trans_a, M, K, A, lda, buffer);
}

Bf16PackedB pack_bf16_b(bool trans_b, int64_t N, int64_t K, const float* B, int64_t ldb,
                        Bf16PackBuffer& buffer) {
  return PackB(trans_b, N, K, B, ldb, buffer);
}

void gemm_bf16_tile(Bf16Gemm gemm, const Bf16PackedA& a, const Bf16PackedB& b, int64_t i0,
                    int64_t j0, int64_t rows, int64_t cols, int64_t K, bool beta, float* C,
                    int64_t ldc) {
  if (K == 0) {
    if (!beta)
      for (int64_t i = 0; i < rows; ++i) std::fill(C + i * ldc, C + i * ldc + cols, 0.0f);
    return;
  }
  if (gemm == Bf16Gemm::kAmx) return AmxTile(a, b, i0, j0, rows, cols, K, beta, C, ldc);
  // Column strips of kStripCols: the strip of C (at most 256 x 128 fp32) stays in L2 while the
  // K blocks pass through it; each block's B panel stays in L1 while the rows sweep it.
  const int64_t pairs = (K + 1) / 2;
  for (int64_t strip = 0; strip < cols; strip += kStripCols)
    for (int64_t p0 = 0; p0 < pairs; p0 += kBlockPairs) {
      const int64_t block = std::min(kBlockPairs, pairs - p0);
      const bool accumulate = beta || p0 > 0;
      for (int64_t j = strip; j < std::min(cols, strip + kStripCols); j += kBf16Panel) {
        const uint32_t* panel = b.words + (j0 + j) / kBf16Panel * b.panel_stride + p0 * kBf16Panel;
        for (int64_t i = 0; i < rows; i += kRows)
          RunRows(
              static_cast<int>(std::min<int64_t>(kRows, rows - i)),
              {a.words + (i0 + i) * a.row_stride + p0 * a.pair_stride, a.row_stride, a.pair_stride},
              panel, block, C + i * ldc + j, ldc, std::min(kBf16Panel, cols - j), accumulate);
      }
    }
}

}  // namespace crucible::kernels
