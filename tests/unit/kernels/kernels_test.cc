// Kernel properties the rest of Crucible relies on: results independent of the OpenMP thread
// count (bit for bit), and backward passes that agree with finite differences of the forward.
#include "kernels/cpu/kernels.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "common/philox.h"
#include "kernels/cpu/vec_math.h"

namespace crucible::kernels {
namespace {

std::vector<float> Random(size_t n, uint64_t seed, float scale = 1.0f) {
  Philox rng(seed, 0);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.NextNormal()) * scale;
  return v;
}

// Runs f with 1 and with 2..4 threads and expects identical bytes from `out`.
void ExpectThreadIndependent(const std::function<std::vector<float>()>& f) {
  int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  std::vector<float> reference = f();
  for (int threads : {2, 3, 4}) {
    omp_set_num_threads(threads);
    std::vector<float> got = f();
    ASSERT_EQ(got.size(), reference.size());
    EXPECT_EQ(std::memcmp(got.data(), reference.data(), got.size() * sizeof(float)), 0)
        << "differs with " << threads << " threads";
  }
  omp_set_num_threads(saved);
}

TEST(Kernels, MatmulWeightGradientIsThreadIndependent) {
  // The inner dimension of the weight gradient is the token count: OpenBLAS must not split it.
  const int64_t N = 1000, C = 96, OC = 200;
  auto dout = Random(N * OC, 1), inp = Random(N * C, 2), weight = Random(OC * C, 3);
  ExpectThreadIndependent([&] {
    std::vector<float> dinp(N * C), dweight(OC * C), out(N * OC);
    matmul_forward(out.data(), inp.data(), weight.data(), N, C, OC);
    matmul_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(), N, C, OC,
                    false, false);
    std::vector<float> all = out;
    all.insert(all.end(), dinp.begin(), dinp.end());
    all.insert(all.end(), dweight.begin(), dweight.end());
    return all;
  });
}

TEST(Kernels, AttentionAndNormsAreThreadIndependent) {
  const int64_t B = 2, T = 200, H = 4, KV = 2, D = 16, C = 64;
  auto q = Random(B * T * H * D, 4), k = Random(B * T * KV * D, 5), v = Random(B * T * KV * D, 6);
  auto dout = Random(B * T * H * D, 7), x = Random(B * T * C, 8), w = Random(C, 9);
  ExpectThreadIndependent([&] {
    std::vector<float> out(B * T * H * D), probs(B * H * T * T), dq(q.size()), dk(k.size()),
        dv(v.size()), scratch(attention_backward_scratch_floats(B, T, KV));
    attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), B, T, H, KV, D);
    attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), dout.data(), probs.data(),
                       q.data(), k.data(), v.data(), B, T, H, KV, D);
    std::vector<float> y(B * T * C), rstd(B * T), dx(B * T * C), dw(C);
    rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), B * T, C, 1e-5f);
    rmsnorm_backward(dx.data(), dw.data(), y.data(), x.data(), w.data(), rstd.data(), B * T, C);
    std::vector<float> all = out;
    for (auto* part : {&dq, &dk, &dv, &y, &dx, &dw})
      all.insert(all.end(), part->begin(), part->end());
    all.push_back(static_cast<float>(sum_of_squares(x.data(), x.size())));
    return all;
  });
}

TEST(Kernels, EmbeddingBackwardIsThreadIndependent) {
  const int64_t N = 500, C = 200, V = 50;
  auto dout = Random(N * C, 10);
  std::vector<int32_t> tokens(N);
  for (int64_t i = 0; i < N; ++i) tokens[i] = static_cast<int32_t>((i * 7) % V);
  ExpectThreadIndependent([&] {
    std::vector<float> table(V * C, 0.0f);
    embedding_backward(table.data(), dout.data(), tokens.data(), N, C);
    return table;
  });
}

TEST(Kernels, SwigluBackwardMatchesFiniteDifferences) {
  const int64_t N = 3, F = 5;
  auto gate = Random(N * F, 11), up = Random(N * F, 12), dout = Random(N * F, 13);
  std::vector<float> dgate(N * F), dup(N * F), out(N * F);
  swiglu_backward(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), N, F);
  auto objective = [&](const std::vector<float>& g, const std::vector<float>& u) {
    swiglu_forward(out.data(), g.data(), u.data(), N, F);
    double s = 0;
    for (int64_t i = 0; i < N * F; ++i) s += static_cast<double>(out[i]) * dout[i];
    return s;
  };
  const float h = 1e-2f;
  for (int64_t i = 0; i < N * F; ++i) {
    auto gp = gate, gm = gate;
    gp[i] += h;
    gm[i] -= h;
    EXPECT_NEAR((objective(gp, up) - objective(gm, up)) / (2 * h), dgate[i], 2e-3);
    auto upp = up, upm = up;
    upp[i] += h;
    upm[i] -= h;
    EXPECT_NEAR((objective(gate, upp) - objective(gate, upm)) / (2 * h), dup[i], 2e-3);
  }
}

TEST(Kernels, CrossEntropyIgnoresMaskedTargetsAndRejectsOutOfRange) {
  const int64_t N = 3, V = 4;
  std::vector<float> logits = {0, 0, 0, 0, 1, 2, 3, 4, 5, 5, 5, 5};
  std::vector<int32_t> targets = {1, -1, 2};
  std::vector<float> losses(N), lse(N);
  EXPECT_EQ(cross_entropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), N, V),
            2);
  EXPECT_NEAR(losses[0], std::log(4.0), 1e-6);
  EXPECT_EQ(losses[1], 0.0f);
  cross_entropy_backward(logits.data(), lse.data(), targets.data(), N, V, 0.5f);
  for (int j = 0; j < V; ++j) EXPECT_EQ(logits[4 + j], 0.0f);
  EXPECT_NEAR(logits[0] + logits[1] + logits[2] + logits[3], 0.0, 1e-6);
  std::vector<int32_t> bad = {4, 0, 0};
  EXPECT_THROW(cross_entropy_forward(losses.data(), lse.data(), logits.data(), bad.data(), N, V),
               std::exception);
}

TEST(Kernels, ExpFastIsAccurate) {
  double worst = 0;
  for (float x = -87.0f; x < 88.0f; x += 0.0137f) {
    double exact = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(exp_fast(x) - exact) / exact);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(exp_fast(-1000.0f), 0.0f);
  EXPECT_EQ(exp_fast(-INFINITY), 0.0f);
}

}  // namespace
}  // namespace crucible::kernels
