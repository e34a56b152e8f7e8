// The AVX-512 BF16 product (gemm_bf16.h). Each operand is packed once per product into bf16 pair
// words, vectorised: A row-major (pair-major when A is transposed, so both packings store whole
// vectors), B as panels of 32 columns, each pair's 32 words contiguous (odd K padded with a zero).
// A tile is walked in column strips of 128 and, inside a strip, K blocks of 128 pairs; a 6 x 32
// micro-kernel keeps 12 accumulators in registers and walks a block's pairs in order. Between
// blocks the accumulators go through C in fp32, which is exact, so every output's chain is the
// same as with one block. A block of a B panel (16 KiB) stays in L1 while the rows sweep it, the
// strip of C (at most 256 x 128 fp32) in L2 while the blocks pass.
//
// The build targets x86-64-v3: only the functions marked AVX512_BF16 use the wider instructions,
// and they run only after cpu_has_avx512_bf16() (every such CPU also has AVX-512 BW).
#include "kernels/cpu/gemm_bf16.h"

#include <immintrin.h>

#include <algorithm>
#include <vector>

namespace crucible::kernels {
namespace {

#define AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

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

constexpr int64_t RoundUp16(int64_t n) {
  return (n + 15) / 16 * 16;
}

AVX512_BF16 Bf16PackedA PackA(bool trans_a, int64_t M, int64_t K, const float* A, int64_t lda,
                              Bf16PackBuffer& buffer) {
  const int64_t pairs = (K + 1) / 2;
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
  const int64_t panel_stride = pairs * kBf16Panel;
  uint32_t* pack = buffer.Words(panels * panel_stride);
  if (!trans_b) {
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < pairs; ++p) {
      const float* even = B + 2 * p * ldb;
      const float* odd = 2 * p + 1 < K ? even + ldb : nullptr;
      for (int64_t panel = 0; panel < panels; ++panel)
        for (int64_t half = 0; half < 2; ++half) {
          const int64_t j = panel * kBf16Panel + half * 16;
          const int64_t n = std::clamp<int64_t>(N - j, 0, 16);
          _mm512_store_si512(
              pack + panel * panel_stride + p * kBf16Panel + half * 16,
              n ? PairsAcross(even + j, odd ? odd + j : nullptr, n) : _mm512_setzero_si512());
        }
    }
    return {pack, panel_stride};
  }
#pragma omp parallel for schedule(static)
  for (int64_t panel = 0; panel < panels; ++panel) {
    alignas(64) uint32_t words[16];
    for (int64_t jj = 0; jj < kBf16Panel; ++jj) {
      const int64_t j = panel * kBf16Panel + jj;
      uint32_t* column = pack + panel * panel_stride + jj;
      for (int64_t q = 0; q < pairs; q += 16) {
        if (j < N)
          _mm512_store_si512(words,
                             PairsAlong(B + j * ldb + 2 * q, std::min<int64_t>(32, K - 2 * q)));
        else
          _mm512_store_si512(words, _mm512_setzero_si512());
        for (int64_t t = 0; t < std::min<int64_t>(16, pairs - q); ++t)
          column[(q + t) * kBf16Panel] = words[t];
      }
    }
  }
  return {pack, panel_stride};
}

}  // namespace

uint32_t* Bf16PackBuffer::Words(int64_t n) {
  if (storage_.size() < static_cast<size_t>(n + 16)) storage_.resize(n + 16);
  const uintptr_t address = reinterpret_cast<uintptr_t>(storage_.data());
  return storage_.data() + ((64 - address % 64) % 64) / 4;
}

bool cpu_has_avx512_bf16() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512bf16");
  return has;
}

Bf16PackedA pack_bf16_a(bool trans_a, int64_t M, int64_t K, const float* A, int64_t lda,
                        Bf16PackBuffer& buffer) {
  return PackA(trans_a, M, K, A, lda, buffer);
}

Bf16PackedB pack_bf16_b(bool trans_b, int64_t N, int64_t K, const float* B, int64_t ldb,
                        Bf16PackBuffer& buffer) {
  return PackB(trans_b, N, K, B, ldb, buffer);
}

void gemm_bf16_tile(const Bf16PackedA& a, const Bf16PackedB& b, int64_t i0, int64_t j0,
                    int64_t rows, int64_t cols, int64_t K, bool beta, float* C, int64_t ldc) {
  if (K == 0) {
    if (!beta)
      for (int64_t i = 0; i < rows; ++i) std::fill(C + i * ldc, C + i * ldc + cols, 0.0f);
    return;
  }
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
