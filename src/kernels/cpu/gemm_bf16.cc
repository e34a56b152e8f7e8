// The AVX-512 BF16 tile (gemm_bf16.h). The tile is packed once into bf16 pairs: A as rows of
// K/2 pairs, B as panels of 32 columns, K/2 pairs deep (odd K padded with a zero); a 6 x 32
// micro-kernel then keeps 12 accumulators in registers and walks the pairs in order. The build
// targets x86-64-v3: only the functions marked AVX512_BF16 use the wider instructions, and they
// run only after cpu_has_avx512_bf16().
#include "kernels/cpu/gemm_bf16.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace crucible::kernels {
namespace {

#define AVX512_BF16 __attribute__((target("avx512f,avx512bf16")))

constexpr int64_t kPanel = 32;  // columns of a B panel: two zmm of fp32 accumulators
constexpr int kRows = 6;        // rows of the micro-kernel

// The bf16 (upper half) of `value` rounded to nearest even, as RoundToBfloat16 rounds.
inline uint32_t Bf16Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7f800000u) == 0x7f800000u) return bits >> 16;
  return (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
}

// rows x 32 outputs at C; a: rows rows of `pairs` pairs (stride `pairs`); b: one panel.
template <int R>
AVX512_BF16 void MicroKernel(const uint32_t* a, const uint32_t* b, int64_t pairs, float* C,
                             int64_t ldc, int64_t cols, bool beta) {
  __m512 acc[R][2];
  const __mmask16 m0 = cols >= 16 ? 0xffff : (1u << cols) - 1;
  const __mmask16 m1 = cols >= 32 ? 0xffff : cols <= 16 ? 0 : (1u << (cols - 16)) - 1;
  for (int r = 0; r < R; ++r) {
    acc[r][0] = beta ? _mm512_maskz_loadu_ps(m0, C + r * ldc) : _mm512_setzero_ps();
    acc[r][1] = beta ? _mm512_maskz_loadu_ps(m1, C + r * ldc + 16) : _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + p * kPanel);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + p * kPanel + 16);
    for (int r = 0; r < R; ++r) {
      const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[r * pairs + p]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, b1);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(C + r * ldc, m0, acc[r][0]);
    _mm512_mask_storeu_ps(C + r * ldc + 16, m1, acc[r][1]);
  }
}

AVX512_BF16 void RunRows(int rows, const uint32_t* a, const uint32_t* b, int64_t pairs, float* C,
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

}  // namespace

bool cpu_has_avx512_bf16() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  return has;
}

void gemm_bf16_tile(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
                    int64_t lda, const float* B, int64_t ldb, bool beta, float* C, int64_t ldc) {
  const int64_t pairs = (K + 1) / 2;
  const int64_t panels = (N + kPanel - 1) / kPanel;
  // Per-thread packing buffers, kept between calls (a tile is at most 256 x 512).
  thread_local std::vector<uint32_t> a_pack, b_pack;
  a_pack.resize(M * pairs);
  b_pack.resize(panels * pairs * kPanel);
  auto a_at = [&](int64_t i, int64_t k) -> float {
    return k >= K ? 0.0f : trans_a ? A[k * lda + i] : A[i * lda + k];
  };
  auto b_at = [&](int64_t k, int64_t j) -> float {
    return k >= K || j >= N ? 0.0f : trans_b ? B[j * ldb + k] : B[k * ldb + j];
  };
  // A pair word holds element 2p in its low half and 2p+1 in its high half.
  for (int64_t i = 0; i < M; ++i)
    for (int64_t p = 0; p < pairs; ++p)
      a_pack[i * pairs + p] = Bf16Bits(a_at(i, 2 * p)) | Bf16Bits(a_at(i, 2 * p + 1)) << 16;
  for (int64_t panel = 0; panel < panels; ++panel)
    for (int64_t p = 0; p < pairs; ++p)
      for (int64_t jj = 0; jj < kPanel; ++jj) {
        const int64_t j = panel * kPanel + jj;
        b_pack[(panel * pairs + p) * kPanel + jj] =
            Bf16Bits(b_at(2 * p, j)) | Bf16Bits(b_at(2 * p + 1, j)) << 16;
      }
  for (int64_t panel = 0; panel < panels; ++panel) {
    const int64_t j0 = panel * kPanel, cols = std::min(kPanel, N - j0);
    for (int64_t i0 = 0; i0 < M; i0 += kRows)
      RunRows(static_cast<int>(std::min<int64_t>(kRows, M - i0)), a_pack.data() + i0 * pairs,
              b_pack.data() + panel * pairs * kPanel, pairs, C + i0 * ldc + j0, ldc, cols, beta);
  }
}

}  // namespace crucible::kernels
