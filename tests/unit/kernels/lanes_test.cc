// The fixed-order lane reductions (kernels/cpu/lanes.h): each gives the bits of a plain loop
// written in the documented order, for every length around the lane width, and rows reduced in
// parallel give the same bits for any thread count.
#include "kernels/cpu/lanes.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/vec_math.h"
#include "kernels_test_util.h"

namespace crucible::kernels {
namespace {

using testing::ExpectThreadIndependent;
using testing::Random;

// Lengths around multiples of the lane width, and a long row.
const int64_t kLengths[] = {0, 1, 2, 7, 15, 16, 17, 31, 32, 33, 100, 1000, 4099};

// The documented order, written plainly: term i into lane i % 16, then lane l += lane l + w for
// w = 8, 4, 2, 1.
float ReferenceSum(const std::vector<float>& terms) {
  float lane[16] = {};
  for (size_t i = 0; i < terms.size(); ++i) lane[i % 16] += terms[i];
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) lane[l] += lane[l + w];
  return lane[0];
}

// Every lane starts at x[0] and keeps `lane > x[i] ? lane : x[i]`; then lanes 0..15 in order.
float ReferenceMax(const std::vector<float>& x) {
  float lane[16];
  for (float& l : lane) l = x[0];
  for (size_t i = 0; i < x.size(); ++i) lane[i % 16] = lane[i % 16] > x[i] ? lane[i % 16] : x[i];
  float m = lane[0];
  for (int l = 1; l < 16; ++l) m = m > lane[l] ? m : lane[l];
  return m;
}

uint32_t Bits(float x) {
  return std::bit_cast<uint32_t>(x);
}

TEST(Lanes, SumDotAndSumOfATermAddInTheDocumentedOrder) {
  int differs_from_a_running_sum = 0;
  for (int64_t n : kLengths) {
    const auto x = Random(n, 1 + n), y = Random(n, 2 + n);
    std::vector<float> products(n), exps(n);
    for (int64_t i = 0; i < n; ++i) {
      products[i] = x[i] * y[i];
      exps[i] = exp_fast(x[i] - 1.0f);
    }
    EXPECT_EQ(Bits(lane_sum(x.data(), n)), Bits(ReferenceSum(x))) << "n=" << n;
    EXPECT_EQ(Bits(lane_dot(x.data(), y.data(), n)), Bits(ReferenceSum(products))) << "n=" << n;
    const float* row = x.data();
    EXPECT_EQ(Bits(lane_sum(n, [row](int64_t i) { return exp_fast(row[i] - 1.0f); })),
              Bits(ReferenceSum(exps)))
        << "n=" << n;
    float running = 0.0f;
    for (float v : x) running += v;
    differs_from_a_running_sum += Bits(running) != Bits(ReferenceSum(x));
  }
  // The inputs tell the orders apart: a comparison they could not fail would prove nothing.
  EXPECT_GT(differs_from_a_running_sum, 0);
}

TEST(Lanes, MaxScansTheLanesInTheDocumentedOrder) {
  for (int64_t n : kLengths) {
    if (n == 0) continue;
    const auto x = Random(n, 3 + n);
    EXPECT_EQ(Bits(lane_max(x.data(), n)), Bits(ReferenceMax(x))) << "n=" << n;
    float largest = x[0];
    for (float v : x) largest = std::max(largest, v);
    EXPECT_EQ(lane_max(x.data(), n), largest) << "n=" << n;
    // Only which zero wins depends on the order: rows of +0 and -0 pin it.
    std::vector<float> zeros(n);
    for (int64_t i = 0; i < n; ++i) zeros[i] = (i * 7 + n) % 3 == 0 ? -0.0f : 0.0f;
    EXPECT_EQ(Bits(lane_max(zeros.data(), n)), Bits(ReferenceMax(zeros))) << "n=" << n;
  }
}

TEST(Lanes, RowsReducedInParallelAreThreadIndependent) {
  const int64_t rows = 64, width = 1000;
  const auto x = Random(rows * width, 4), y = Random(rows * width, 5);
  ExpectThreadIndependent([&] {
    std::vector<float> out(rows * 4);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* a = x.data() + r * width;
      const float* b = y.data() + r * width;
      const int64_t n = 1 + r * 37 % width;  // lengths off the lane width too
      out[r * 4 + 0] = lane_sum(a, n);
      out[r * 4 + 1] = lane_dot(a, b, n);
      out[r * 4 + 2] = lane_max(a, n);
      out[r * 4 + 3] = lane_sum(n, [a](int64_t i) { return exp_fast(a[i]); });
    }
    return out;
  });
}

}  // namespace
}  // namespace crucible::kernels
