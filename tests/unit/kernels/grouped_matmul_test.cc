// The grouped products of a mixture of experts (kernels::grouped_matmul_forward / _backward):
// each group's rows times its own weight, against a double-precision loop; the same bits for any
// thread count; a row's result independent of which other rows share its group (what expert
// parallelism relies on); a group without rows gets a zero weight gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels_test_util.h"

namespace crucible::kernels {
namespace {

using testing::ExpectThreadIndependent;
using testing::Random;

constexpr int64_t C = 96, OC = 80;

struct Groups {
  std::vector<int64_t> begin;
  std::vector<float> inp, dout;
  std::vector<std::vector<float>> weights;
  std::vector<const float*> w;
  int64_t G() const { return static_cast<int64_t>(begin.size()) - 1; }
  int64_t rows() const { return begin.back(); }
};

// Groups of the given row counts (one of them 0, one past a row tile), seeded.
Groups Make(const std::vector<int64_t>& counts, uint64_t seed) {
  Groups g;
  g.begin = {0};
  for (int64_t n : counts) g.begin.push_back(g.begin.back() + n);
  g.inp = Random(g.rows() * C, seed);
  g.dout = Random(g.rows() * OC, seed + 1);
  for (size_t i = 0; i < counts.size(); ++i)
    g.weights.push_back(Random(OC * C, seed + 10 + i, 0.1f));
  for (const auto& w : g.weights) g.w.push_back(w.data());
  return g;
}

const std::vector<int64_t> kCounts = {37, 0, kGroupTileRows + 21, 5, 64};

TEST(GroupedMatmul, ForwardAndBackwardMatchADoubleLoopOverTheGroups) {
  Groups g = Make(kCounts, 1);
  std::vector<float> out(g.rows() * OC);
  grouped_matmul_forward(out.data(), g.inp.data(), g.w.data(), g.begin.data(), g.G(), C, OC);
  std::vector<float> dinp(g.rows() * C, 0.5f);
  std::vector<std::vector<float>> dw(g.G(), std::vector<float>(OC * C, 7.0f));
  std::vector<float*> dwp;
  for (auto& d : dw) dwp.push_back(d.data());
  grouped_matmul_backward(dinp.data(), dwp.data(), g.dout.data(), g.inp.data(), g.w.data(),
                          g.begin.data(), g.G(), C, OC, /*accumulate_dinp=*/true);
  double worst = 0;
  for (int64_t k = 0; k < g.G(); ++k) {
    const float* w = g.w[k];
    for (int64_t i = g.begin[k]; i < g.begin[k + 1]; ++i) {
      for (int64_t j = 0; j < OC; ++j) {
        double y = 0;
        for (int64_t c = 0; c < C; ++c) y += double(g.inp[i * C + c]) * w[j * C + c];
        worst = std::max(worst, std::fabs(y - out[i * OC + j]));
      }
      for (int64_t c = 0; c < C; ++c) {
        double d = 0.5;  // accumulated onto
        for (int64_t j = 0; j < OC; ++j) d += double(g.dout[i * OC + j]) * w[j * C + c];
        worst = std::max(worst, std::fabs(d - dinp[i * C + c]));
      }
    }
    for (int64_t j = 0; j < OC; ++j)
      for (int64_t c = 0; c < C; ++c) {
        double d = 0;
        for (int64_t i = g.begin[k]; i < g.begin[k + 1]; ++i)
          d += double(g.dout[i * OC + j]) * g.inp[i * C + c];
        worst = std::max(worst, std::fabs(d - dw[k][j * C + c]));
      }
  }
  EXPECT_LT(worst, 1e-4);
  for (float v : dw[1]) ASSERT_EQ(v, 0.0f) << "a group without rows has a zero weight gradient";
}

TEST(GroupedMatmul, TheSameBitsForAnyThreadCount) {
  Groups g = Make(kCounts, 2);
  ExpectThreadIndependent([&] {
    std::vector<float> out(g.rows() * OC), dinp(g.rows() * C);
    std::vector<float> dw(g.G() * OC * C);
    std::vector<float*> dwp;
    for (int64_t k = 0; k < g.G(); ++k) dwp.push_back(dw.data() + k * OC * C);
    grouped_matmul_forward(out.data(), g.inp.data(), g.w.data(), g.begin.data(), g.G(), C, OC);
    grouped_matmul_backward(dinp.data(), dwp.data(), g.dout.data(), g.inp.data(), g.w.data(),
                            g.begin.data(), g.G(), C, OC, false);
    out.insert(out.end(), dinp.begin(), dinp.end());
    out.insert(out.end(), dw.begin(), dw.end());
    return out;
  });
}

TEST(GroupedMatmul, ARowsOutputDoesNotDependOnTheOtherRowsOfItsGroup) {
  // Group 2's rows alone, then with 150 rows before them and 90 after in the same group (another
  // tile split, another row count): each row's forward and input gradient keep their bits.
  Groups alone = Make({40}, 3);
  Groups shared = Make({150 + 40 + 90}, 4);
  shared.weights[0] = alone.weights[0];
  shared.w[0] = shared.weights[0].data();
  std::copy(alone.inp.begin(), alone.inp.end(), shared.inp.begin() + 150 * C);
  std::copy(alone.dout.begin(), alone.dout.end(), shared.dout.begin() + 150 * OC);
  auto run = [](const Groups& g, std::vector<float>* out, std::vector<float>* dinp) {
    out->assign(g.rows() * OC, 0);
    dinp->assign(g.rows() * C, 0);
    std::vector<float> dw(OC * C);
    float* dwp = dw.data();
    grouped_matmul_forward(out->data(), g.inp.data(), g.w.data(), g.begin.data(), g.G(), C, OC);
    grouped_matmul_backward(dinp->data(), &dwp, g.dout.data(), g.inp.data(), g.w.data(),
                            g.begin.data(), g.G(), C, OC, false);
  };
  std::vector<float> out_a, dinp_a, out_s, dinp_s;
  run(alone, &out_a, &dinp_a);
  run(shared, &out_s, &dinp_s);
  for (int64_t i = 0; i < 40 * OC; ++i) ASSERT_EQ(out_a[i], out_s[150 * OC + i]) << i;
  for (int64_t i = 0; i < 40 * C; ++i) ASSERT_EQ(dinp_a[i], dinp_s[150 * C + i]) << i;
}

}  // namespace
}  // namespace crucible::kernels
