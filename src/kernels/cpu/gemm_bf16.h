// A bf16 matrix product on AVX-512 BF16 (vdpbf16ps), the native path of the CPU backend's bf16
// compute (compute/backend.h "Precision"). matmul.cc packs each operand of a product once
// (pack_bf16_a, pack_bf16_b: rounded to bf16 and laid out as the micro-kernel reads them), cuts
// the output into tiles and calls gemm_bf16_tile once per tile, single-threaded, exactly as it
// calls sgemm for fp32.
//
// Arithmetic: each operand is rounded to bf16 (ties to even, RoundToBfloat16's bits, so the
// operands equal the emulated path's), then every output element is one fp32 chain over k in
// index order: acc = C (beta 1) or 0 (beta 0); for each pair k = 2p, 2p+1:
// acc = (acc + a[2p+1] b[2p+1]) + a[2p] b[2p] in Intel's definition of vdpbf16ps (each bf16 x bf16
// product exact, each add rounded to nearest even; a CPU may round the pair differently, which
// the tolerance below covers), with denormal inputs and outputs flushed to zero (vdpbf16ps
// ignores MXCSR). K is walked in blocks of 128 pairs with the accumulator stored to C in fp32
// and reloaded between blocks, which is exact: the chain is the same as without blocks. The
// order depends on K alone, so the bits are the same for any tiling or thread count. It differs
// from the emulated path (OpenBLAS sgemm's blocked order on the same bf16 values, C added last)
// only by summation order and denormals: |native - emulated| <= 2 K 2^-24 sum_k |a_k b_k| when
// no denormal is involved (tests/unit/kernels/bf16_test.cc).
#pragma once

#include <cstdint>
#include <vector>

namespace crucible::kernels {

// True when this CPU executes AVX-512 F, BW and BF16 (cpuid, checked once).
bool cpu_has_avx512_bf16();

// Columns of a packed B panel: the micro-kernel's two zmm of fp32 accumulators per row.
constexpr int64_t kBf16Panel = 32;

// Storage for a packed operand, 64-byte aligned, grown to the largest request and then reused.
class Bf16PackBuffer {
 public:
  uint32_t* Words(int64_t n);  // n words, contents unspecified; valid until the next call

 private:
  std::vector<uint32_t> storage_;
};

// op(A) (M,K) as pair words, word = bf16(a[i][2p]) | bf16(a[i][2p+1]) << 16 (zero past K) at
// words[i * row_stride + p * pair_stride].
struct Bf16PackedA {
  const uint32_t* words;
  int64_t row_stride, pair_stride;
};
// op(B) (K,N) as panels of kBf16Panel columns: word (p, j) = bf16(b[2p][j]) | bf16(b[2p+1][j]) <<
// 16 (zero past K or N) at words[j / kBf16Panel * panel_stride + p * kBf16Panel + j % kBf16Panel].
struct Bf16PackedB {
  const uint32_t* words;
  int64_t panel_stride;
};

// op(A) = A (M,K) row-major with leading dimension lda, or A^T for A (K,M) when trans_a; op(B)
// likewise (B^T for B (N,K) when trans_b). OpenMP over rows or pairs (elementwise: any thread
// count gives the same words). The result points into `buffer`. Require cpu_has_avx512_bf16().
Bf16PackedA pack_bf16_a(bool trans_a, int64_t M, int64_t K, const float* A, int64_t lda,
                        Bf16PackBuffer& buffer);
Bf16PackedB pack_bf16_b(bool trans_b, int64_t N, int64_t K, const float* B, int64_t ldb,
                        Bf16PackBuffer& buffer);

// The output tile rows [i0, i0 + rows) x columns [j0, j0 + cols) of C = op(A) op(B) + (beta ?
// C : 0): C points at the tile's first element, row-major with leading dimension ldc. j0 is a
// multiple of kBf16Panel. Single-threaded; requires cpu_has_avx512_bf16().
void gemm_bf16_tile(const Bf16PackedA& a, const Bf16PackedB& b, int64_t i0, int64_t j0,
                    int64_t rows, int64_t cols, int64_t K, bool beta, float* C, int64_t ldc);

}  // namespace crucible::kernels
