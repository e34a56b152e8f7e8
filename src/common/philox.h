// Philox-4x32-10, a counter-based RNG (Salmon et al., SC'11): the random numbers for a given
// (seed, counter) are a pure function of both, so any sample, rank or resume point can draw its
// own stream without replaying the ones before it.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

#include "common/host_math.h"

namespace crucible {

using PhiloxBlock = std::array<uint32_t, 4>;

inline PhiloxBlock Philox4x32(PhiloxBlock counter, std::array<uint32_t, 2> key) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kMul0) * counter[0];
    uint64_t p1 = static_cast<uint64_t>(kMul1) * counter[2];
    counter = {static_cast<uint32_t>(p1 >> 32) ^ counter[1] ^ key[0], static_cast<uint32_t>(p1),
               static_cast<uint32_t>(p0 >> 32) ^ counter[3] ^ key[1], static_cast<uint32_t>(p0)};
    key[0] += kWeyl0;
    key[1] += kWeyl1;
  }
  return counter;
}

// A stream of random numbers identified by (seed, stream, offset); stream separates uses
// (e.g. one per parameter tensor or per dataset), offset is the position in the stream.
class Philox {
 public:
  Philox(uint64_t seed, uint64_t stream, uint64_t offset = 0)
      : key_{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)},
        stream_(stream),
        block_index_(offset / 4),
        lane_(offset % 4) {
    Refill();
  }

  uint32_t NextU32() {
    if (lane_ == 4) {
      ++block_index_;
      lane_ = 0;
      Refill();
    }
    return block_[lane_++];
  }
  uint64_t NextU64() {
    uint64_t high = NextU32();
    return (high << 32) | NextU32();
  }
  // Uniform in [0, 1) with 24 bits.
  float NextUniform() { return static_cast<float>(NextU32() >> 8) * (1.0f / 16777216.0f); }
  // Uniform integer in [0, bound) without modulo bias (Lemire's method with rejection).
  uint64_t NextBelow(uint64_t bound) {
    if (bound <= 1) return 0;
    uint64_t threshold = (0 - bound) % bound;
    while (true) {
      uint64_t r = NextU64();
      unsigned __int128 m = static_cast<unsigned __int128>(r) * bound;
      if (static_cast<uint64_t>(m) >= threshold) return static_cast<uint64_t>(m >> 64);
    }
  }
  // Standard normal by Box-Muller in double precision (one value per call, deterministic; log
  // and cos from common/host_math.h).
  double NextNormal() {
    double u1 = (static_cast<double>(NextU64() >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double u2 = static_cast<double>(NextU64() >> 11) * (1.0 / 9007199254740992.0);
    return std::sqrt(-2.0 * HostLog(u1)) * HostCos(6.283185307179586 * u2);
  }

 private:
  void Refill() {
    block_ =
        Philox4x32({static_cast<uint32_t>(block_index_), static_cast<uint32_t>(block_index_ >> 32),
                    static_cast<uint32_t>(stream_), static_cast<uint32_t>(stream_ >> 32)},
                   key_);
  }
  std::array<uint32_t, 2> key_;
  uint64_t stream_;
  uint64_t block_index_;
  int lane_;
  PhiloxBlock block_{};
};

}  // namespace crucible
