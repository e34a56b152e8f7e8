// The portable exact backend (compute/portable_backend.cc, [debug] portable_exact) against the
// fp32 CPU kernels of kernels/cpu/ within a tolerance (the orders differ, the math must not), and
// its promise: the same bits for any OpenMP thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/error.h"
#include "compute/backend.h"
#include "kernels/cpu/kernels.h"
#include "kernels/kernels_test_util.h"

namespace crucible::kernels {
namespace {

using testing::ExpectThreadIndependent;
using testing::Random;

ComputeBackend& Portable() {
  static const std::shared_ptr<ComputeBackend> backend = [] {
    BackendOptions options;
    options.portable_exact = true;
    return MakeBackend(options);
  }();
  return *backend;
}

// |got - want| <= tolerance * (1 + |want|) everywhere.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, float tolerance,
                 const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  float worst = 0.0f;
  for (size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::fabs(got[i] - want[i]) / (1.0f + std::fabs(want[i])));
  EXPECT_LE(worst, tolerance) << what;
}

constexpr int64_t B = 2, T = 37, H = 4, KV = 2, D = 16, C = 48, F = 40, OC = 24, V = 70;
constexpr int64_t N = B * T;

TEST(PortableKernels, BackendIsSelectedByTheOption) {
  EXPECT_NE(Portable().Summary().find("portable_exact=true"), std::string::npos);
  BackendOptions bf16;
  bf16.portable_exact = true;
  bf16.compute = ComputePrecision::kBfloat16;
  EXPECT_THROW(MakeBackend(bf16), Error);
}

TEST(PortableKernels, MatmulMatchesTheCpuKernelAndIsThreadIndependent) {
  const auto inp = Random(N * C, 1), weight = Random(OC * C, 2, 0.1f), dout = Random(N * OC, 3);
  std::vector<float> want(N * OC), want_dinp(N * C, 0.5f), want_dw(OC * C, 0.25f);
  matmul_forward(want.data(), inp.data(), weight.data(), N, C, OC);
  matmul_backward(want_dinp.data(), want_dw.data(), dout.data(), inp.data(), weight.data(), N, C,
                  OC, true, true);
  auto run = [&] {
    std::vector<float> out(N * OC), dinp(N * C, 0.5f), dw(OC * C, 0.25f);
    Portable().MatmulForward(out.data(), inp.data(), weight.data(), N, C, OC);
    Portable().MatmulBackward(dinp.data(), dw.data(), dout.data(), inp.data(), weight.data(), N, C,
                              OC, true, true);
    ExpectClose(out, want, 1e-5f, "matmul out");
    ExpectClose(dinp, want_dinp, 1e-5f, "matmul dinp");
    ExpectClose(dw, want_dw, 1e-5f, "matmul dweight");
    out.insert(out.end(), dinp.begin(), dinp.end());
    out.insert(out.end(), dw.begin(), dw.end());
    return out;
  };
  ExpectThreadIndependent(run);
}

TEST(PortableKernels, EmbeddingAndRmsnormMatchAndAreThreadIndependent) {
  std::vector<int32_t> tokens(N);
  for (int64_t i = 0; i < N; ++i) tokens[i] = static_cast<int32_t>((i * 7) % 11);
  const auto table = Random(11 * C, 4), inp = Random(N * C, 5), weight = Random(C, 6);
  const auto dout = Random(N * C, 7);
  std::vector<float> want_emb(N * C), want_dtable(11 * C, 0.0f), want_out(N * C), want_rstd(N);
  std::vector<float> want_dinp(N * C, 0.0f), want_dw(C);
  embedding_forward(want_emb.data(), tokens.data(), table.data(), N, C);
  embedding_backward(want_dtable.data(), dout.data(), tokens.data(), N, C);
  rmsnorm_forward(want_out.data(), want_rstd.data(), inp.data(), weight.data(), N, C, 1e-5f);
  rmsnorm_backward(want_dinp.data(), want_dw.data(), dout.data(), inp.data(), weight.data(),
                   want_rstd.data(), N, C);
  ExpectThreadIndependent([&] {
    std::vector<float> emb(N * C), dtable(11 * C, 0.0f), out(N * C), rstd(N), dinp(N * C, 0.0f);
    std::vector<float> dw(C);
    Portable().EmbeddingForward(emb.data(), tokens.data(), table.data(), N, C);
    Portable().EmbeddingBackward(dtable.data(), dout.data(), tokens.data(), N, C);
    Portable().RmsnormForward(out.data(), rstd.data(), inp.data(), weight.data(), N, C, 1e-5f);
    Portable().RmsnormBackward(dinp.data(), dw.data(), dout.data(), inp.data(), weight.data(),
                               rstd.data(), N, C);
    EXPECT_EQ(emb, want_emb);  // a copy: exact
    ExpectClose(dtable, want_dtable, 1e-5f, "embedding dtable");
    ExpectClose(out, want_out, 1e-5f, "rmsnorm out");
    ExpectClose(rstd, want_rstd, 1e-5f, "rmsnorm rstd");
    ExpectClose(dinp, want_dinp, 1e-5f, "rmsnorm dinp");
    ExpectClose(dw, want_dw, 1e-4f, "rmsnorm dweight");
    for (const auto* v : {&dtable, &out, &rstd, &dinp, &dw})
      emb.insert(emb.end(), v->begin(), v->end());
    return emb;
  });
}

TEST(PortableKernels, AttentionMatchesTheFlashKernelAndIsThreadIndependent) {
  const auto q = Random(N * H * D, 8), k = Random(N * KV * D, 9), v = Random(N * KV * D, 10);
  const auto dout = Random(N * H * D, 11);
  std::vector<float> want(N * H * D), want_lse(B * H * T), want_dq(N * H * D), want_dk(N * KV * D),
      want_dv(N * KV * D);
  attention_forward(want.data(), want_lse.data(), q.data(), k.data(), v.data(), B, T, H, KV, D);
  attention_backward(want_dq.data(), want_dk.data(), want_dv.data(), dout.data(), want.data(),
                     want_lse.data(), q.data(), k.data(), v.data(), B, T, H, KV, D);
  ExpectThreadIndependent([&] {
    std::vector<float> out(N * H * D), lse(B * H * T), dq(N * H * D), dk(N * KV * D),
        dv(N * KV * D);
    Portable().AttentionForward(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, KV,
                                D, nullptr);
    Portable().AttentionBackward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(),
                                 lse.data(), q.data(), k.data(), v.data(), B, T, H, KV, D, nullptr);
    ExpectClose(out, want, 1e-5f, "attention out");
    ExpectClose(lse, want_lse, 1e-5f, "attention lse");
    ExpectClose(dq, want_dq, 1e-4f, "attention dq");
    ExpectClose(dk, want_dk, 1e-4f, "attention dk");
    ExpectClose(dv, want_dv, 1e-4f, "attention dv");
    for (const auto* x : {&lse, &dq, &dk, &dv}) out.insert(out.end(), x->begin(), x->end());
    return out;
  });
}

TEST(PortableKernels, RopeSwigluAndCrossEntropyMatchAndAreThreadIndependent) {
  std::vector<float> cos_table(T * D / 2), sin_table(T * D / 2);
  rope_tables(cos_table.data(), sin_table.data(), T, D, 10000.0);
  const auto x = Random(N * H * D, 12), gate = Random(N * F, 13), up = Random(N * F, 14);
  const auto dout = Random(N * F, 15), logits = Random(N * V, 16);
  std::vector<int32_t> targets(N);
  for (int64_t i = 0; i < N; ++i) targets[i] = i % 5 == 0 ? -1 : static_cast<int32_t>(i % V);
  std::vector<float> want_rope = x, want_sw(N * F), want_dg(N * F), want_du(N * F), want_loss(N),
                     want_lse(N), want_dlogits = logits;
  rope_forward(want_rope.data(), cos_table.data(), sin_table.data(), B, T, H, D);
  swiglu_forward(want_sw.data(), gate.data(), up.data(), N, F);
  swiglu_backward(want_dg.data(), want_du.data(), dout.data(), gate.data(), up.data(), N, F);
  cross_entropy_forward(want_loss.data(), want_lse.data(), logits.data(), targets.data(), N, V);
  cross_entropy_backward(want_dlogits.data(), want_lse.data(), targets.data(), N, V, 0.125f);
  ExpectThreadIndependent([&] {
    std::vector<float> rope = x, sw(N * F), dg(N * F), du(N * F), loss(N), lse(N), dl = logits;
    Portable().RopeForward(rope.data(), cos_table.data(), sin_table.data(), B, T, H, D);
    Portable().SwigluForward(sw.data(), gate.data(), up.data(), N, F);
    Portable().SwigluBackward(dg.data(), du.data(), dout.data(), gate.data(), up.data(), N, F);
    Portable().CrossEntropyForward(loss.data(), lse.data(), logits.data(), targets.data(), N, V);
    Portable().CrossEntropyBackward(dl.data(), lse.data(), targets.data(), N, V, 0.125f, nullptr);
    ExpectClose(rope, want_rope, 1e-6f, "rope");
    ExpectClose(sw, want_sw, 1e-6f, "swiglu");
    ExpectClose(dg, want_dg, 1e-6f, "swiglu dgate");
    ExpectClose(du, want_du, 1e-6f, "swiglu dup");
    ExpectClose(loss, want_loss, 1e-6f, "cross-entropy loss");
    ExpectClose(dl, want_dlogits, 1e-6f, "cross-entropy dlogits");
    std::vector<float> back = rope;
    Portable().RopeBackward(back.data(), cos_table.data(), sin_table.data(), B, T, H, D);
    ExpectClose(back, x, 1e-6f, "rope backward undoes the forward");
    for (const auto* v : {&sw, &dg, &du, &loss, &lse, &dl, &back})
      rope.insert(rope.end(), v->begin(), v->end());
    return rope;
  });
}

}  // namespace
}  // namespace crucible::kernels
