// The precision contract of the 128-bit fixed-point sums (distributed/exact_sum.h): exact from
// 2^-40 up, truncated toward zero at 2^-64, refused from 2^62; one rounding back to float.
// (Order independence and the int64 fast paths: tests/unit/optim/optim_test.cc.)
#include "distributed/exact_sum.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace crucible {
namespace {

constexpr __int128 kOne = __int128{1} << 64;  // 1.0 in fixed point

__int128 Fixed(float value) {
  __int128 out = -1;
  EXPECT_TRUE(FloatToInt128(&value, &out, 1)) << value;
  return out;
}

TEST(ExactSum, ValuesFrom2ToTheMinus40ConvertExactlyAndSmallerOnesTruncateAt2ToTheMinus64) {
  EXPECT_TRUE(Fixed(1.0f) == kOne);
  EXPECT_TRUE(Fixed(-0.75f) == -(kOne / 4) * 3);
  EXPECT_TRUE(Fixed(std::ldexp(1.0f, -40)) == (__int128{1} << 24));
  // A float of magnitude >= 2^-40 has no bit below 2^-64: 1.5 * 2^-40 is still exact.
  EXPECT_TRUE(Fixed(std::ldexp(1.5f, -40)) == (__int128{3} << 23));
  EXPECT_TRUE(Fixed(std::ldexp(1.0f, -64)) == 1);
  EXPECT_TRUE(Fixed(std::ldexp(1.75f, -64)) == 1);  // truncated
  EXPECT_TRUE(Fixed(std::ldexp(1.0f, -65)) == 0);
  EXPECT_TRUE(Fixed(-std::ldexp(1.75f, -64)) == -1);  // toward zero
  EXPECT_TRUE(Fixed(std::numeric_limits<float>::denorm_min()) == 0);
}

TEST(ExactSum, MagnitudesFrom2ToThe62AreRefusedAndZeroed) {
  const float below = std::nextafter(std::ldexp(1.0f, 62), 0.0f);
  const std::vector<float> values = {below,
                                     std::ldexp(1.0f, 62),
                                     -std::ldexp(1.0f, 62),
                                     2.0f,
                                     std::numeric_limits<float>::infinity(),
                                     std::nanf("")};
  std::vector<__int128> out(values.size(), 77);
  EXPECT_FALSE(FloatToInt128(values.data(), out.data(), values.size()));
  EXPECT_TRUE(out[0] == static_cast<__int128>(static_cast<double>(below) * 0x1p64));
  EXPECT_TRUE(out[1] == 0 && out[2] == 0 && out[4] == 0 && out[5] == 0);
  EXPECT_TRUE(out[3] == 2 * kOne);  // the other elements still convert
  EXPECT_TRUE(FloatToInt128(values.data(), out.data(), 1));
}

TEST(ExactSum, AddRangeTouchesOnlyItsRangeAndSkipsWhatItRefuses) {
  ExactAccumulator accumulator(4);
  accumulator.Zero();
  float values[2] = {0.5f, -2.0f};
  EXPECT_TRUE(accumulator.AddRange(1, 3, values));
  EXPECT_TRUE(accumulator.AddRange(1, 3, values));
  EXPECT_TRUE(accumulator.data()[0] == 0 && accumulator.data()[3] == 0);
  EXPECT_TRUE(accumulator.data()[1] == kOne && accumulator.data()[2] == -4 * kOne);
  float bad[2] = {1.0f, std::numeric_limits<float>::infinity()};
  EXPECT_FALSE(accumulator.AddRange(0, 2, bad));
  EXPECT_TRUE(accumulator.data()[0] == kOne);  // the finite element was added
  EXPECT_TRUE(accumulator.data()[1] == kOne);  // the refused one was not
}

TEST(ExactSum, AddInt128AddsElementwise) {
  const __int128 in[3] = {kOne << 40, -5, 0};
  __int128 sum[3] = {kOne << 40, 7, -1};
  AddInt128(in, sum, 3);
  EXPECT_TRUE(sum[0] == (kOne << 41) && sum[1] == 2 && sum[2] == -1);
}

TEST(ExactSum, TheSumConvertsToTheNearestFloat) {
  // 1 + 2^-24 lies halfway between 1 and the next float: to even. 1 + 3 * 2^-25 rounds up.
  const __int128 sums[4] = {kOne + (kOne >> 24), kOne + 3 * (kOne >> 25), -(kOne >> 2) - 1,
                            kOne << 62};
  float out[4];
  Int128ToFloat(sums, out, 4);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], std::nextafter(1.0f, 2.0f));
  EXPECT_EQ(out[2], -0.25f);
  EXPECT_EQ(out[3], std::ldexp(1.0f, 62));  // sums beyond what one value may be
}

// One contribution per element (one rank, one micro-batch): the exact sum of one value is that
// value truncated at 2^-64, so it is rounded in place, with the bits of the 128-bit round trip.
TEST(ExactSum, RoundingInPlaceGivesTheBitsOfThe128BitRoundTrip) {
  std::vector<float> values = {0.0f,
                               -0.0f,
                               1.0f,
                               -0.75f,
                               std::ldexp(1.75f, -64),
                               -std::ldexp(1.75f, -64),
                               std::ldexp(1.0f, -65),
                               -std::ldexp(1.0f, -65),  // truncates to zero: +0, as the sum's
                               -1e-30f,
                               std::numeric_limits<float>::denorm_min(),
                               -std::numeric_limits<float>::denorm_min(),
                               std::nextafter(std::ldexp(1.0f, 62), 0.0f),
                               -std::nextafter(std::ldexp(1.0f, 62), 0.0f)};
  uint32_t state = 12345;
  for (int i = 0; i < 200000; ++i) {  // every exponent from 2^-90 to 2^40, both signs
    state = state * 1664525u + 1013904223u;
    const float mantissa = 1.0f + static_cast<float>(state >> 9) * 0x1p-23f;
    const int exponent = static_cast<int>((state >> 1) % 131) - 90;
    values.push_back((state & 1 ? -1.0f : 1.0f) * std::ldexp(mantissa, exponent));
  }
  std::vector<__int128> fixed(values.size());
  ASSERT_TRUE(FloatToInt128(values.data(), fixed.data(), values.size()));
  std::vector<float> expected(values.size());
  Int128ToFloat(fixed.data(), expected.data(), values.size());
  std::vector<float> rounded = values;
  ASSERT_TRUE(RoundToFixedPointInPlace(rounded.data(), rounded.size()));
  for (size_t i = 0; i < values.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(rounded[i]), std::bit_cast<uint32_t>(expected[i]))
        << "value " << values[i] << " (index " << i << ")";
  EXPECT_EQ(std::bit_cast<uint32_t>(rounded[7]), 0u);  // -2^-65: +0, not -0
}

TEST(ExactSum, RoundingInPlaceLeavesWhatItRefusesForTheCallerToFind) {
  std::vector<float> values = {std::ldexp(1.75f, -64), std::nanf(""),
                               std::numeric_limits<float>::infinity(), std::ldexp(1.0f, 62), 2.0f};
  EXPECT_FALSE(RoundToFixedPointInPlace(values.data(), values.size()));
  EXPECT_EQ(values[0], std::ldexp(1.0f, -64));  // the others are still rounded
  EXPECT_TRUE(std::isnan(values[1]));
  EXPECT_TRUE(std::isinf(values[2]));
  EXPECT_EQ(values[3], std::ldexp(1.0f, 62));
  EXPECT_EQ(values[4], 2.0f);
}

TEST(ExactSum, AnInPlaceAccumulatorHoldsNoSumsAndRoundsOnlyItsRange) {
  ExactAccumulator accumulator = ExactAccumulator::InPlace();
  EXPECT_TRUE(accumulator.in_place());
  EXPECT_EQ(accumulator.size(), 0u);
  accumulator.Zero();
  float grads[4] = {std::ldexp(1.75f, -64), std::ldexp(1.75f, -64), std::ldexp(1.75f, -64), 3.0f};
  EXPECT_TRUE(accumulator.AddRange(1, 3, grads + 1));
  EXPECT_EQ(grads[0], std::ldexp(1.75f, -64));  // outside the range: untouched
  EXPECT_EQ(grads[1], std::ldexp(1.0f, -64));
  EXPECT_EQ(grads[2], std::ldexp(1.0f, -64));
  EXPECT_EQ(grads[3], 3.0f);
  EXPECT_FALSE(ExactAccumulator(4).in_place());
}

TEST(ExactSum, ADoubleIsExactOnTheGridDownTo2ToMinus12AndTruncatedBelow) {
  __int128 fixed = 0;
  // |v| >= 2^-12: every bit of the double is on the grid 2^-64, so the round trip is exact.
  for (double v : {1.0, -0.0625, 0.062115751419194336, std::ldexp(1.0 + 0x1.fffffffffffffp-1, -12),
                   -123456.789, std::ldexp(1.0, 61)}) {
    ASSERT_TRUE(DoubleToFixed(v, &fixed)) << v;
    EXPECT_EQ(FixedToDouble(fixed), v) << v;
  }
  // Below: truncated toward zero at 2^-64.
  ASSERT_TRUE(DoubleToFixed(std::ldexp(1.75, -64), &fixed));
  EXPECT_EQ(fixed, 1);
  ASSERT_TRUE(DoubleToFixed(-std::ldexp(1.75, -64), &fixed));
  EXPECT_EQ(fixed, -1);
  ASSERT_TRUE(DoubleToFixed(std::ldexp(1.0, -70), &fixed));
  EXPECT_EQ(fixed, 0);
  // A sum of the integers is the same in any order, and one rounding back.
  const double values[] = {0.1, 1e-3, 12345.678, -0.3, 7e-5};
  __int128 forward = 0, backward = 0;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(DoubleToFixed(values[i], &fixed));
    forward += fixed;
    ASSERT_TRUE(DoubleToFixed(values[4 - i], &fixed));
    backward += fixed;
  }
  EXPECT_EQ(forward, backward);
  // Refused, as 0: non-finite and |v| >= 2^62.
  for (double v : {std::nan(""), std::numeric_limits<double>::infinity(), std::ldexp(1.0, 62),
                   -std::ldexp(1.0, 63)}) {
    fixed = 5;
    EXPECT_FALSE(DoubleToFixed(v, &fixed)) << v;
    EXPECT_EQ(fixed, 0);
  }
}

}  // namespace
}  // namespace crucible
