// kernels/cpu/decode.h: the decode step's products give every element the bits of one lanes.h
// dot product, whatever the batch around its row.
#include "kernels/cpu/decode.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/lanes.h"

namespace crucible::kernels {
namespace {

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

TEST(MatmulRows, EveryElementIsTheLaneDotOfItsRowForAnyBatchAndWidth) {
  const int64_t OC = 7;
  for (int64_t C : {1, 15, 16, 33, 100}) {
    const std::vector<float> weight = Random(static_cast<size_t>(OC * C), 1);
    for (int64_t N = 1; N <= 9; ++N) {
      const std::vector<float> inp =
          Random(static_cast<size_t>(N * C), 2 + static_cast<uint32_t>(N));
      std::vector<float> out(static_cast<size_t>(N * OC));
      matmul_rows(out.data(), inp.data(), weight.data(), N, C, OC);
      for (int64_t i = 0; i < N; ++i) {
        std::vector<float> alone(static_cast<size_t>(OC));
        matmul_rows(alone.data(), inp.data() + i * C, weight.data(), 1, C, OC);
        for (int64_t j = 0; j < OC; ++j) {
          const float expected = lane_dot(inp.data() + i * C, weight.data() + j * C, C);
          const float got = out[static_cast<size_t>(i * OC + j)];
          EXPECT_EQ(std::memcmp(&got, &expected, 4), 0) << "C=" << C << " N=" << N << " i=" << i;
          EXPECT_EQ(std::memcmp(&alone[static_cast<size_t>(j)], &expected, 4), 0);
        }
      }
    }
  }
}

}  // namespace
}  // namespace crucible::kernels
