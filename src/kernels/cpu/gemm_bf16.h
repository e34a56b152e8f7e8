// bf16 matrix products on the CPU's own bf16 instructions, the native path of the CPU backend's
// bf16 compute (compute/backend.h "Precision"). Two kernels share one packing and one tiling:
//   kAvx512Bf16  vdpbf16ps (AVX-512 BF16): a 6 x 32 register micro-kernel;
//   kAmx         tdpbf16ps (AMX-BF16): 32 x 32 blocks of four 16 x 16 accumulator tiles.
// matmul.cc packs each operand of a product once (pack_bf16_a, pack_bf16_b: rounded to bf16 and
// laid out as the kernel reads them), cuts the output into tiles and calls gemm_bf16_tile once
// per tile, single-threaded, exactly as it calls sgemm for fp32.
//
// Arithmetic: each operand is rounded to bf16 (ties to even, RoundToBfloat16's bits, so the
// operands equal the emulated path's) and each output element is an fp32 sum over k that starts
// from C (beta 1) or 0 (beta 0) and walks k in index order, in a way fixed by K alone, so the
// bits are the same for any tiling or thread count:
// - kAvx512Bf16: one fp32 chain; for each pair k = 2p, 2p+1: acc = (acc + a[2p+1] b[2p+1]) +
//   a[2p] b[2p] (vdpbf16ps as Intel defines it: each bf16 x bf16 product exact, each add
//   rounded to nearest even; a CPU may round the pair differently, which the bound below covers),
//   denormal inputs and outputs flushed to zero (vdpbf16ps ignores MXCSR).
// - kAmx: one tdpbf16ps per 16 pairs (zero past K): acc = dp16(acc, 16 pairs). Intel's
//   pseudo-code writes dp16 as 32 rounded adds, but the hardware does not round that way
//   (measured on a Xeon with AMX, 2026-12-02: one pair alone gives round(acc + round(a0 b0 +
//   a1 b1)); sixteen match neither order of the rounded chain in about half the outputs). Its
//   result is a function of its inputs, so the chain of instructions over K is as fixed as the
//   vdpbf16ps chain; the two kernels' bits differ.
// Both walk K in blocks with the fp32 accumulator stored to C and reloaded between blocks, which
// is exact (kAvx512Bf16: 128 pairs; kAmx: 1024 pairs, a whole number of instructions). They differ
// from the emulated path (OpenBLAS sgemm's blocked order on the same bf16 values, C added last)
// by summation order and denormals only: |native - emulated| <= 2 K 2^-24 sum_k |a_k b_k| when no
// denormal is involved (tests/unit/kernels/bf16_test.cc, both kernels).
#pragma once

#include <cstdint>
#include <vector>

namespace crucible::kernels {

// Which native kernel a product runs; kOff: none (fp32 sgemm, the emulated path's products).
enum class Bf16Gemm { kOff, kAvx512Bf16, kAmx };
const char* Bf16GemmName(Bf16Gemm gemm);  // "off", "avx512_bf16", "amx"

// True when this CPU executes AVX-512 F, BW and BF16 (cpuid, checked once).
bool cpu_has_avx512_bf16();
// True when this CPU has AVX-512 BF16, AMX-TILE and AMX-BF16 (cpuid) and the kernel let this
// process use the tile registers (Linux's arch_prctl(ARCH_REQ_XCOMP_PERM), asked once, here).
bool cpu_has_amx_bf16();
// Whether `gemm` can run here (kOff always).
bool Bf16GemmAvailable(Bf16Gemm gemm);

// Columns of a packed B panel: two zmm of accumulators per row (kAvx512Bf16), two B tiles (kAmx).
constexpr int64_t kBf16Panel = 32;

// Storage for a packed operand, 64-byte aligned, grown to the largest request and then reused.
class Bf16PackBuffer {
 public:
  uint32_t* Words(int64_t n);  // n words, contents unspecified; valid until the next call

 private:
  std::vector<uint32_t> storage_;
};

// op(A) (M,K) as pair words, word = bf16(a[i][2p]) | bf16(a[i][2p+1]) << 16 (zero past K) at
// words[i * row_stride + p * pair_stride]. kAmx: always row-major (pair_stride 1), rows padded
// with zero words to a multiple of 32 and pairs to a multiple of 16.
struct Bf16PackedA {
  const uint32_t* words;
  int64_t row_stride, pair_stride;
};
// op(B) (K,N) as panels of kBf16Panel columns: word (p, j) = bf16(b[2p][j]) | bf16(b[2p+1][j]) <<
// 16 (zero past K or N; pairs padded with zero words to a multiple of 16) at
// words[j / kBf16Panel * panel_stride + p * kBf16Panel + j % kBf16Panel].
struct Bf16PackedB {
  const uint32_t* words;
  int64_t panel_stride;
};

// op(A) = A (M,K) row-major with leading dimension lda, or A^T for A (K,M) when trans_a; op(B)
// likewise (B^T for B (N,K) when trans_b). OpenMP over rows or pairs (elementwise: any thread
// count gives the same words). The result points into `buffer`. Require
// Bf16GemmAvailable(gemm) and gemm != kOff.
Bf16PackedA pack_bf16_a(Bf16Gemm gemm, bool trans_a, int64_t M, int64_t K, const float* A,
                        int64_t lda, Bf16PackBuffer& buffer);
Bf16PackedB pack_bf16_b(bool trans_b, int64_t N, int64_t K, const float* B, int64_t ldb,
                        Bf16PackBuffer& buffer);

// The output tile rows [i0, i0 + rows) x columns [j0, j0 + cols) of C = op(A) op(B) + (beta ?
// C : 0): C points at the tile's first element, row-major with leading dimension ldc. j0 is a
// multiple of kBf16Panel, and for kAmx i0 a multiple of 32. `a` was packed for `gemm`.
// Single-threaded; requires Bf16GemmAvailable(gemm) and gemm != kOff.
void gemm_bf16_tile(Bf16Gemm gemm, const Bf16PackedA& a, const Bf16PackedB& b, int64_t i0,
                    int64_t j0, int64_t rows, int64_t cols, int64_t K, bool beta, float* C,
                    int64_t ldc);

// ---- AMX products of small tiles (attention's, kernels/cpu/attention.cc) ----
// Single-threaded, on the calling thread, between amx_tiles_begin() and amx_tiles_end(); require
// cpu_has_amx_bf16(). The bits follow kAmx's: one tdpbf16ps per 16 pairs, in order, from C or 0.
void amx_tiles_begin();  // loads the tile configuration
void amx_tiles_end();    // releases the tiles
// C (m x n, leading dimension ldc floats) = (accumulate ? C : 0) + A B over `pairs` pairs: A as
// pair words along the inner index, rows of stride lda (RoundUp32(m) rows of RoundUp16(pairs)
// words, zero past), B as one row of pair words per pair, stride ldb (RoundUp16(pairs) rows of
// RoundUp32(n) words, zero past). Blocks cut at m or n go through a buffer.
void amx_tile_product(const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb, int64_t pairs,
                      float* c, int64_t ldc, int64_t m, int64_t n, bool accumulate);
// The operands in those layouts, rounded to bf16 and zero-padded as amx_tile_product reads them:
// x is a rows x k (or k x cols) block, row-major with leading dimension ld.
//   pack_pairs_rows                A of x (rows x k):    dst[i][p] = x[i][2p], x[i][2p+1]
//   pack_pairs_columns             B of x (k x cols):    dst[p][j] = x[2p][j], x[2p+1][j]
//   pack_pairs_rows_transposed     B of x^T (x rows x k):  dst[p][j] = x[j][2p], x[j][2p+1]
//   pack_pairs_columns_transposed  A of x^T (x k x cols): dst[i][p] = x[2p][i], x[2p+1][i]
void pack_pairs_rows(const float* x, int64_t ld, int64_t rows, int64_t k, uint32_t* dst,
                     int64_t ldd);
void pack_pairs_columns(const float* x, int64_t ld, int64_t k, int64_t cols, uint32_t* dst,
                        int64_t ldd);
void pack_pairs_rows_transposed(const float* x, int64_t ld, int64_t rows, int64_t k, uint32_t* dst,
                                int64_t ldd);
void pack_pairs_columns_transposed(const float* x, int64_t ld, int64_t k, int64_t cols,
                                   uint32_t* dst, int64_t ldd);
// The paddings above (and the packed operands' of gemm_bf16_tile): n rounded up to 16 or 32.
constexpr int64_t RoundUp16(int64_t n) {
  return (n + 15) / 16 * 16;
}
constexpr int64_t RoundUp32(int64_t n) {
  return (n + 31) / 32 * 32;
}

}  // namespace crucible::kernels
