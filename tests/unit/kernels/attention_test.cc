// The flash-style causal attention (kernels/cpu/attention.cc) against a naive double-precision
// attention that materialises the (T,T) probabilities: forward output, log-sum-exp and the three
// input gradients, on shapes that cross tile borders (T not a multiple of the 64-row tile, one
// row, several query heads per kv head); and the same bits for any thread count on a shape with
// more tiles and tasks than threads; value heads of another width than the query heads (MLA) as
// well. bf16 on AMX (products = kAmx): against the same reference
// no farther than the emulated bf16 attention (the same roundings, fp32 sums in another order),
// not the emulation's bits, and the same bits for any thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/kernels.h"
#include "kernels_test_util.h"

namespace crucible::kernels {
namespace {

using testing::ExpectThreadIndependent;
using testing::Random;

struct Shape {
  int64_t B, T, H, KV, D;
  int64_t Dv = 0;  // the value heads' width; 0: D
  int64_t V() const { return Dv > 0 ? Dv : D; }
};

struct Result {
  std::vector<double> out, lse, dq, dk, dv;
};

// Causal softmax attention in double, probabilities kept whole.
Result Naive(const Shape& s, const std::vector<float>& q, const std::vector<float>& k,
             const std::vector<float>& v, const std::vector<float>& dout) {
  const int64_t T = s.T, D = s.D, Dv = s.V(), ldq = s.H * D, ldk = s.KV * D, group = s.H / s.KV;
  const int64_t ldo = s.H * Dv, ldv = s.KV * Dv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Result r{std::vector<double>(dout.size()), std::vector<double>(s.B * s.H * T),
           std::vector<double>(q.size()), std::vector<double>(k.size()),
           std::vector<double>(v.size())};
  std::vector<double> p(T), dp(T);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      const int64_t g = h / group;
      auto Q = [&](int64_t t) { return b * T * ldq + t * ldq + h * D; };
      auto K = [&](int64_t t) { return b * T * ldk + t * ldk + g * D; };
      auto O = [&](int64_t t) { return b * T * ldo + t * ldo + h * Dv; };
      auto Vr = [&](int64_t t) { return b * T * ldv + t * ldv + g * Dv; };
      for (int64_t i = 0; i < T; ++i) {
        double max = -INFINITY, sum = 0, dot = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double acc = 0, dacc = 0;
          for (int64_t d = 0; d < D; ++d) acc += static_cast<double>(q[Q(i) + d]) * k[K(j) + d];
          for (int64_t d = 0; d < Dv; ++d)
            dacc += static_cast<double>(dout[O(i) + d]) * v[Vr(j) + d];
          p[j] = acc * scale;
          dp[j] = dacc;
          max = std::max(max, p[j]);
        }
        for (int64_t j = 0; j <= i; ++j) sum += p[j] = std::exp(p[j] - max);
        r.lse[(b * s.H + h) * T + i] = max + std::log(sum);
        for (int64_t j = 0; j <= i; ++j) dot += (p[j] /= sum) * dp[j];
        for (int64_t j = 0; j <= i; ++j) {
          const double ds = p[j] * (dp[j] - dot) * scale;
          for (int64_t d = 0; d < Dv; ++d) {
            r.out[O(i) + d] += p[j] * v[Vr(j) + d];
            r.dv[Vr(j) + d] += p[j] * dout[O(i) + d];
          }
          for (int64_t d = 0; d < D; ++d) {
            r.dq[Q(i) + d] += ds * k[K(j) + d];
            r.dk[K(j) + d] += ds * q[Q(i) + d];
          }
        }
      }
    }
  return r;
}

std::vector<std::vector<float>> Flash(const Shape& s, const std::vector<float>& q,
                                      const std::vector<float>& k, const std::vector<float>& v,
                                      const std::vector<float>& dout, bool bf16 = false,
                                      Bf16Gemm products = Bf16Gemm::kOff) {
  std::vector<float> out(dout.size()), lse(s.B * s.H * s.T), dq(q.size()), dk(k.size(), 7.0f),
      dv(v.size(), 7.0f);  // dk, dv prefilled: the kernel must overwrite them
  const HeadDims dims(s.D, s.V());
  attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s.B, s.T, s.H, s.KV, dims,
                    bf16, products);
  attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(), q.data(),
                     k.data(), v.data(), s.B, s.T, s.H, s.KV, dims, bf16, products);
  return {out, lse, dq, dk, dv};
}

// The worst |got - want| / (1 + |want|) of each part.
std::vector<double> WorstErrors(const Result& want, const std::vector<std::vector<float>>& got) {
  const std::vector<double>* wants[] = {&want.out, &want.lse, &want.dq, &want.dk, &want.dv};
  std::vector<double> worst(5, 0.0);
  for (int part = 0; part < 5; ++part)
    for (size_t i = 0; i < wants[part]->size(); ++i)
      worst[part] = std::max(worst[part], std::abs(got[part][i] - (*wants[part])[i]) /
                                              (1.0 + std::abs((*wants[part])[i])));
  return worst;
}

const char* const kParts[] = {"out", "lse", "dq", "dk", "dv"};

// Calls check(shape, q, k, v, dout, reference) on shapes that cross tile borders (T not a multiple
// of 64, one row, several query heads per kv head; D = 66: pairs past one AMX tile's 16; value
// heads narrower and wider than the query heads, with and without grouped queries).
template <typename Check>
void ForEachShape(uint64_t seed, Check check) {
  const Shape shapes[] = {{1, 1, 1, 1, 8},      {2, 130, 4, 2, 16},     {1, 64, 4, 1, 32},
                          {1, 200, 3, 3, 64},   {2, 65, 2, 1, 8},       {1, 300, 4, 4, 24},
                          {1, 97, 2, 1, 66},    {2, 130, 4, 4, 24, 16}, {1, 97, 4, 2, 12, 40},
                          {1, 70, 3, 3, 96, 64}};
  for (const Shape& s : shapes) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " H=" << s.H
                                      << " KV=" << s.KV << " D=" << s.D << " Dv=" << s.V());
    const size_t nq = s.B * s.T * s.H * s.D, nk = s.B * s.T * s.KV * s.D;
    const size_t no = s.B * s.T * s.H * s.V(), nv = s.B * s.T * s.KV * s.V();
    // Scores of a few units: the softmax is neither flat nor one-hot.
    auto q = Random(nq, seed++, 1.5f), k = Random(nk, seed++, 1.5f), v = Random(nv, seed++);
    auto dout = Random(no, seed++);
    check(s, q, k, v, dout, Naive(s, q, k, v, dout));
  }
}

TEST(Attention, MatchesNaiveDoublePrecisionReference) {
  ForEachShape(100, [](const Shape& s, const auto& q, const auto& k, const auto& v,
                       const auto& dout, const Result& want) {
    const std::vector<double> worst = WorstErrors(want, Flash(s, q, k, v, dout));
    for (int part = 0; part < 5; ++part) EXPECT_LT(worst[part], 2e-5) << kParts[part];
  });
}

TEST(Attention, Bf16OnAmxIsAsCloseToTheReferenceAsTheEmulationButNotItsBits) {
  if (!cpu_has_amx_bf16()) GTEST_SKIP() << "this CPU has no AMX-BF16";
  ForEachShape(200, [](const Shape& s, const auto& q, const auto& k, const auto& v,
                       const auto& dout, const Result& want) {
    const auto emulated = Flash(s, q, k, v, dout, true);
    const auto amx = Flash(s, q, k, v, dout, true, Bf16Gemm::kAmx);
    const std::vector<double> e = WorstErrors(want, emulated), a = WorstErrors(want, amx);
    bool differs = false;
    for (int part = 0; part < 5; ++part) {
      // Both round the same operands at the same places, so they are far closer to each other
      // (measured: at most 6.7e-5 relative) than either is to the unrounded reference (bf16
      // operands: 2e-3..2.5e-2 here); a rounding missing or added on one side would move it by
      // about the latter. They differ by their fp32 sums, and where a probability or score
      // gradient computed by them rounds to a neighbouring bf16.
      double apart = 0;
      for (size_t i = 0; i < amx[part].size(); ++i)
        apart = std::max(apart, static_cast<double>(std::abs(amx[part][i] - emulated[part][i])) /
                                    (1.0 + std::abs(emulated[part][i])));
      EXPECT_LT(apart, 5e-4) << kParts[part];
      EXPECT_LT(a[part], std::max(1.1 * e[part], 1e-3)) << kParts[part] << " emulated " << e[part];
      differs |= amx[part] != emulated[part];
    }
    // Value heads of another width run on the micro-kernels (the AMX tiles have one width): the
    // emulation's bits.
    if (s.V() != s.D) {
      EXPECT_FALSE(differs) << "value heads of another width ran on the AMX tiles";
    } else if (s.T > 1) {
      EXPECT_TRUE(differs) << "the AMX tiles did not run";
    }
  });
}

TEST(Attention, Bf16OnAmxIsThreadIndependent) {
  if (!cpu_has_amx_bf16()) GTEST_SKIP() << "this CPU has no AMX-BF16";
  const Shape s{2, 300, 8, 2, 32};
  const size_t nq = s.B * s.T * s.H * s.D, nk = s.B * s.T * s.KV * s.D;
  auto q = Random(nq, 1), k = Random(nk, 2), v = Random(nk, 3), dout = Random(nq, 4);
  ExpectThreadIndependent([&] {
    std::vector<float> all;
    for (const auto& part : Flash(s, q, k, v, dout, true, Bf16Gemm::kAmx))
      all.insert(all.end(), part.begin(), part.end());
    return all;
  });
}

TEST(Attention, IsThreadIndependent) {
  // 5 query tiles, 2 x 8 forward tasks and 2 x 2 backward tasks of 4 query heads each; value heads
  // of the query heads' width and of another.
  for (const Shape& s : {Shape{2, 300, 8, 2, 32}, Shape{2, 300, 8, 2, 48, 32}}) {
    const size_t nq = s.B * s.T * s.H * s.D, nk = s.B * s.T * s.KV * s.D;
    const size_t no = s.B * s.T * s.H * s.V(), nv = s.B * s.T * s.KV * s.V();
    auto q = Random(nq, 1), k = Random(nk, 2), v = Random(nv, 3), dout = Random(no, 4);
    ExpectThreadIndependent([&] {
      std::vector<float> all;
      for (const auto& part : Flash(s, q, k, v, dout))
        all.insert(all.end(), part.begin(), part.end());
      return all;
    });
  }
}

TEST(Attention, ValueHeadsOfAnotherWidthAreTheirColumnsOfZeroPaddedOnes) {
  // MLA's v at Dv < D against the same v zero-padded to D: the scores and probabilities are the
  // same, and each output, dq, dk and dv column is the padded run's within the fp32 sums' order.
  const Shape narrow{1, 130, 4, 4, 24, 16}, padded{1, 130, 4, 4, 24, 24};
  auto q = Random(130 * 4 * 24, 5, 1.5f), k = Random(130 * 4 * 24, 6, 1.5f);
  auto v = Random(130 * 4 * 16, 7), dout = Random(130 * 4 * 16, 8);
  std::vector<float> v_pad(130 * 4 * 24, 0.0f), dout_pad(130 * 4 * 24, 0.0f);
  for (int64_t row = 0; row < 130 * 4; ++row)
    for (int64_t d = 0; d < 16; ++d) {
      v_pad[row * 24 + d] = v[row * 16 + d];
      dout_pad[row * 24 + d] = dout[row * 16 + d];
    }
  const auto got = Flash(narrow, q, k, v, dout), want = Flash(padded, q, k, v_pad, dout_pad);
  EXPECT_EQ(got[1], want[1]);  // lse: the same scores, the same bits
  double worst = 0;
  for (int64_t row = 0; row < 130 * 4; ++row)
    for (int64_t d = 0; d < 16; ++d) {
      worst = std::max(worst, std::abs(got[0][row * 16 + d] - want[0][row * 24 + d]) + 0.0);
      worst = std::max(worst, std::abs(got[4][row * 16 + d] - want[4][row * 24 + d]) + 0.0);
    }
  for (size_t i = 0; i < got[2].size(); ++i)
    worst = std::max(
        {worst, std::abs(got[2][i] - want[2][i]) + 0.0, std::abs(got[3][i] - want[3][i]) + 0.0});
  EXPECT_LT(worst, 1e-5);
}

}  // namespace
}  // namespace crucible::kernels
