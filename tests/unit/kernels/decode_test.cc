// kernels/cpu/decode.h: the decode step's products give every element the bits of one lanes.h
// dot product, whatever the batch around its row.
#include "kernels/cpu/decode.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/half.h"
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

// 16-bit weights: every element is the lane dot of its row with the weight row widened to float32
// (exactly), for any batch and any width (the 16-wide blocks and the tail).
TEST(MatmulRows, SixteenBitWeightsAreTheLaneDotOfTheWidenedRow) {
  const int64_t OC = 5;
  for (WeightType type : {WeightType::kF16, WeightType::kBF16}) {
    for (int64_t C : {1, 16, 37, 100}) {
      const std::vector<float> weight = Random(static_cast<size_t>(OC * C), 7);
      std::vector<uint16_t> half(weight.size());
      std::vector<float> widened(weight.size());
      for (size_t i = 0; i < weight.size(); ++i) {
        half[i] = type == WeightType::kF16 ? Fp16Bits(weight[i]) : Bf16Bits(weight[i]);
        widened[i] = type == WeightType::kF16 ? FromFp16(half[i]) : FromBf16(half[i]);
      }
      for (int64_t N : {1, 3, 4, 6}) {
        const std::vector<float> inp = Random(static_cast<size_t>(N * C), 9);
        std::vector<float> out(static_cast<size_t>(N * OC));
        matmul_rows(out.data(), inp.data(), RowWeights(half.data(), type), N, C, OC);
        for (int64_t i = 0; i < N; ++i)
          for (int64_t j = 0; j < OC; ++j) {
            const float expected = lane_dot(inp.data() + i * C, widened.data() + j * C, C);
            EXPECT_EQ(std::memcmp(&out[static_cast<size_t>(i * OC + j)], &expected, 4), 0)
                << WeightTypeName(type) << " C=" << C << " N=" << N;
          }
      }
    }
  }
}

// Several products in one region: each output the bits of its own matmul_rows, for any thread
// count (the threads' shares cut across the products' boundaries).
TEST(MatmulRows, ManyProductsInOneRegionAreEachProductAlone) {
  const int64_t C = 40, N = 3;
  const int64_t widths[3] = {7, 1, 13};
  std::vector<std::vector<float>> weights, alone;
  for (int p = 0; p < 3; ++p) {
    weights.push_back(Random(static_cast<size_t>(widths[p] * C), 20 + p));
    alone.emplace_back(static_cast<size_t>(N * widths[p]));
  }
  const std::vector<float> inp = Random(static_cast<size_t>(N * C), 30);
  for (int p = 0; p < 3; ++p)
    matmul_rows(alone[p].data(), inp.data(), weights[p].data(), N, C, widths[p]);
  const int before = omp_get_max_threads();
  for (int threads : {1, 2, 3, 5}) {
    omp_set_num_threads(threads);
    std::vector<std::vector<float>> out;
    std::vector<RowProduct> products;
    for (int p = 0; p < 3; ++p) out.emplace_back(static_cast<size_t>(N * widths[p]));
    for (int p = 0; p < 3; ++p) products.push_back({out[p].data(), weights[p].data(), widths[p]});
    matmul_rows(products.data(), 3, inp.data(), N, C);
    for (int p = 0; p < 3; ++p)
      EXPECT_EQ(std::memcmp(out[p].data(), alone[p].data(), out[p].size() * 4), 0)
          << "product " << p << " threads " << threads;
  }
  omp_set_num_threads(before);
}

// The 16-bit conversions: round to nearest even at the edges of each format.
TEST(HalfPrecision, RoundsToNearestEvenAndKeepsSpecials) {
  EXPECT_EQ(Fp16Bits(1.0f), 0x3C00);
  EXPECT_EQ(Fp16Bits(-2.0f), 0xC000);
  EXPECT_EQ(Fp16Bits(65504.0f), 0x7BFF);
  EXPECT_EQ(Fp16Bits(65520.0f), 0x7C00);             // the tie above the largest: infinity
  EXPECT_EQ(Fp16Bits(1.0f + 0x1p-11f), 0x3C00);      // a tie: to even
  EXPECT_EQ(Fp16Bits(1.0f + 3 * 0x1p-11f), 0x3C02);  // a tie: to even, upwards
  EXPECT_EQ(Fp16Bits(0x1p-24f), 0x0001);             // the smallest subnormal
  EXPECT_EQ(Fp16Bits(0x1p-25f), 0x0000);             // half of it: a tie, to zero
  EXPECT_NE(FromFp16(Fp16Bits(std::nanf(""))), FromFp16(Fp16Bits(std::nanf(""))));
  EXPECT_EQ(FromFp16(0x3555), 0.333251953125f);
  EXPECT_EQ(Bf16Bits(1.0f), 0x3F80);
  EXPECT_EQ(Bf16Bits(1.0f + 0x1p-8f), 0x3F80);  // a tie: to even
  EXPECT_EQ(Bf16Bits(1.0f + 3 * 0x1p-8f), 0x3F82);
  EXPECT_EQ(FromBf16(0xC0A0), -5.0f);
  EXPECT_NE(FromBf16(Bf16Bits(std::nanf(""))), FromBf16(Bf16Bits(std::nanf(""))));
}

}  // namespace
}  // namespace crucible::kernels
