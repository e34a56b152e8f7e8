#include "distributed/exact_sum.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/error.h"
#include "common/profile.h"

namespace crucible {

namespace {
constexpr double kScale = 18446744073709551616.0;  // 2^64
constexpr double kInverseScale = 1.0 / 18446744073709551616.0;
constexpr double kLimit = 4611686018427387904.0;       // 2^62
constexpr double kInt64Range = 9223372036854775808.0;  // 2^63

// Truncation of x (finite, |x| < 2^126) to an integer. Below 2^63 (every gradient under 0.5,
// nearly all of them) through int64, which vectorises; the value is the same either way.
inline __int128 ToInt128(double x) {
  if (std::fabs(x) < kInt64Range) return static_cast<__int128>(static_cast<int64_t>(x));
  return static_cast<__int128>(x);
}

// Round-to-nearest conversion of v to double; through int64 when it fits (the same value).
inline double ToDouble(__int128 v) {
  const int64_t low = static_cast<int64_t>(v);
  if (static_cast<__int128>(low) == v) return static_cast<double>(low);
  return static_cast<double>(v);
}
}  // namespace

void ExactAccumulator::Zero() {
  const int64_t n = static_cast<int64_t>(sum_.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) sum_[i] = 0;
}

ExactGrid ExactGrid::Parse(const std::string& name, const char* key) {
  for (ExactFormat format : {ExactFormat::kFixed128, ExactFormat::kBlock48, ExactFormat::kBlock32})
    if (name == ExactGrid{format}.name()) return ExactGrid{format};
  throw UsageError(std::string(key) + ": '" + name +
                   "' is not an exact reduction format (choose block48, block32 or fixed128)");
}

void RoundToBlockGrid(float* values, size_t count, const ExactGrid& grid, size_t piece) {
  const int bits = grid.mantissa_bits();
  if (bits < 0 || count == 0) return;
  // A float read and written per element.
  ScopedKernelTimer profile_timer("exact_block_rounding", 0, 8.0 * static_cast<double>(count));
  constexpr size_t kBlock = ExactGrid::kBlock;
  piece = std::min(piece == 0 ? count : piece, count);
  // Block b is block b % per_piece of piece b / per_piece.
  const size_t per_piece = (piece + kBlock - 1) / kBlock;
  const size_t full_pieces = count / piece, rest = count % piece;
  const int64_t blocks =
      static_cast<int64_t>(full_pieces * per_piece + (rest + kBlock - 1) / kBlock);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const size_t in_piece = static_cast<size_t>(b) % per_piece * kBlock;
    const size_t piece_begin = static_cast<size_t>(b) / per_piece * piece;
    float* v = values + piece_begin + in_piece;
    const size_t n = std::min({kBlock, piece - in_piece, count - piece_begin - in_piece});
    // The largest and the smallest nonzero magnitude, on the bits (an unsigned order for
    // non-negative floats, NaN and Inf above every finite value), so that the loop vectorises.
    // a - 1 wraps a zero to the top, out of the minimum: the smallest nonzero is the minimum + 1.
    uint32_t largest_bits = 0, below_smallest = 0xffffffffu;
    for (size_t i = 0; i < n; ++i) {
      uint32_t a;
      std::memcpy(&a, v + i, sizeof a);
      a &= 0x7fffffffu;
      largest_bits = std::max(largest_bits, a);
      below_smallest = std::min(below_smallest, a - 1u);
    }
    if (largest_bits >= 0x7f800000u || largest_bits == 0) continue;  // not finite, or all zero
    const uint32_t smallest_bits = below_smallest + 1u;
    int e = 0;
    // largest = m * 2^e with m in [0.5, 1): its leading bit is 2^(e-1)
    std::frexp(std::bit_cast<float>(largest_bits), &e);
    // In double, where v * 2^(bits - e + 1) is exact for every float and scale (|shift| < 200).
    const int shift = bits - (e - 1);
    // A float of magnitude 2^(23 - shift) or more (24 significant bits) is a multiple of
    // 2^-shift already, and a zero stays itself: a block without a smaller nonzero value is on
    // the grid as it is (nearly every block: the grid is 2^-bits of the largest value).
    if (static_cast<double>(std::bit_cast<float>(smallest_bits)) >= std::ldexp(1.0, 23 - shift))
      continue;
    const double up = std::ldexp(1.0, shift), down = std::ldexp(1.0, -shift);
    for (size_t i = 0; i < n; ++i)
      v[i] = static_cast<float>(std::nearbyint(static_cast<double>(v[i]) * up) * down);
  }
}

bool ExactAccumulator::AddRange(size_t begin, size_t end, float* values, size_t piece) {
  RoundToBlockGrid(values, end - begin, grid_, piece);
  if (in_place_) return RoundToFixedPointInPlace(values, end - begin);
  // A float read, a 128-bit sum read and written per element.
  ScopedKernelTimer profile_timer("exact_accumulate", 0, 36.0 * static_cast<double>(end - begin));
  const int64_t n = static_cast<int64_t>(end - begin);
  __int128* sum = sum_.data() + begin;
  bool ok = true;
#pragma omp parallel for schedule(static) reduction(&& : ok)
  for (int64_t i = 0; i < n; ++i) {
    double v = static_cast<double>(values[i]);
    if (!(std::fabs(v) < kLimit)) {  // also catches NaN
      ok = false;
      continue;
    }
    sum[i] += ToInt128(v * kScale);
  }
  return ok;
}

bool FloatToInt128(const float* in, __int128* out, size_t count) {
  ScopedKernelTimer profile_timer("exact_accumulate", 0, 20.0 * static_cast<double>(count));
  const int64_t n = static_cast<int64_t>(count);
  bool ok = true;
#pragma omp parallel for schedule(static) reduction(&& : ok)
  for (int64_t i = 0; i < n; ++i) {
    double v = static_cast<double>(in[i]);
    if (!(std::fabs(v) < kLimit)) {
      ok = false;
      out[i] = 0;
      continue;
    }
    out[i] = ToInt128(v * kScale);
  }
  return ok;
}

bool RoundToFixedPointInPlace(float* values, size_t count) {
  // A float read and written per element.
  ScopedKernelTimer profile_timer("exact_accumulate", 0, 8.0 * static_cast<double>(count));
  const int64_t n = static_cast<int64_t>(count);
  int refused = 0;
  // In float, 8 lanes a vector: a float v with |v| >= 2^-41 is a multiple of its ULP, at least
  // 2^-64, so it is on the grid already; below, v 2^64 (exact: a power of two, a subnormal v
  // included) is under 2^23, its truncation exact, and that integer times 2^-64 a normal float.
  // So the result is trunc(v 2^64) 2^-64 as the 128-bit sum gives it back (ToDouble), bit for bit;
  // + 0 turns a -0 into the integer zero's +0. Branch-free, so that it vectorises (with
  // -fno-trapping-math: CMakeLists.txt); the products of values that are not used may overflow.
#pragma omp parallel for schedule(static) reduction(| : refused)
  for (int64_t i = 0; i < n; ++i) {
    const float value = values[i];
    const float magnitude = std::fabs(value);
    const bool fits = magnitude < 0x1p62f;  // false for NaN
    const float truncated = (std::trunc(value * 0x1p64f) + 0.0f) * 0x1p-64f;
    values[i] = fits && magnitude < 0x1p-41f ? truncated : value;
    refused |= fits ? 0 : 1;
  }
  return refused == 0;
}

void AddInt128(const __int128* in, __int128* sum, size_t count) {
  const int64_t n = static_cast<int64_t>(count);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) sum[i] += in[i];
}

void Int128ToFloat(const __int128* in, float* out, size_t count) {
  const int64_t n = static_cast<int64_t>(count);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(ToDouble(in[i]) * kInverseScale);
}

bool DoubleToFixed(double v, __int128* out) {
  *out = std::fabs(v) < kLimit ? ToInt128(v * kScale) : 0;
  return std::fabs(v) < kLimit;
}

double FixedToDouble(__int128 sum) {
  return ToDouble(sum) * kInverseScale;
}

}  // namespace crucible
