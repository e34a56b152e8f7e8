#include "common/philox.h"

#include <gtest/gtest.h>

#include <cmath>

namespace crucible {
namespace {

// Known-answer test from the Random123 distribution (kat_vectors: philox4x32_10).
TEST(Philox, MatchesRandom123KnownAnswers) {
  PhiloxBlock zero = Philox4x32({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(zero[0], 0x6627e8d5u);
  EXPECT_EQ(zero[1], 0xe169c58du);
  EXPECT_EQ(zero[2], 0xbc57ac4cu);
  EXPECT_EQ(zero[3], 0x9b00dbd8u);
  PhiloxBlock ones =
      Philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu});
  EXPECT_EQ(ones[0], 0x408f276du);
  EXPECT_EQ(ones[1], 0x41c83b0eu);
  EXPECT_EQ(ones[2], 0xa20bc7c6u);
  EXPECT_EQ(ones[3], 0x6d5451fdu);
  PhiloxBlock pi =
      Philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u});
  EXPECT_EQ(pi[0], 0xd16cfe09u);
  EXPECT_EQ(pi[1], 0x94fdccebu);
  EXPECT_EQ(pi[2], 0x5001e420u);
  EXPECT_EQ(pi[3], 0x24126ea1u);
}

TEST(Philox, OffsetsJumpIntoTheStream) {
  Philox sequential(42, 3);
  std::vector<uint32_t> values;
  for (int i = 0; i < 11; ++i) values.push_back(sequential.NextU32());
  for (int offset = 0; offset < 11; ++offset) {
    Philox jumped(42, 3, offset);
    EXPECT_EQ(jumped.NextU32(), values[offset]) << offset;
  }
}

TEST(Philox, NextBelowIsInRangeAndRoughlyUniform) {
  Philox rng(1, 2);
  std::vector<int> counts(10);
  for (int i = 0; i < 100000; ++i) {
    uint64_t v = rng.NextBelow(10);
    ASSERT_LT(v, 10u);
    ++counts[v];
  }
  for (int c : counts) EXPECT_NEAR(c, 10000, 500);
}

TEST(Philox, NormalHasUnitVariance) {
  Philox rng(5, 0);
  double sum = 0, sum_sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    double z = rng.NextNormal();
    sum += z;
    sum_sq += z * z;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sum_sq / n, 1.0, 0.02);
}

}  // namespace
}  // namespace crucible
