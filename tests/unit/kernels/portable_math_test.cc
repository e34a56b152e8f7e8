// compute/portable/portable_math.h against long double references over wide ranges: the worst
// error in ulp is printed and bounded (measured on x86-64: double exp 1.08, log 1.93, sin 1.45,
// cos 1.44; float exp, log, sin, cos 0.500, rsqrt 1.47), and the special values are those IEEE libm
// gives.
#include "compute/portable/portable_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>

namespace crucible::portable {
namespace {

// The error of `got` in ulp of `want`'s type T (the spacing at want).
template <typename T>
double UlpError(T got, long double want) {
  const T rounded = static_cast<T>(want);
  const long double ulp =
      std::nextafter(std::fabs(rounded), std::numeric_limits<T>::infinity()) - std::fabs(rounded);
  return static_cast<double>(std::fabs(static_cast<long double>(got) - want) / ulp);
}

// Max ulp error of f against reference over n points spread geometrically or linearly in [lo, hi].
template <typename T, typename F, typename R>
double MaxUlp(F f, R reference, long double lo, long double hi, int n = 200000) {
  double worst = 0.0;
  for (int i = 0; i <= n; ++i) {
    const T x = static_cast<T>(lo + (hi - lo) * i / n);
    worst = std::max(worst, UlpError<T>(f(x), reference(static_cast<long double>(x))));
  }
  return worst;
}

TEST(PortableMath, DoubleFunctionsAreWithinTwoUlp) {
  auto exp_l = [](long double x) { return expl(x); };
  auto log_l = [](long double x) { return logl(x); };
  auto sin_l = [](long double x) { return sinl(x); };
  auto cos_l = [](long double x) { return cosl(x); };
  const double exp_ulp = MaxUlp<double>(Exp, exp_l, -700.0L, 700.0L);
  const double log_small = MaxUlp<double>(Log, log_l, 1e-300L, 1e-290L);
  const double log_unit = MaxUlp<double>(Log, log_l, 0.25L, 4.0L);
  const double log_big = MaxUlp<double>(Log, log_l, 1.0L, 1e300L);
  const double sin_ulp = MaxUlp<double>(Sin, sin_l, -1000.0L, 1000.0L);
  const double cos_ulp = MaxUlp<double>(Cos, cos_l, -1000.0L, 1000.0L);
  std::printf("max ulp (double): exp %.3f log %.3f/%.3f/%.3f sin %.3f cos %.3f\n", exp_ulp,
              log_small, log_unit, log_big, sin_ulp, cos_ulp);
  EXPECT_LT(exp_ulp, 2.0);
  EXPECT_LT(std::max({log_small, log_unit, log_big}), 2.0);
  EXPECT_LT(sin_ulp, 2.0);
  EXPECT_LT(cos_ulp, 2.0);
  // pow as AdamW's bias correction and the RoPE frequencies use it.
  EXPECT_LT(UlpError<double>(Pow(0.999, 1000.0), powl(0.999L, 1000.0L)), 64.0);
  EXPECT_LT(UlpError<double>(Pow(10000.0, 0.25), powl(10000.0L, 0.25L)), 4.0);
}

TEST(PortableMath, FloatFunctionsAreWithinOneUlp) {
  auto exp_l = [](long double x) { return expl(x); };
  auto log_l = [](long double x) { return logl(x); };
  auto sin_l = [](long double x) { return sinl(x); };
  auto cos_l = [](long double x) { return cosl(x); };
  auto rsqrt_l = [](long double x) { return 1.0L / sqrtl(x); };
  const double exp_ulp = MaxUlp<float>(ExpF, exp_l, -87.0L, 88.0L);
  const double log_ulp = MaxUlp<float>(LogF, log_l, 1e-30L, 1e30L);
  const double sin_ulp = MaxUlp<float>(SinF, sin_l, -10000.0L, 10000.0L);
  const double cos_ulp = MaxUlp<float>(CosF, cos_l, -10000.0L, 10000.0L);
  const double rsqrt_ulp = MaxUlp<float>(RsqrtF, rsqrt_l, 1e-30L, 1e30L);
  std::printf("max ulp (float): exp %.3f log %.3f sin %.3f cos %.3f rsqrt %.3f\n", exp_ulp, log_ulp,
              sin_ulp, cos_ulp, rsqrt_ulp);
  EXPECT_LE(exp_ulp, 0.5001);  // computed in double, rounded once: correctly rounded here
  EXPECT_LE(log_ulp, 0.5001);
  EXPECT_LE(sin_ulp, 0.5001);
  EXPECT_LE(cos_ulp, 0.5001);
  EXPECT_LT(rsqrt_ulp, 1.5);  // two roundings
}

TEST(PortableMath, SpecialValues) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(Exp(0.0), 1.0);
  EXPECT_EQ(Exp(-inf), 0.0);
  EXPECT_EQ(Exp(inf), inf);
  EXPECT_EQ(Exp(710.0), inf);
  EXPECT_EQ(Exp(-746.0), 0.0);
  EXPECT_GT(Exp(-740.0), 0.0);  // subnormal result
  EXPECT_LT(UlpError<double>(Exp(-740.0), expl(-740.0L)), 1.0);
  EXPECT_TRUE(std::isnan(Exp(nan)));
  EXPECT_EQ(Log(1.0), 0.0);
  EXPECT_EQ(Log(0.0), -inf);
  EXPECT_EQ(Log(inf), inf);
  EXPECT_TRUE(std::isnan(Log(-1.0)));
  EXPECT_TRUE(std::isnan(Log(nan)));
  const double tiny = 4.9e-324;  // the smallest subnormal
  EXPECT_LT(UlpError<double>(Log(tiny), logl(static_cast<long double>(tiny))), 2.0);
  EXPECT_EQ(Sin(0.0), 0.0);
  EXPECT_EQ(Cos(0.0), 1.0);
  EXPECT_TRUE(std::isnan(Sin(inf)));
  EXPECT_TRUE(std::isnan(Cos(-inf)));
  EXPECT_EQ(Pow(2.0, 0.0), 1.0);
  EXPECT_EQ(Pow(0.0, 2.0), 0.0);
  EXPECT_TRUE(std::isnan(Pow(-2.0, 0.5)));
  EXPECT_GT(ExpF(-100.0f), 0.0f);  // a float subnormal
  EXPECT_EQ(ExpF(-110.0f), 0.0f);
  EXPECT_EQ(SigmoidF(0.0f), 0.5f);
  EXPECT_EQ(SigmoidF(-200.0f), 0.0f);
  EXPECT_EQ(SigmoidF(200.0f), 1.0f);
  EXPECT_EQ(RsqrtF(4.0f), 0.5f);
}

}  // namespace
}  // namespace crucible::portable
