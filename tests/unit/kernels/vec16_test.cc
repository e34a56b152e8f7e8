// The 16-lane row loops (kernels/cpu/vec16.h) give exactly the bits of the scalar code they stand
// for — exp_fast, lane_sum, lane_max — compiled for AVX2 (two ymm per vector) and, where the CPU
// has it, for AVX-512 (one zmm): over the whole float range, the specials, and every row length
// that crosses a vector border.
#include "kernels/cpu/vec16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/lanes.h"
#include "kernels/cpu/vec_math.h"

#pragma GCC diagnostic ignored "-Wpsabi"

namespace crucible::kernels {
namespace {

// The loops under test, once per width. `out` receives Exp of each input (whole vectors only).
struct Loops {
  void (*exp)(float* out, const float* x, int64_t n);
  float (*max)(const float* x, int64_t n);
  float (*sum_write)(float* out, const float* x, int64_t n, float shift);
  float (*sum)(const float* x, int64_t n, float shift);
  void (*scaled)(float* x, int64_t n, float shift, float scale);
  float (*max_padded)(const float* x, int64_t n);
  float (*sum_padded)(float* out, const float* x, int64_t n, float shift);
};

[[gnu::always_inline]] inline void ExpAll(float* out, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; i += vec16::kWidth)
    vec16::Store(out + i, vec16::Exp(vec16::Load(x + i)));
}

#define CRUCIBLE_VEC16_LOOPS(suffix, attr)                                           \
  attr void Exp##suffix(float* out, const float* x, int64_t n) {                     \
    ExpAll(out, x, n);                                                               \
  }                                                                                  \
  attr float Max##suffix(const float* x, int64_t n) {                                \
    return vec16::Max(x, n);                                                         \
  }                                                                                  \
  attr float SumWrite##suffix(float* out, const float* x, int64_t n, float shift) {  \
    return vec16::ExpShiftedSum(out, x, n, shift);                                   \
  }                                                                                  \
  attr float Sum##suffix(const float* x, int64_t n, float shift) {                   \
    return vec16::ExpShiftedSum(x, n, shift);                                        \
  }                                                                                  \
  attr void Scaled##suffix(float* x, int64_t n, float shift, float scale) {          \
    vec16::ExpShiftedScaled(x, n, shift, scale);                                     \
  }                                                                                  \
  attr float MaxPadded##suffix(const float* x, int64_t n) {                          \
    return vec16::Max<true>(x, n);                                                   \
  }                                                                                  \
  attr float SumPadded##suffix(float* out, const float* x, int64_t n, float shift) { \
    return vec16::ExpShiftedSum<true>(out, x, n, shift);                             \
  }
CRUCIBLE_VEC16_LOOPS(Avx2, )
CRUCIBLE_VEC16_LOOPS(Avx512, __attribute__((target("avx512f"))))

std::vector<Loops> LoopsHere() {
  std::vector<Loops> loops = {
      {ExpAvx2, MaxAvx2, SumWriteAvx2, SumAvx2, ScaledAvx2, MaxPaddedAvx2, SumPaddedAvx2}};
  if (cpu_has_avx512f())
    loops.push_back({ExpAvx512, MaxAvx512, SumWriteAvx512, SumAvx512, ScaledAvx512, MaxPaddedAvx512,
                     SumPaddedAvx512});
  return loops;
}

uint32_t Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

TEST(Vec16, ExpIsExpFastBitForBitOverTheFloatRange) {
  std::vector<float> x;
  const float inf = std::numeric_limits<float>::infinity();
  for (float s :
       {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(), -87.3f, 88.0f,
        std::nextafter(-87.3f, 0.0f), std::nextafter(-87.3f, -inf), std::nextafter(88.0f, inf),
        1e-45f, -1e-45f, 0.5f, -0.5f, 0.34657359f, -0.34657359f, 1e30f, -1e30f})
    x.push_back(s);
  // Every 4099th bit pattern: all exponents and signs, NaNs included.
  for (uint64_t b = 0; b <= 0xffffffffull; b += 4099) {
    const uint32_t bits = static_cast<uint32_t>(b);
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    x.push_back(f);
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
  for (int i = 0; i < 200000; ++i) x.push_back(dist(rng));
  x.resize((x.size() + 15) / 16 * 16, 0.0f);
  for (const Loops& loops : LoopsHere()) {
    std::vector<float> out(x.size());
    loops.exp(out.data(), x.data(), static_cast<int64_t>(x.size()));
    int64_t mismatches = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const float want = exp_fast(x[i]);
      const bool same = Bits(out[i]) == Bits(want) || (std::isnan(out[i]) && std::isnan(want));
      if (!same && ++mismatches <= 5)
        ADD_FAILURE() << "exp(" << x[i] << "): vec16 " << out[i] << ", exp_fast " << want;
    }
    EXPECT_EQ(mismatches, 0);
  }
}

TEST(Vec16, RowLoopsGiveTheBitsOfTheScalarLaneLoops) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (const Loops& loops : LoopsHere()) {
    for (int64_t n = 1; n <= 70; ++n) {
      std::vector<float> x(n);
      for (float& v : x) v = dist(rng);
      if (n % 5 == 0) x[n / 2] = -0.0f;  // signed zeros in the maximum's path
      const float shift = lane_max(x.data(), n);
      EXPECT_EQ(Bits(loops.max(x.data(), n)), Bits(shift)) << "n=" << n;

      std::vector<float> want(n), got(n + 1, 123.0f);  // got[n]: must stay untouched
      for (int64_t j = 0; j < n; ++j) want[j] = exp_fast(x[j] - shift);
      const float want_sum = lane_sum(want.data(), n);
      EXPECT_EQ(Bits(loops.sum_write(got.data(), x.data(), n, shift)), Bits(want_sum)) << n;
      EXPECT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0) << "n=" << n;
      EXPECT_EQ(got[n], 123.0f) << "written past the row, n=" << n;
      EXPECT_EQ(Bits(loops.sum(x.data(), n, shift)), Bits(want_sum)) << "n=" << n;

      std::vector<float> scaled = x;
      scaled.push_back(123.0f);
      loops.scaled(scaled.data(), n, shift, 0.37f);
      for (int64_t j = 0; j < n; ++j)
        ASSERT_EQ(Bits(scaled[j]), Bits(exp_fast(x[j] - shift) * 0.37f)) << "n=" << n << " j=" << j;
      EXPECT_EQ(scaled[n], 123.0f) << "written past the row, n=" << n;

      // In a padded row, whatever lies past n (here huge values and a NaN) changes nothing; the
      // padding up to the next multiple of 16 is zeroed, the next value is not touched.
      const int64_t padded = (n + 15) / 16 * 16;
      std::vector<float> row(padded + 1, 1e30f);
      std::copy(x.begin(), x.end(), row.begin());
      if (n < padded) row[padded - 1] = std::numeric_limits<float>::quiet_NaN();
      EXPECT_EQ(Bits(loops.max_padded(row.data(), n)), Bits(shift)) << "n=" << n;
      std::vector<float> out(padded + 1, 123.0f);
      EXPECT_EQ(Bits(loops.sum_padded(out.data(), row.data(), n, shift)), Bits(want_sum)) << n;
      EXPECT_EQ(std::memcmp(out.data(), want.data(), n * sizeof(float)), 0) << "n=" << n;
      for (int64_t j = n; j < padded; ++j) EXPECT_EQ(Bits(out[j]), 0u) << "n=" << n << " j=" << j;
      EXPECT_EQ(out[padded], 123.0f) << "written past the padding, n=" << n;
    }
  }
}

TEST(Vec16, MaxPicksTheZeroAndTheNanLaneMaxPicks) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const Loops& loops : LoopsHere()) {
    std::vector<float> zeros(33, 0.0f);
    for (size_t i = 0; i < zeros.size(); i += 3) zeros[i] = -0.0f;
    for (int64_t n : {1, 2, 16, 17, 33})
      EXPECT_EQ(Bits(loops.max(zeros.data(), n)), Bits(lane_max(zeros.data(), n))) << n;
    // Infinities take the ordered walk (their lanes' acc - acc is NaN): the same value.
    const float inf = std::numeric_limits<float>::infinity();
    for (float special : {inf, -inf}) {
      for (int64_t at : {0, 7, 20}) {
        std::vector<float> with_inf(33);
        for (size_t i = 0; i < with_inf.size(); ++i) with_inf[i] = static_cast<float>(i % 5) - 2;
        with_inf[at] = special;
        EXPECT_EQ(Bits(loops.max(with_inf.data(), 33)), Bits(lane_max(with_inf.data(), 33)))
            << special << " at " << at;
      }
    }
    // A NaN survives in its lane only until a later value of that lane replaces it, in both.
    for (int64_t at : {0, 5, 21, 37, 39}) {
      std::vector<float> with_nan(40);
      for (size_t i = 0; i < with_nan.size(); ++i) with_nan[i] = static_cast<float>(i % 7);
      with_nan[at] = nan;
      for (int64_t n : {at + 1, int64_t{40}}) {
        const float got = loops.max(with_nan.data(), n), want = lane_max(with_nan.data(), n);
        EXPECT_TRUE(Bits(got) == Bits(want) || (std::isnan(got) && std::isnan(want)))
            << "NaN at " << at << ", n=" << n << ": " << got << " vs " << want;
      }
    }
  }
}

}  // namespace
}  // namespace crucible::kernels
