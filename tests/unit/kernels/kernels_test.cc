// Kernel properties the rest of Crucible relies on: every kernel gives the same bits for any
// OpenMP thread count; SwiGLU's backward pass agrees with central finite differences of its
// forward; cross-entropy skips ignored targets and rejects out-of-range ones; exp_fast is
// accurate. The other backward passes are checked against PyTorch autograd in float64
// (tests/integration/test_reference_torch.py); the lane reductions in lanes_test.cc.
#include "kernels/cpu/kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/vec_math.h"
#include "kernels_test_util.h"

namespace crucible::kernels {
namespace {

using testing::ExpectThreadIndependent;
using testing::Random;

// The products' thread independence, per GEMM library: gemm_library_test.cc.

// Muon's Gram products: exactly symmetric, the same bits for any thread count, and the product
// inp inp^T to float rounding (checked in double), for sizes on, off and below the tile grid.
TEST(Kernels, GramProductIsExactlySymmetricThreadIndependentAndThePlainProduct) {
  for (int64_t N : {int64_t{1}, int64_t{77}, kGramTile, int64_t{300}}) {
    const int64_t C = 190;
    const auto inp = Random(N * C, 40 + N);
    std::vector<float> out(N * N);
    ExpectThreadIndependent([&] {
      matmul_gram(out.data(), inp.data(), N, C);
      return out;
    });
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < N; ++j) {
        ASSERT_EQ(out[i * N + j], out[j * N + i]) << "N " << N << " at " << i << ", " << j;
        double want = 0, magnitude = 0;
        for (int64_t k = 0; k < C; ++k) {
          want += static_cast<double>(inp[i * C + k]) * inp[j * C + k];
          magnitude += std::abs(static_cast<double>(inp[i * C + k]) * inp[j * C + k]);
        }
        ASSERT_NEAR(out[i * N + j], want, 1e-6 * magnitude + 1e-30) << "N " << N;
      }
  }
}

// Muon's B X: the untransposed product, against double and for any thread count.
TEST(Kernels, UntransposedProductIsThePlainProductAndThreadIndependent) {
  const int64_t M = 70, K = 130, N = 300;
  const auto a = Random(M * K, 50), b = Random(K * N, 51);
  std::vector<float> out(M * N);
  ExpectThreadIndependent([&] {
    matmul_nn(out.data(), a.data(), b.data(), M, K, N);
    return out;
  });
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double want = 0, magnitude = 0;
      for (int64_t k = 0; k < K; ++k) {
        want += static_cast<double>(a[i * K + k]) * b[k * N + j];
        magnitude += std::abs(static_cast<double>(a[i * K + k]) * b[k * N + j]);
      }
      ASSERT_NEAR(out[i * N + j], want, 1e-6 * magnitude) << i << ", " << j;
    }
}

TEST(Kernels, AttentionAndNormsAreThreadIndependent) {
  const int64_t B = 2, T = 200, H = 4, KV = 2, D = 16, C = 64;
  auto q = Random(B * T * H * D, 4), k = Random(B * T * KV * D, 5), v = Random(B * T * KV * D, 6);
  auto dout = Random(B * T * H * D, 7), x = Random(B * T * C, 8), w = Random(C, 9);
  ExpectThreadIndependent([&] {
    std::vector<float> out(B * T * H * D), lse(B * H * T), dq(q.size()), dk(k.size()), dv(v.size());
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, KV, D);
    attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                       q.data(), k.data(), v.data(), B, T, H, KV, D);
    std::vector<float> y(B * T * C), rstd(B * T), dx(B * T * C), dw(C);
    rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), B * T, C, 1e-5f);
    rmsnorm_backward(dx.data(), dw.data(), y.data(), x.data(), w.data(), rstd.data(), B * T, C);
    std::vector<float> all = out;
    for (auto* part : {&lse, &dq, &dk, &dv, &y, &dx, &dw})
      all.insert(all.end(), part->begin(), part->end());
    all.push_back(static_cast<float>(sum_of_squares(x.data(), x.size())));
    return all;
  });
}

TEST(Kernels, RopeSwigluAndCrossEntropyAreThreadIndependent) {
  const int64_t B = 2, T = 200, H = 4, D = 16, N = B * T, F = 40, V = 300;
  std::vector<float> cos_table(T * D / 2), sin_table(T * D / 2);
  rope_tables(cos_table.data(), sin_table.data(), T, D, 10000.0);
  auto x = Random(N * H * D, 20), gate = Random(N * F, 21), up = Random(N * F, 22);
  auto dout = Random(N * F, 23), logits = Random(N * V, 24, 3.0f);
  std::vector<int32_t> targets(N);
  for (int64_t i = 0; i < N; ++i) targets[i] = i % 7 == 0 ? -1 : static_cast<int32_t>(i * 31 % V);
  ExpectThreadIndependent([&] {
    std::vector<float> rotated = x;
    rope_forward(rotated.data(), cos_table.data(), sin_table.data(), B, T, H, D);
    std::vector<float> back = rotated;
    rope_backward(back.data(), cos_table.data(), sin_table.data(), B, T, H, D);
    std::vector<float> out(N * F), dgate(N * F), dup(N * F);
    swiglu_forward(out.data(), gate.data(), up.data(), N, F);
    swiglu_backward(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), N, F);
    std::vector<float> losses(N), lse(N), dlogits = logits;
    cross_entropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), N, V);
    cross_entropy_backward(dlogits.data(), lse.data(), targets.data(), N, V, 0.25f);
    std::vector<float> all = rotated;
    for (auto* part : {&back, &out, &dgate, &dup, &losses, &lse, &dlogits})
      all.insert(all.end(), part->begin(), part->end());
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

TEST(Kernels, RopeBackwardIsTheTransposeAndInverseOfTheForward) {
  const int64_t B = 2, T = 9, H = 3, D = 8;
  std::vector<float> cos_table(T * D / 2), sin_table(T * D / 2);
  rope_tables(cos_table.data(), sin_table.data(), T, D, 10000.0);
  const auto x = Random(B * T * H * D, 30), y = Random(B * T * H * D, 31);
  auto rotated_x = x, rotated_back_y = y;
  rope_forward(rotated_x.data(), cos_table.data(), sin_table.data(), B, T, H, D);
  rope_backward(rotated_back_y.data(), cos_table.data(), sin_table.data(), B, T, H, D);
  double forward_dot = 0, backward_dot = 0;  // <R x, y> = <x, R^T y>
  for (size_t i = 0; i < x.size(); ++i) {
    forward_dot += static_cast<double>(rotated_x[i]) * y[i];
    backward_dot += static_cast<double>(x[i]) * rotated_back_y[i];
  }
  EXPECT_NEAR(forward_dot, backward_dot, 1e-4);
  auto round_trip = rotated_x;
  rope_backward(round_trip.data(), cos_table.data(), sin_table.data(), B, T, H, D);
  float moved = 0;  // the forward really rotates (the angles reach 8 radians)
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(round_trip[i], x[i], 1e-6) << i;
    moved = std::max(moved, std::fabs(rotated_x[i] - x[i]));
  }
  EXPECT_GT(moved, 0.5f);
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
  int exit_code = 0;
  try {
    cross_entropy_forward(losses.data(), lse.data(), logits.data(), bad.data(), N, V);
  } catch (const Error& e) {
    exit_code = e.exit_code();
  }
  EXPECT_EQ(exit_code, kExitBadData);  // DataError
}

TEST(Kernels, ExpFastIsAccurate) {
  double worst = 0;
  for (float x = -87.0f; x < 88.0f; x += 0.0137f) {
    double exact = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(exp_fast(x) - exact) / exact);
  }
  EXPECT_LT(worst, 2e-7);  // what vec_math.h promises
  EXPECT_EQ(exp_fast(-1000.0f), 0.0f);
  EXPECT_EQ(exp_fast(-INFINITY), 0.0f);
}

}  // namespace
}  // namespace crucible::kernels
