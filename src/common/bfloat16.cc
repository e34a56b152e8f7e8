#include "common/bfloat16.h"

#include <cstdint>
#include <cstring>

namespace crucible {

float RoundToBfloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7f800000u) == 0x7f800000u) return value;  // inf, nan
  bits += 0x7fffu + ((bits >> 16) & 1u);
  bits &= 0xffff0000u;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

}  // namespace crucible
