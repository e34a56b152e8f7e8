// Portable math: exp, log, sin, cos, pow, 1/sqrt and the sigmoid, built only of IEEE basic
// operations (+ - * / sqrt, each correctly rounded in C++ and in CUDA alike) and integer bit
// manipulation, so that a C++ compiler on any CPU and nvcc on any GPU give the same bits. libm
// and CUDA's math library are never called: their transcendental functions differ by vendor and
// version. This header is the one implementation both compilers take (CRUCIBLE_HD).
//
// No contraction: every operation goes through Add/Sub/Mul/Div below. On the GPU they are
// __fadd_rn-style intrinsics, which nvcc never fuses into a multiply-add whatever -fmad says; on
// the host they are plain operators, and the file that includes this header must be compiled
// with -ffp-contract=off (the project's flags; CMakeLists.txt sets it on every build type).
//
// Accuracy (tests/unit/kernels/portable_math_test.cc measures it against long double): the
// double functions are within a few ulp of double; the float functions compute in double and
// round once, so they are correctly rounded except within about 2^-29 of a float rounding
// boundary (measured: at most 1 ulp of float). Sin and Cos reduce by pi/2 in three 33-bit
// pieces: full accuracy for |x| < 2^20, less beyond (still the same bits everywhere). Pow(x, y)
// is Exp(y * Log(x)) for x > 0 (relative error about |y log x| ulp of double); x <= 0 gives NaN
// except Pow(0, y > 0) = 0.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define CRUCIBLE_HD __host__ __device__
#else
#define CRUCIBLE_HD
#endif

namespace crucible::portable {

// ---- the basic operations, never fused ----
#if defined(__CUDA_ARCH__)
CRUCIBLE_HD inline float Add(float a, float b) {
  return __fadd_rn(a, b);
}
CRUCIBLE_HD inline float Sub(float a, float b) {
  return __fsub_rn(a, b);
}
CRUCIBLE_HD inline float Mul(float a, float b) {
  return __fmul_rn(a, b);
}
CRUCIBLE_HD inline float Div(float a, float b) {
  return __fdiv_rn(a, b);
}
CRUCIBLE_HD inline float Sqrt(float a) {
  return __fsqrt_rn(a);
}
CRUCIBLE_HD inline double Add(double a, double b) {
  return __dadd_rn(a, b);
}
CRUCIBLE_HD inline double Sub(double a, double b) {
  return __dsub_rn(a, b);
}
CRUCIBLE_HD inline double Mul(double a, double b) {
  return __dmul_rn(a, b);
}
CRUCIBLE_HD inline double Div(double a, double b) {
  return __ddiv_rn(a, b);
}
CRUCIBLE_HD inline double Sqrt(double a) {
  return __dsqrt_rn(a);
}
CRUCIBLE_HD inline uint64_t DoubleBits(double x) {
  return __double_as_longlong(x);
}
CRUCIBLE_HD inline double BitsToDouble(uint64_t b) {
  return __longlong_as_double(b);
}
#else
inline float Add(float a, float b) {
  return a + b;
}
inline float Sub(float a, float b) {
  return a - b;
}
inline float Mul(float a, float b) {
  return a * b;
}
inline float Div(float a, float b) {
  return a / b;
}
inline float Sqrt(float a) {
  return __builtin_sqrtf(a);
}
inline double Add(double a, double b) {
  return a + b;
}
inline double Sub(double a, double b) {
  return a - b;
}
inline double Mul(double a, double b) {
  return a * b;
}
inline double Div(double a, double b) {
  return a / b;
}
inline double Sqrt(double a) {
  return __builtin_sqrt(a);
}
inline uint64_t DoubleBits(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}
inline double BitsToDouble(uint64_t b) {
  double x;
  std::memcpy(&x, &b, sizeof(x));
  return x;
}
#endif

CRUCIBLE_HD inline double Infinity() {
  return BitsToDouble(0x7ff0000000000000ull);
}
CRUCIBLE_HD inline double QuietNan() {
  return BitsToDouble(0x7ff8000000000000ull);
}
CRUCIBLE_HD inline bool IsNan(double x) {
  return x != x;
}

// Round to the nearest integer (ties to even), |x| < 2^51: the 1.5 * 2^52 shifter.
CRUCIBLE_HD inline double RoundToInteger(double x) {
  const double kShifter = 6755399441055744.0;
  return Sub(Add(x, kShifter), kShifter);
}

// 2^n for an integer n in [-1022, 1023], from its bits.
CRUCIBLE_HD inline double PowerOfTwo(int64_t n) {
  return BitsToDouble(static_cast<uint64_t>(n + 1023) << 52);
}

// ---- double precision ----

// e^x. Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, then the Taylor series to r^14/14!.
CRUCIBLE_HD inline double Exp(double x) {
  if (IsNan(x)) return x;
  if (x > 709.782712893384) return Infinity();
  if (x < -745.1332191019412) return 0.0;
  const double kLog2e = 1.4426950408889634;
  const double kLn2Hi = 6.93147180369123816490e-01;  // 32 significant bits: n * kLn2Hi is exact
  const double kLn2Lo = 1.90821492927058770002e-10;
  const double n = RoundToInteger(Mul(x, kLog2e));
  const double r = Sub(Sub(x, Mul(n, kLn2Hi)), Mul(n, kLn2Lo));
  // 1/k! for k = 14 down to 2.
  const double kInverseFactorial[] = {1.1470745597729725e-11,
                                      1.6059043836821613e-10,
                                      2.08767569878681e-09,
                                      2.505210838544172e-08,
                                      2.755731922398589e-07,
                                      2.7557319223985893e-06,
                                      2.48015873015873e-05,
                                      0.0001984126984126984,
                                      0.001388888888888889,
                                      0.008333333333333333,
                                      0.041666666666666664,
                                      0.16666666666666666,
                                      0.5};
  double p = kInverseFactorial[0];
  for (int i = 1; i < 13; ++i) p = Add(Mul(p, r), kInverseFactorial[i]);
  p = Add(Mul(p, r), 1.0);
  p = Add(Mul(p, r), 1.0);
  const int64_t k = static_cast<int64_t>(n);
  if (k > 1023) return Mul(Mul(p, PowerOfTwo(1023)), 2.0);
  if (k < -1020) return Mul(Mul(p, PowerOfTwo(k + 1000)), PowerOfTwo(-1000));
  return Mul(p, PowerOfTwo(k));
}

// Natural logarithm. x = m 2^e with m in (sqrt(1/2), sqrt(2)]; log m = 2 atanh(s),
// s = (m - 1) / (m + 1), as the odd series to s^23/23.
CRUCIBLE_HD inline double Log(double x) {
  if (IsNan(x)) return x;
  if (x < 0.0) return QuietNan();
  if (x == 0.0) return -Infinity();
  if (x == Infinity()) return x;
  int64_t e = 0;
  if (x < 2.2250738585072014e-308) {  // subnormal: scale into the normal range
    x = Mul(x, 18014398509481984.0);  // 2^54
    e = -54;
  }
  const uint64_t bits = DoubleBits(x);
  e += static_cast<int64_t>((bits >> 52) & 0x7ff) - 1023;
  double m = BitsToDouble((bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull);  // [1, 2)
  if (m > 1.4142135623730951) {
    m = Mul(m, 0.5);
    e += 1;
  }
  const double f = Sub(m, 1.0);  // exact (Sterbenz)
  const double s = Div(f, Add(2.0, f));
  const double z = Mul(s, s);
  double p = Div(1.0, 23.0);
  for (int k = 21; k >= 3; k -= 2) p = Add(Mul(p, z), Div(1.0, static_cast<double>(k)));
  const double log_m = Add(Mul(Mul(2.0, s), Mul(p, z)), Mul(2.0, s));
  const double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
  const double ed = static_cast<double>(e);
  return Add(Mul(ed, kLn2Hi), Add(Mul(ed, kLn2Lo), log_m));
}

namespace detail {
// sin r and cos r for |r| <= pi/4, Taylor series to r^19 and r^18.
CRUCIBLE_HD inline double SinKernel(double r) {
  const double z = Mul(r, r);
  const double kCoefficients[] = {
      -8.220635246624329e-18, 2.8114572543455206e-15, -7.647163731819816e-13,
      1.6059043836821613e-10, -2.505210838544172e-08, 2.7557319223985893e-06,
      -0.0001984126984126984, 0.008333333333333333,   -0.16666666666666666};
  double p = kCoefficients[0];
  for (int i = 1; i < 9; ++i) p = Add(Mul(p, z), kCoefficients[i]);
  return Add(r, Mul(Mul(r, z), p));
}
CRUCIBLE_HD inline double CosKernel(double r) {
  const double z = Mul(r, r);
  const double kCoefficients[] = {-1.5619206968586225e-16, 4.779477332387385e-14,
                                  -1.1470745597729725e-11, 2.08767569878681e-09,
                                  -2.755731922398589e-07,  2.48015873015873e-05,
                                  -0.001388888888888889,   0.041666666666666664};
  double p = kCoefficients[0];
  for (int i = 1; i < 8; ++i) p = Add(Mul(p, z), kCoefficients[i]);
  // cos r = 1 - z/2 + z^2 (1/24 - ...): p holds the series from z^2 on, divided by z^2.
  return Sub(1.0, Sub(Mul(z, 0.5), Mul(Mul(z, z), p)));
}
// x = n pi/2 + r; returns r and the quadrant n mod 4.
CRUCIBLE_HD inline double ReduceHalfPi(double x, int* quadrant) {
  const double kTwoOverPi = 0.6366197723675814;
  const double kPio2_1 = 1.57079632673412561417e+00;  // pi/2 in three 33-bit pieces
  const double kPio2_2 = 6.07710050630396597660e-11;
  const double kPio2_3 = 2.02226624871116645580e-21;
  const double n = RoundToInteger(Mul(x, kTwoOverPi));
  *quadrant = static_cast<int>(static_cast<int64_t>(n) & 3);
  return Sub(Sub(Sub(x, Mul(n, kPio2_1)), Mul(n, kPio2_2)), Mul(n, kPio2_3));
}
}  // namespace detail

CRUCIBLE_HD inline double Sin(double x) {
  if (IsNan(x) || x == Infinity() || x == -Infinity()) return QuietNan();
  int q = 0;
  const double r = detail::ReduceHalfPi(x, &q);
  switch (q) {
    case 0:
      return detail::SinKernel(r);
    case 1:
      return detail::CosKernel(r);
    case 2:
      return -detail::SinKernel(r);
    default:
      return -detail::CosKernel(r);
  }
}

CRUCIBLE_HD inline double Cos(double x) {
  if (IsNan(x) || x == Infinity() || x == -Infinity()) return QuietNan();
  int q = 0;
  const double r = detail::ReduceHalfPi(x, &q);
  switch (q) {
    case 0:
      return detail::CosKernel(r);
    case 1:
      return -detail::SinKernel(r);
    case 2:
      return -detail::CosKernel(r);
    default:
      return detail::SinKernel(r);
  }
}

CRUCIBLE_HD inline double Pow(double x, double y) {
  if (y == 0.0 || x == 1.0) return 1.0;
  if (IsNan(x) || IsNan(y) || x < 0.0) return QuietNan();
  if (x == 0.0) return y > 0.0 ? 0.0 : Infinity();
  return Exp(Mul(y, Log(x)));
}

// ---- float precision: computed in double, rounded once ----
CRUCIBLE_HD inline float ExpF(float x) {
  return static_cast<float>(Exp(x));
}
CRUCIBLE_HD inline float LogF(float x) {
  return static_cast<float>(Log(x));
}
CRUCIBLE_HD inline float SinF(float x) {
  return static_cast<float>(Sin(x));
}
CRUCIBLE_HD inline float CosF(float x) {
  return static_cast<float>(Cos(x));
}
// 1/sqrt(x): two correctly rounded operations.
CRUCIBLE_HD inline float RsqrtF(float x) {
  return Div(1.0f, Sqrt(x));
}
// 1 / (1 + e^-x).
CRUCIBLE_HD inline float SigmoidF(float x) {
  return Div(1.0f, Add(1.0f, ExpF(-x)));
}

}  // namespace crucible::portable
