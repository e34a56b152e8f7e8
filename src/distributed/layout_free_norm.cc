#include "distributed/layout_free_norm.h"

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
  __int128 sum = 0;
  for (const auto& [begin, end] : ranges) {
    const int64_t b = static_cast<int64_t>(begin), e = static_cast<int64_t>(end);
    __int128 part = 0;
    // An integer sum: the threads' partials add to the same bits in any order.
#pragma omp parallel
    {
      __int128 mine = 0;
#pragma omp for schedule(static) nowait
      for (int64_t i = b; i < e; ++i) {
        const double g = values[i - base];
        mine += static_cast<__int128>(std::ldexp(g * g, -grid));
      }
#pragma omp critical
      part += mine;
    }
    sum += part;
  }
  group.AllReduceInt128(&sum, 1, "gradient-norm sum all-reduce");
  return std::ldexp(static_cast<double>(sum), grid);
}

}  // namespace crucible
