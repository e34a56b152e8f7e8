#include "distributed/layout_free_norm.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "distributed/communicator.h"

namespace crucible {
namespace {

uint32_t Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

}  // namespace

__int128 TruncatedSquaresSum(const float* values, size_t n, double scale) {
  // trunc(v) = t 2^48 + floor(v - t 2^48) with t = floor(v 2^-48) < 2^49 (v < 2^97): v 2^-48 and
  // t 2^48 are exact (powers of two), and so is v - t 2^48 (v's bits below 2^48). Both parts are
  // integers below 2^52, read as int64 by adding 2^52 (their bits are then 2^52's plus the
  // integer), so that the loop vectorises; n <= 2^14 parts below 2^49 add below 2^63.
  constexpr double kMagic = 0x1p52;
  const int64_t magic = std::bit_cast<int64_t>(kMagic);
  int64_t high = 0, low = 0;
  for (size_t i = 0; i < n; ++i) {
    const double g = values[i];
    const double v = g * g * scale;
    const double t = std::floor(v * 0x1p-48);
    const double rest = std::floor(v - t * 0x1p48);
    high += std::bit_cast<int64_t>(t + kMagic) - magic;
    low += std::bit_cast<int64_t>(rest + kMagic) - magic;
  }
  return (static_cast<__int128>(high) << 48) + low;
}

double LayoutFreeSumOfSquares(const float* values, size_t base,
                              const std::vector<std::pair<size_t, size_t>>& ranges,
                              Communicator& group) {
  // The largest biased exponent (255: a NaN or an infinity) of this rank's elements.
  uint8_t exponent = 0;
  for (const auto& [begin, end] : ranges) {
    uint32_t largest = 0;
#pragma omp parallel for schedule(static) reduction(max : largest)
    for (int64_t i = static_cast<int64_t>(begin); i < static_cast<int64_t>(end); ++i)
      largest = std::max(largest, (Bits(values[i - base]) >> 23) & 0xffu);
    exponent = std::max<uint8_t>(exponent, static_cast<uint8_t>(largest));
  }
  group.AllReduceMaxBytes(&exponent, 1, "gradient-norm exponent max-reduce");
  if (exponent == 255) return std::nan("");
  // |g| < 2^(e - 126) with e the biased exponent (e = 0: subnormals, below 2^-126), so
  // g^2 < 2^(2e - 252); the grid is 2^(2e - 252 - 97).
  const int grid = 2 * static_cast<int>(std::max<uint8_t>(exponent, 1)) - 252 - 97;
  // 2^-grid is in [2^-159, 2^347]: g^2 (exact in double, at least 2^-298 when not 0) times it is
  // exact, the value of ldexp(g^2, -grid), and below 2^97.
  const double scale = std::ldexp(1.0, -grid);
  __int128 sum = 0;
  for (const auto& [begin, end] : ranges) {
    const int64_t b = static_cast<int64_t>(begin), e = static_cast<int64_t>(end);
    __int128 part = 0;
    // An integer sum: the threads' partials add to the same bits in any order.
#pragma omp parallel
    {
      __int128 mine = 0;
#pragma omp for schedule(static) nowait
      for (int64_t block = b; block < e; block += kSquaresBlock)
        mine += TruncatedSquaresSum(
            values + (block - base),
            static_cast<size_t>(std::min<int64_t>(kSquaresBlock, e - block)), scale);
#pragma omp critical
      part += mine;
    }
    sum += part;
  }
  group.AllReduceInt128(&sum, 1, "gradient-norm sum all-reduce");
  return std::ldexp(static_cast<double>(sum), grid);
}

}  // namespace crucible
