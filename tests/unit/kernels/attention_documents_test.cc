// Packed documents in the flash attention (kernels/cpu/attention.cc, `positions`) and in the
// portable backend: each document of a packed row gets, bit for bit, what it gets alone in a row
// of its own (out, lse, dq, dk, dv), so packing changes no bit of attention; a key receives no
// gradient from another document's queries. Documents cross tile borders, are one token long, and
// fill a whole row; fp32, bf16 operands (emulated), AMX where the CPU has it; value heads of
// another width (MLA); any thread count.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "compute/backend.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/kernels.h"
#include "kernels_test_util.h"

namespace crucible::kernels {
namespace {

using testing::ExpectThreadIndependent;
using testing::Random;

struct Shape {
  int64_t T, H, KV, D, Dv;
  std::vector<std::vector<int64_t>> documents;  // per row, the lengths (adding up to T)
};

std::vector<int32_t> Positions(const Shape& s) {
  std::vector<int32_t> positions;
  for (const auto& row : s.documents) {
    int64_t total = 0;
    for (int64_t n : row) {
      for (int64_t t = 0; t < n; ++t) positions.push_back(static_cast<int32_t>(t));
      total += n;
    }
    EXPECT_EQ(total, s.T);
  }
  return positions;
}

// out, lse, dq, dk, dv of one attention call over (B, T) with `positions` (nullptr: none).
using Parts = std::vector<std::vector<float>>;
template <typename Attention>
Parts RunAttention(Attention attention, const Shape& s, int64_t B, int64_t T, const float* q,
                   const float* k, const float* v, const float* dout, const int32_t* positions) {
  Parts p = {std::vector<float>(B * T * s.H * s.Dv), std::vector<float>(B * s.H * T),
             std::vector<float>(B * T * s.H * s.D), std::vector<float>(B * T * s.KV * s.D, 7.0f),
             std::vector<float>(B * T * s.KV * s.Dv, 7.0f)};
  attention(p, B, T, q, k, v, dout, positions);
  return p;
}

// Runs the packed batch, then every document alone (B = 1, T = its length), and expects the
// document's rows of every part to be the same bits.
template <typename Attention>
void ExpectDocumentsAlone(Attention attention, const Shape& s, uint64_t seed) {
  const int64_t B = static_cast<int64_t>(s.documents.size()), T = s.T;
  const int64_t ldq = s.H * s.D, ldk = s.KV * s.D, ldo = s.H * s.Dv, ldv = s.KV * s.Dv;
  const auto q = Random(B * T * ldq, seed), k = Random(B * T * ldk, seed + 1),
             v = Random(B * T * ldv, seed + 2), dout = Random(B * T * ldo, seed + 3);
  const std::vector<int32_t> positions = Positions(s);
  const Parts packed =
      RunAttention(attention, s, B, T, q.data(), k.data(), v.data(), dout.data(), positions.data());
  for (int64_t b = 0; b < B; ++b) {
    int64_t start = 0;
    for (int64_t n : s.documents[b]) {
      SCOPED_TRACE(::testing::Message() << "row " << b << " document at " << start << " of " << n);
      const int64_t row = b * T + start;
      const Parts alone =
          RunAttention(attention, s, 1, n, q.data() + row * ldq, k.data() + row * ldk,
                       v.data() + row * ldv, dout.data() + row * ldo, nullptr);
      const int64_t widths[] = {ldo, 0, ldq, ldk, ldv};
      const char* names[] = {"out", "lse", "dq", "dk", "dv"};
      for (int part = 0; part < 5; ++part) {
        if (part == 1) {
          for (int64_t h = 0; h < s.H; ++h)
            ASSERT_EQ(0,
                      std::memcmp(alone[1].data() + h * n,
                                  packed[1].data() + (b * s.H + h) * T + start, n * sizeof(float)))
                << "lse, head " << h;
          continue;
        }
        ASSERT_EQ(0, std::memcmp(alone[part].data(), packed[part].data() + row * widths[part],
                                 n * widths[part] * sizeof(float)))
            << names[part];
      }
      start += n;
    }
  }
}

const Shape kShapes[] = {
    {130, 4, 2, 16, 16, {{5, 70, 1, 54}, {130}}},
    {97, 2, 1, 66, 66, {{64, 33}, {1, 1, 95}, {97}}},
    {200, 3, 3, 24, 24, {{65, 65, 70}}},
    {150, 4, 4, 24, 16, {{20, 129, 1}, {150}}},  // MLA-like: value heads narrower
    {90, 4, 2, 12, 40, {{40, 50}}},
};

auto Cpu(bool bf16, Bf16Gemm products) {
  return [=](Parts& p, int64_t B, int64_t T, const float* q, const float* k, const float* v,
             const float* dout, const int32_t* positions) {
    const int64_t H = static_cast<int64_t>(p[1].size()) / (B * T);
    const int64_t D = static_cast<int64_t>(p[2].size()) / (B * T * H);
    const int64_t Dv = static_cast<int64_t>(p[0].size()) / (B * T * H);
    const int64_t KV = static_cast<int64_t>(p[3].size()) / (B * T * D);
    attention_forward(p[0].data(), p[1].data(), q, k, v, B, T, H, KV, HeadDims(D, Dv), bf16,
                      products, positions);
    attention_backward(p[2].data(), p[3].data(), p[4].data(), dout, p[0].data(), p[1].data(), q, k,
                       v, B, T, H, KV, HeadDims(D, Dv), bf16, products, positions);
  };
}

TEST(AttentionDocuments, EachDocumentGetsTheBitsItGetsAlone) {
  uint64_t seed = 100;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "T=" << s.T << " D=" << s.D << " Dv=" << s.Dv);
    ExpectDocumentsAlone(Cpu(false, Bf16Gemm::kOff), s, seed);
    ExpectDocumentsAlone(Cpu(true, Bf16Gemm::kOff), s, seed);
    seed += 10;
  }
}

TEST(AttentionDocuments, OnAmxEachDocumentGetsTheBitsItGetsAlone) {
  if (!cpu_has_amx_bf16()) GTEST_SKIP() << "this CPU has no AMX-BF16";
  uint64_t seed = 200;
  for (const Shape& s : kShapes) {
    if (s.D != s.Dv) continue;  // the AMX tiles have one head width
    ExpectDocumentsAlone(Cpu(true, Bf16Gemm::kAmx), s, seed);
    seed += 10;
  }
}

TEST(AttentionDocuments, PortableBackendEachDocumentGetsTheBitsItGetsAlone) {
  BackendOptions options;
  options.portable_exact = true;
  const std::shared_ptr<ComputeBackend> portable = MakeBackend(options);
  auto run = [&](Parts& p, int64_t B, int64_t T, const float* q, const float* k, const float* v,
                 const float* dout, const int32_t* positions) {
    const int64_t H = static_cast<int64_t>(p[1].size()) / (B * T);
    const int64_t D = static_cast<int64_t>(p[2].size()) / (B * T * H);
    const int64_t KV = static_cast<int64_t>(p[3].size()) / (B * T * D);
    portable->AttentionForward(p[0].data(), p[1].data(), q, k, v, B, T, H, KV, HeadDims(D),
                               positions);
    portable->AttentionBackward(p[2].data(), p[3].data(), p[4].data(), dout, p[0].data(),
                                p[1].data(), q, k, v, B, T, H, KV, HeadDims(D), positions);
  };
  uint64_t seed = 300;
  for (const Shape& s : kShapes) {
    if (s.D != s.Dv) continue;  // one head width
    ExpectDocumentsAlone(run, s, seed);
    seed += 10;
  }
}

TEST(AttentionDocuments, SameBitsForAnyThreadCount) {
  const Shape& s = kShapes[0];
  const int64_t B = 2, T = s.T;
  const auto q = Random(B * T * s.H * s.D, 1), k = Random(B * T * s.KV * s.D, 2),
             v = Random(B * T * s.KV * s.Dv, 3), dout = Random(B * T * s.H * s.Dv, 4);
  const std::vector<int32_t> positions = Positions(s);
  ExpectThreadIndependent([&] {
    const Parts p = RunAttention(Cpu(false, Bf16Gemm::kOff), s, B, T, q.data(), k.data(), v.data(),
                                 dout.data(), positions.data());
    std::vector<float> all;
    for (const auto& part : p) all.insert(all.end(), part.begin(), part.end());
    return all;
  });
}

}  // namespace
}  // namespace crucible::kernels
