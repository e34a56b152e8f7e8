// libFuzzer target: BlendShares and BuildBlendIndex must turn any weights into either a blend
// index that keeps the quota method's promise (blend_check.h) or a crucible::Error, never a crash,
// a hang, an out-of-bounds access or another exception.
//
// Input: byte 0 picks the encoding, bytes 1-2 the sample count (at most 4095), then the weights.
// Odd byte 0: the weights' raw IEEE-754 bits, 8 bytes each. Even: a common binary exponent E (a
// byte choosing one of the scales where doubles end, a byte of fine offset in [-16, 15]), then 2
// bytes a weight, a (signed) and b: (1 + b / 256) * 2^(E + a|a| / 128), so most weights sit near
// 2^E and a few far from it; a = -128 is a NaN, 127 is -1, 126 zero, 125 infinity. With E near
// 1023 sums overflow, near -1074 weights are subnormal or zero, and the tails of a make shares
// that cannot be represented: each a mutation or two away, which raw bits rarely are.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "blend_check.h"
#include "common/error.h"

namespace {

std::vector<double> DecodeWeights(const uint8_t* data, size_t size, bool raw) {
  std::vector<double> weights;
  if (raw) {
    weights.resize(size / 8);
    for (size_t d = 0; d < weights.size(); ++d) std::memcpy(&weights[d], data + 8 * d, 8);
    return weights;
  }
  if (size < 2) return weights;
  static constexpr int kScales[8] = {0, 1023, 1010, 600, -600, -1022, -1050, -1074};
  const int scale = kScales[data[0] % 8] + data[1] / 8 - 16;
  for (size_t at = 2; at + 2 <= size; at += 2) {
    const int a = static_cast<int8_t>(data[at]);
    const double mantissa = 1.0 + data[at + 1] / 256.0;
    switch (a) {
      case -128:
        weights.push_back(std::nan(""));
        break;
      case 127:
        weights.push_back(-1.0);
        break;
      case 126:
        weights.push_back(0.0);
        break;
      case 125:
        weights.push_back(std::numeric_limits<double>::infinity());
        break;
      default:
        weights.push_back(std::ldexp(mantissa, scale + a * std::abs(a) / 128));
    }
  }
  return weights;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const bool raw = data[0] & 1;
  const int64_t n = (data[1] | data[2] << 8) & 4095;
  const std::vector<double> weights = DecodeWeights(data + 3, size - 3, raw);
  try {
    crucible::fuzz::CheckBlendIndex(weights, n);
  } catch (const crucible::Error&) {
  }
  return 0;
}
