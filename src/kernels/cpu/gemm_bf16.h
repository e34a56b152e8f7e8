// One output tile of a bf16 matrix product on AVX-512 BF16 (vdpbf16ps), the native path of the
// CPU backend's bf16 compute (compute/backend.h "Precision"). matmul.cc cuts a product into tiles
// and calls this once per tile, single-threaded, exactly as it calls sgemm for fp32.
//
// Arithmetic: each operand is rounded to bf16 (ties to even, RoundToBfloat16's bits, so the
// operands equal the emulated path's), then every output element is one fp32 chain over k in
// index order: acc = C (beta 1) or 0 (beta 0); for each pair k = 2p, 2p+1:
// acc = (acc + a[2p+1] b[2p+1]) + a[2p] b[2p] in Intel's definition of vdpbf16ps (each bf16 x bf16
// product exact, each add rounded to nearest even; a CPU may round the pair differently, which
// the tolerance below covers), with denormal inputs and outputs flushed to zero (vdpbf16ps
// ignores MXCSR). The order depends on K alone, so the bits are the same for any tiling or thread
// count. It differs from the emulated path (OpenBLAS sgemm's blocked order on the same bf16 values,
// C added last) only by summation order and denormals: |native - emulated| <= 2 K 2^-24 sum_k |a_k
// b_k| when no denormal is involved (tests/unit/kernels/bf16_test.cc).
#pragma once

#include <cstdint>

namespace crucible::kernels {

// True when this CPU executes AVX-512 F and AVX-512 BF16 (cpuid, checked once).
bool cpu_has_avx512_bf16();

// C (M,N) = op(A) (M,K) op(B) (K,N) + (beta ? C : 0), row-major, as cblas_sgemm with alpha 1
// and beta 0 or 1. Single-threaded; requires cpu_has_avx512_bf16().
void gemm_bf16_tile(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
                    int64_t lda, const float* B, int64_t ldb, bool beta, float* C, int64_t ldc);

}  // namespace crucible::kernels
