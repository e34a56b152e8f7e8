// bf16 compute on the CPU (compute/backend.h "Precision"): the bulk rounding against the scalar
// one; the CPU backend's bf16 linear layers (emulated and native) against a double-precision
// product of the bf16-rounded operands, within the worst-case bound of an fp32 sum,
// 2 K 2^-24 sum_k |a_k b_k| (and farther than that from the fp32 product, so the test sees the
// rounding); the same bits for 1..4 threads; native against emulated within the same bound, for
// each native kernel the CPU has (avx512_bf16, amx); and bf16 attention against a double
// reference that rounds the same operands at the same places (the flash tiles' running maxima
// included).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/bfloat16.h"
#include "common/error.h"
#include "compute/backend.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/gemm_library.h"
#include "kernels/cpu/kernels.h"
#include "kernels_test_util.h"

namespace crucible::kernels {
namespace {

using testing::ExpectThreadIndependent;
using testing::Random;

std::vector<float> Rounded(std::vector<float> x) {
  for (float& v : x) v = RoundToBfloat16(v);
  return x;
}

std::shared_ptr<ComputeBackend> Bf16Backend(const char* path) {
  BackendOptions options;
  options.compute = ComputePrecision::kBfloat16;
  options.bf16_path = path;
  return MakeBackend(options);
}

// The native kernels this CPU runs, by their [debug] bf16_path names.
struct NativeKernel {
  const char* path;
  Bf16Gemm gemm;
};
std::vector<NativeKernel> NativeKernels() {
  std::vector<NativeKernel> kernels;
  for (const NativeKernel k :
       {NativeKernel{"avx512_bf16", Bf16Gemm::kAvx512Bf16}, NativeKernel{"amx", Bf16Gemm::kAmx}})
    if (Bf16GemmAvailable(k.gemm)) kernels.push_back(k);
  return kernels;
}

#define SKIP_WITHOUT_NATIVE_BF16() \
  if (NativeKernels().empty()) GTEST_SKIP() << "this CPU has no AVX-512 BF16"

TEST(Bf16Rounding, BulkEqualsScalarBitForBit) {
  std::vector<float> x = Random(1000, 1, 3.0f);
  const float specials[] = {0.0f,
                            -0.0f,
                            1.0f + 0x1p-8f,
                            1.0f + 0x3p-8f,  // ties, to even
                            1e-40f,
                            -1e-42f,
                            3.4e38f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
  x.insert(x.end(), std::begin(specials), std::end(specials));
  std::vector<float> bulk(x.size());
  RoundToBfloat16(x.data(), bulk.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float scalar = RoundToBfloat16(x[i]);
    EXPECT_EQ(std::memcmp(&scalar, &bulk[i], 4), 0) << "element " << i << " = " << x[i];
  }
  EXPECT_EQ(bulk[x.size() - 8], 1.0f);            // 1 + 2^-8 ties down to even
  EXPECT_EQ(bulk[x.size() - 7], 1.0f + 0x1p-6f);  // 1 + 3 2^-8 ties up to even
}

// C (M,N) = A (M,K) B (N,K)^T in double, and the bound 2 K 2^-24 sum |a b| of each element.
struct Reference {
  std::vector<double> value, bound;
};
Reference Product(const std::vector<float>& a, const std::vector<float>& b, int64_t M, int64_t N,
                  int64_t K) {
  Reference r{std::vector<double>(M * N), std::vector<double>(M * N)};
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double sum = 0, magnitude = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = static_cast<double>(a[i * K + k]) * b[j * K + k];
        sum += p;
        magnitude += std::fabs(p);
      }
      r.value[i * N + j] = sum;
      r.bound[i * N + j] = 2.0 * K * 0x1p-24 * magnitude;
    }
  return r;
}

std::vector<float> Transposed(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<float> t(x.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) t[j * rows + i] = x[i * cols + j];
  return t;
}

// Every element of got within its bound of the reference; and, unless `far` is null, at least one
// element of `far` (the fp32 result) outside it.
void ExpectWithin(const std::vector<float>& got, const Reference& ref,
                  const std::vector<float>* far, const char* what) {
  int outside = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_LE(std::fabs(got[i] - ref.value[i]), ref.bound[i]) << what << " element " << i;
    if (far && std::fabs((*far)[i] - ref.value[i]) > ref.bound[i]) ++outside;
  }
  if (far) {
    EXPECT_GT(outside, 0) << what << ": the fp32 product is as close as the bf16 one";
  }
}

// A linear layer's forward and backward on one bf16 backend: out, dinp, dweight.
struct Linear {
  static constexpr int64_t N = 130, C = 200, OC = 72;  // tiles of every size, odd remainders
  std::vector<float> inp = Random(N * C, 11), weight = Random(OC * C, 12, 0.1f),
                     dout = Random(N * OC, 13);
  std::vector<std::vector<float>> Run(ComputeBackend& backend) const {
    std::vector<float> out(N * OC), dinp(N * C), dweight(OC * C);
    backend.MatmulForward(out.data(), inp.data(), weight.data(), N, C, OC);
    backend.MatmulBackward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(), N,
                           C, OC, false, false);
    return {out, dinp, dweight};
  }
};

void ExpectLinearAgainstReference(const char* path) {
  const Linear l;
  const auto bf16 = l.Run(*Bf16Backend(path));
  const auto fp32 = l.Run(*DefaultCpuBackend());
  const auto in = Rounded(l.inp), w = Rounded(l.weight), d = Rounded(l.dout);
  ExpectWithin(bf16[0], Product(in, w, l.N, l.OC, l.C), &fp32[0], "out");
  ExpectWithin(bf16[1], Product(d, Transposed(w, l.OC, l.C), l.N, l.C, l.OC), &fp32[1], "dinp");
  ExpectWithin(bf16[2], Product(Transposed(d, l.N, l.OC), Transposed(in, l.N, l.C), l.OC, l.C, l.N),
               &fp32[2], "dweight");
}

TEST(Bf16Matmul, EmulatedMatchesDoubleProductOfRoundedOperands) {
  ExpectLinearAgainstReference("emulated");
}

TEST(Bf16Matmul, NativeMatchesDoubleProductOfRoundedOperands) {
  SKIP_WITHOUT_NATIVE_BF16();
  for (const NativeKernel& k : NativeKernels()) {
    SCOPED_TRACE(k.path);
    ExpectLinearAgainstReference(k.path);
  }
}

TEST(Bf16Matmul, NativeWithinSumOrderBoundOfEmulated) {
  SKIP_WITHOUT_NATIVE_BF16();
  for (const NativeKernel& k : NativeKernels()) {
    SCOPED_TRACE(k.path);
    const Linear l;
    const auto native = l.Run(*Bf16Backend(k.path));
    const auto emulated = l.Run(*Bf16Backend("emulated"));
    const auto in = Rounded(l.inp), w = Rounded(l.weight), d = Rounded(l.dout);
    const Reference refs[] = {
        Product(in, w, l.N, l.OC, l.C), Product(d, Transposed(w, l.OC, l.C), l.N, l.C, l.OC),
        Product(Transposed(d, l.N, l.OC), Transposed(in, l.N, l.C), l.OC, l.C, l.N)};
    bool any_different = false;
    for (int t = 0; t < 3; ++t)
      for (size_t i = 0; i < native[t].size(); ++i) {
        ASSERT_LE(std::fabs(native[t][i] - emulated[t][i]), refs[t].bound[i]) << t << ":" << i;
        any_different |= native[t][i] != emulated[t][i];
      }
    // Not a promise, a sanity check that the native path really ran: the sum orders differ.
    EXPECT_TRUE(any_different);
  }
}

TEST(Bf16Matmul, AmxAndAvx512Bf16AgreeWithinTheBoundButAreNotTheSameKernel) {
  if (!cpu_has_amx_bf16()) GTEST_SKIP() << "this CPU has no AMX-BF16";
  const Linear l;
  const auto amx = l.Run(*Bf16Backend("amx"));
  const auto avx512 = l.Run(*Bf16Backend("avx512_bf16"));
  const auto in = Rounded(l.inp), w = Rounded(l.weight), d = Rounded(l.dout);
  const Reference refs[] = {
      Product(in, w, l.N, l.OC, l.C), Product(d, Transposed(w, l.OC, l.C), l.N, l.C, l.OC),
      Product(Transposed(d, l.N, l.OC), Transposed(in, l.N, l.C), l.OC, l.C, l.N)};
  int64_t different = 0;
  for (int t = 0; t < 3; ++t)
    for (size_t i = 0; i < amx[t].size(); ++i) {
      ASSERT_LE(std::fabs(amx[t][i] - avx512[t][i]), refs[t].bound[i]) << t << ":" << i;
      different += amx[t][i] != avx512[t][i];
    }
  // tdpbf16ps does not round as the vdpbf16ps chain does (gemm_bf16.h): if every bit were equal,
  // the AMX tiles would not have run.
  EXPECT_GT(different, 0);
}

TEST(Bf16Backend, AutoAndNativePickAmxFirst) {
  const std::string expected = cpu_has_amx_bf16()      ? "amx"
                               : cpu_has_avx512_bf16() ? "avx512_bf16"
                                                       : "emulated";
  for (const char* path : {"auto", "native"}) {
    if (expected == "emulated" && std::string(path) == "native") continue;
    EXPECT_NE(Bf16Backend(path)->Summary().find("bf16_path=" + expected), std::string::npos)
        << path;
  }
  for (const NativeKernel& k :
       {NativeKernel{"avx512_bf16", Bf16Gemm::kAvx512Bf16}, NativeKernel{"amx", Bf16Gemm::kAmx}}) {
    if (Bf16GemmAvailable(k.gemm)) {
      EXPECT_NE(Bf16Backend(k.path)->Summary().find(std::string("bf16_path=") + k.path),
                std::string::npos);
    } else {
      EXPECT_THROW(Bf16Backend(k.path), Error) << k.path;
    }
  }
}

// C = op(A) op(B) + (beta ? C : 0) through gemm_bf16.h's packing and one tile covering C;
// a_values (M,K) and b_values (N,K) are stored transposed or not as trans_a, trans_b ask.
void NativeProduct(Bf16Gemm gemm, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                   const std::vector<float>& a_values, const std::vector<float>& b_values,
                   int64_t k0, int64_t k1, bool beta, std::vector<float>& C) {
  const std::vector<float> A = trans_a ? Transposed(a_values, M, K) : a_values;
  const std::vector<float> B = trans_b ? b_values : Transposed(b_values, N, K);
  // The columns k0 .. k1 of op(A) and rows k0 .. k1 of op(B).
  const float* a = trans_a ? A.data() + k0 * M : A.data() + k0;
  const float* b = trans_b ? B.data() + k0 : B.data() + k0 * N;
  Bf16PackBuffer a_buffer, b_buffer;
  const Bf16PackedA pa = pack_bf16_a(gemm, trans_a, M, k1 - k0, a, trans_a ? M : K, a_buffer);
  const Bf16PackedB pb = pack_bf16_b(trans_b, N, k1 - k0, b, trans_b ? K : N, b_buffer);
  gemm_bf16_tile(gemm, pa, pb, 0, 0, M, N, k1 - k0, beta, C.data(), N);
}

TEST(Bf16Matmul, NativeEveryLayoutOddShapesAndKBlocksMatchDoubleProduct) {
  SKIP_WITHOUT_NATIVE_BF16();
  // K: 1051 pairs, nine avx512_bf16 blocks of 128 pairs and two amx blocks of 1024, the last ones
  // partial and odd; M, N: partial 6-row, 32-row and 32-column blocks.
  constexpr int64_t M = 37, N = 70, K = 2101;
  const auto a = Rounded(Random(M * K, 21)), b = Rounded(Random(N * K, 22));
  const Reference ref = Product(a, b, M, N, K);
  for (const NativeKernel& k : NativeKernels())
    for (const bool trans_a : {false, true})
      for (const bool trans_b : {false, true}) {
        SCOPED_TRACE(k.path);
        std::vector<float> C(M * N, 7.0f);  // beta 0 ignores it
        NativeProduct(k.gemm, trans_a, trans_b, M, N, K, a, b, 0, K, false, C);
        ExpectWithin(C, ref, nullptr, trans_a ? (trans_b ? "TT" : "TN") : (trans_b ? "NT" : "NN"));
      }
}

TEST(Bf16Matmul, NativeKBlocksChainExactlyThroughC) {
  SKIP_WITHOUT_NATIVE_BF16();
  // The first k0 columns alone, then the rest accumulated into C: the same bits as one product
  // where k0 falls between the kernel's instructions (avx512_bf16: any pair; amx: 16 pairs, at a
  // K block's end or inside one).
  constexpr int64_t M = 45, N = 40, K = 2311;
  const auto a = Random(M * K, 23), b = Random(N * K, 24);
  for (const NativeKernel& k : NativeKernels()) {
    std::vector<float> whole(M * N);
    NativeProduct(k.gemm, false, true, M, N, K, a, b, 0, K, false, whole);
    for (const int64_t k0 : {256, 2048}) {
      SCOPED_TRACE(std::string(k.path) + " k0 " + std::to_string(k0));
      std::vector<float> split(M * N);
      NativeProduct(k.gemm, false, true, M, N, K, a, b, 0, k0, false, split);
      NativeProduct(k.gemm, false, true, M, N, K, a, b, k0, K, true, split);
      EXPECT_EQ(std::memcmp(whole.data(), split.data(), whole.size() * 4), 0);
    }
  }
}

TEST(Bf16Matmul, AccumulatesIntoDinpAndDweight) {
  std::vector<const char*> paths = {"emulated"};
  for (const NativeKernel& k : NativeKernels()) paths.push_back(k.path);
  for (const char* path : paths) {
    const Linear l;
    auto backend = Bf16Backend(path);
    std::vector<float> dinp(l.N * l.C, 0.0f), dweight(l.OC * l.C, 0.0f);
    std::vector<float> dinp2(l.N * l.C, 1.5f), dweight2(l.OC * l.C, -2.0f);
    backend->MatmulBackward(dinp.data(), dweight.data(), l.dout.data(), l.inp.data(),
                            l.weight.data(), l.N, l.C, l.OC, false, false);
    backend->MatmulBackward(dinp2.data(), dweight2.data(), l.dout.data(), l.inp.data(),
                            l.weight.data(), l.N, l.C, l.OC, true, true);
    for (size_t i = 0; i < dinp.size(); ++i) ASSERT_NEAR(dinp2[i], dinp[i] + 1.5f, 1e-4) << path;
    for (size_t i = 0; i < dweight.size(); ++i)
      ASSERT_NEAR(dweight2[i], dweight[i] - 2.0f, 1e-4) << path;
  }
}

std::vector<float> LinearBits(const char* path) {
  const Linear l;
  std::vector<float> all;
  for (const auto& x : l.Run(*Bf16Backend(path))) all.insert(all.end(), x.begin(), x.end());
  return all;
}

TEST(Bf16Matmul, EmulatedThreadIndependent) {
  ExpectThreadIndependent([] { return LinearBits("emulated"); });
}

TEST(Bf16Matmul, NativeThreadIndependent) {
  SKIP_WITHOUT_NATIVE_BF16();
  for (const NativeKernel& k : NativeKernels()) {
    SCOPED_TRACE(k.path);
    ExpectThreadIndependent([&] { return LinearBits(k.path); });
  }
}

TEST(Bf16Backend, SummaryNamesThePathThatRuns) {
  const std::string gemm = " " + GemmLibrarySummary();  // the emulated path runs the fp32 products
  EXPECT_EQ(Bf16Backend("emulated")->Summary(),
            "device=cpu compute=bfloat16 bf16_path=emulated" + gemm);
  EXPECT_EQ(Bf16Backend("auto")->Summary(),
            cpu_has_amx_bf16()      ? "device=cpu compute=bfloat16 bf16_path=amx"
            : cpu_has_avx512_bf16() ? "device=cpu compute=bfloat16 bf16_path=avx512_bf16"
                                    : "device=cpu compute=bfloat16 bf16_path=emulated" + gemm);
  if (!cpu_has_avx512_bf16()) {
    EXPECT_THROW(Bf16Backend("native"), Error);
  }
}

}  // namespace
}  // namespace crucible::kernels
