// The compact exact formats (distributed/exact_sum.h ExactGrid, distributed/exact_group_sum.h):
// the block grid's resolution, that rounding on it keeps the sum independent of order, rank count
// and micro-batch split, and that the narrow wire is lossless, with headroom for the rank count.
// The group of several ranks is simulated here by summing the packed integers of several
// "ranks" as MPI's reduction would; tests/integration/test_distributed.py runs it under mpirun.
// And the gradient norm of a tensor-parallel run (distributed/layout_free_norm.h) on one rank.
#include "distributed/exact_group_sum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/error.h"
#include "distributed/communicator.h"
#include "distributed/exact_sum.h"
#include "distributed/layout_free_norm.h"

namespace crucible {
namespace {

const ExactGrid kBlock48{ExactFormat::kBlock48}, kBlock32{ExactFormat::kBlock32};

std::vector<float> RandomGradient(size_t n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(n);
  for (float& v : values) v = normal(rng);
  return values;
}

// The group's exact sums of `contributions`, split into `ranks` consecutive groups of
// contributions: each rank accumulates its own (in its order), then the ranks' 128-bit sums are
// packed on the narrow wire (if they fit), added as `width`-byte integers and unpacked.
std::vector<__int128> GroupSum(const std::vector<std::vector<float>>& contributions, int ranks,
                               const ExactGrid& grid, bool reverse_order, bool* narrow) {
  const size_t n = contributions[0].size(), per_rank = contributions.size() / ranks;
  std::vector<std::vector<__int128>> local(ranks);
  for (int r = 0; r < ranks; ++r) {
    ExactAccumulator accumulator(n, grid);
    accumulator.Zero();
    for (size_t k = 0; k < per_rank; ++k) {
      const size_t index = r * per_rank + (reverse_order ? per_rank - 1 - k : k);
      std::vector<float> values = contributions[index];
      EXPECT_TRUE(accumulator.AddRange(0, n, values.data()));
    }
    local[r].assign(accumulator.data(), accumulator.data() + n);
  }
  const size_t blocks = (n + ExactGrid::kBlock - 1) / ExactGrid::kBlock;
  std::vector<uint8_t> agreed(2 * blocks, 0), mine(2 * blocks);
  for (int r = 0; r < ranks; ++r) {
    exact_wire::Describe(local[r].data(), n, mine.data());
    for (size_t i = 0; i < agreed.size(); ++i) agreed[i] = std::max(agreed[i], mine[i]);
  }
  std::vector<__int128> total(n, 0);
  *narrow =
      grid.wire_bits() < 128 && exact_wire::Fits(agreed.data(), blocks, ranks, grid.wire_bits());
  if (!*narrow) {
    for (int r = 0; r < ranks; ++r) AddInt128(local[r].data(), total.data(), n);
    return total;
  }
  const int width = grid.wire_bits() / 8;
  std::vector<int64_t> sum(n, 0);
  std::vector<unsigned char> packed(n * width);
  for (int r = 0; r < ranks; ++r) {
    exact_wire::Pack(local[r].data(), n, 0, agreed.data(), width, packed.data());
    for (size_t i = 0; i < n; ++i) {
      int64_t value = 0;
      std::memcpy(&value, packed.data() + i * width, width);
      value = (value << (64 - 8 * width)) >> (64 - 8 * width);
      sum[i] += value;
    }
  }
  // The wire carries the sum modulo 2^(8 width); it must fit, or the unpacking below is wrong.
  for (size_t i = 0; i < n; ++i) {
    const int64_t limit = int64_t{1} << (8 * width - 1);
    EXPECT_TRUE(sum[i] < limit && sum[i] >= -limit) << "overflow at " << i;
    std::memcpy(packed.data() + i * width, &sum[i], width);
  }
  exact_wire::Unpack(packed.data(), n, 0, agreed.data(), width, total.data());
  return total;
}

TEST(ExactGrid, NamesParseAndAnUnknownOneIsAUsageErrorNamingTheKey) {
  EXPECT_EQ(ExactGrid::Parse("block48", "parallelism.exact_reduction").format,
            ExactFormat::kBlock48);
  EXPECT_EQ(ExactGrid::Parse("block32", "k").format, ExactFormat::kBlock32);
  EXPECT_EQ(ExactGrid::Parse("fixed128", "k").format, ExactFormat::kFixed128);
  try {
    ExactGrid::Parse("fp16", "parallelism.exact_reduction");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    EXPECT_NE(std::string(e.what()).find("parallelism.exact_reduction: 'fp16'"), std::string::npos)
        << e.what();
  }
}

TEST(BlockGrid, ValuesRoundToMultiplesOf2ToTheBlockExponentMinusTheMantissaBits) {
  std::vector<float> values(ExactGrid::kBlock, 0.0f);
  values[0] = 1.5f;                            // e = 0: grid 2^-23 (block48), 2^-16 (block32)
  values[1] = std::ldexp(1.0f, -20) * 1.375f;  // 1.375 * 2^-20: on 2^-23, not on 2^-16
  values[2] = std::ldexp(1.0f, -30);           // below both grids' half step: rounds to 0
  values[3] = -std::ldexp(3.0f, -18);          // -0.75 * 2^-16: to -2^-16 (nearest)
  std::vector<float> b48 = values, b32 = values;
  RoundToBlockGrid(b48.data(), b48.size(), kBlock48);
  RoundToBlockGrid(b32.data(), b32.size(), kBlock32);
  EXPECT_EQ(b48[0], 1.5f);
  EXPECT_EQ(b48[1], values[1]);
  EXPECT_EQ(b48[2], 0.0f);
  EXPECT_EQ(b48[3], values[3]);
  EXPECT_EQ(b32[0], 1.5f);
  EXPECT_EQ(b32[1], 0.0f);  // 1.375 * 2^-20 = 0.086 * 2^-16: to 0
  EXPECT_EQ(b32[2], 0.0f);
  EXPECT_EQ(b32[3], -std::ldexp(1.0f, -16));
  // A block's largest value keeps 1 + 23 bits under block48: every float of the top exponent.
  std::vector<float> top(ExactGrid::kBlock, std::nextafter(2.0f, 0.0f));
  RoundToBlockGrid(top.data(), top.size(), kBlock48);
  EXPECT_EQ(top[0], std::nextafter(2.0f, 0.0f));
}

TEST(BlockGrid, EveryValueIsRoundedAsTheFormulaSaysWhateverTheBlockSkips) {
  // Blocks whose values span 0 to 60 binary orders below their largest (zeros, subnormals and
  // both signs among them): each value must be nearbyint(v 2^shift) 2^-shift of its block's
  // shift, the rounding written out here for every element, also where the kernel finds a block
  // already on the grid and skips it.
  constexpr size_t kBlock = ExactGrid::kBlock;
  uint32_t state = 99;
  auto next = [&] { return state = state * 1664525u + 1013904223u; };
  std::vector<float> values(64 * kBlock);
  for (size_t b = 0; b < 64; ++b) {
    const int top = static_cast<int>(next() % 200) - 140, span = static_cast<int>(b % 61);
    for (size_t i = 0; i < kBlock; ++i) {
      const float mantissa = 1.0f + static_cast<float>(next() >> 9) * 0x1p-23f;
      const int exponent = top - static_cast<int>(next() % (span + 1));
      float v = (next() & 1 ? -1.0f : 1.0f) * std::ldexp(mantissa, exponent);
      if (next() % 50 == 0) v = 0.0f;
      values[b * kBlock + i] = v;
    }
  }
  for (const ExactGrid& grid : {kBlock48, kBlock32}) {
    std::vector<float> rounded = values;
    RoundToBlockGrid(rounded.data(), rounded.size(), grid);
    for (size_t b = 0; b < 64; ++b) {
      float largest = 0.0f;
      for (size_t i = 0; i < kBlock; ++i)
        largest = std::max(largest, std::fabs(values[b * kBlock + i]));
      int e = 0;
      std::frexp(largest, &e);
      const int shift = grid.mantissa_bits() - (e - 1);
      for (size_t i = 0; i < kBlock; ++i) {
        const float v = values[b * kBlock + i];
        const float expected =
            largest == 0.0f ? v
                            : static_cast<float>(
                                  std::nearbyint(static_cast<double>(v) * std::ldexp(1.0, shift)) *
                                  std::ldexp(1.0, -shift));
        ASSERT_EQ(std::bit_cast<uint32_t>(rounded[b * kBlock + i]),
                  std::bit_cast<uint32_t>(expected))
            << grid.name() << " block " << b << " value " << v;
      }
    }
  }
}

TEST(BlockGrid, EachBlockHasItsOwnExponentAndFixed128RoundsNothing) {
  // 2^-10 (1 + 2^-20): below block32's 2^-26 steps in its own block, so rounded to 2^-10
  std::vector<float> values(2 * ExactGrid::kBlock, std::ldexp(1.0f + std::ldexp(1.0f, -20), -10));
  values[0] = 1000.0f;  // block 0's exponent is 9: its grid is 2^-7, and 2^-10 rounds to 0
  std::vector<float> rounded = values;
  RoundToBlockGrid(rounded.data(), rounded.size(), kBlock32);
  EXPECT_EQ(rounded[1], 0.0f);
  EXPECT_EQ(rounded[ExactGrid::kBlock], std::ldexp(1.0f, -10));  // block 1: its own exponent -10
  std::vector<float> same = values;
  RoundToBlockGrid(same.data(), same.size(), ExactGrid{});
  EXPECT_EQ(same, values);
}

TEST(BlockGrid, BlocksStartAgainAtEveryPieceAsIfEachPieceWereRoundedAlone) {
  // Pieces of 300 values: blocks [0, 256) [256, 300) | [300, 556) [556, 600) | [600, 700).
  const size_t piece = 300, count = 700;
  std::vector<float> values(count);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> uniform(-0.5f, 0.5f);
  for (size_t i = 0; i < count; ++i)
    values[i] = std::ldexp(uniform(rng), static_cast<int>(i % 23) - 11);
  for (const ExactGrid& grid : {kBlock48, kBlock32}) {
    std::vector<float> together = values, alone = values;
    RoundToBlockGrid(together.data(), count, grid, piece);
    for (size_t first = 0; first < count; first += piece)
      RoundToBlockGrid(alone.data() + first, std::min(piece, count - first), grid);
    EXPECT_EQ(together, alone);
    // And not the blocks of one run from the start: [256, 300) shares a block with [300, 512)
    // there.
    std::vector<float> one_run = values;
    RoundToBlockGrid(one_run.data(), count, grid);
    EXPECT_NE(together, one_run);
    // Piece 0 is one run of all the values.
    std::vector<float> zero = values;
    RoundToBlockGrid(zero.data(), count, grid, 0);
    EXPECT_EQ(zero, one_run);
  }
}

TEST(BlockGrid, ABlockWithANonFiniteValueIsLeftForTheConversionToRefuse) {
  std::vector<float> values(ExactGrid::kBlock, std::ldexp(1.0f, -30));
  values[5] = std::numeric_limits<float>::infinity();
  values[0] = 1.0f;
  std::vector<float> rounded = values;
  RoundToBlockGrid(rounded.data(), rounded.size(), kBlock32);
  EXPECT_EQ(rounded[1], values[1]);
  ExactAccumulator accumulator(values.size(), kBlock32);
  accumulator.Zero();
  EXPECT_FALSE(accumulator.AddRange(0, values.size(), rounded.data()));
  float nan = std::nanf("");
  EXPECT_FALSE(ExactAccumulator::InPlace(kBlock48).AddRange(0, 1, &nan));
}

TEST(ExactGroupSum, TheSumIsTheSameForEveryOrderRankCountAndMicroBatchSplit) {
  constexpr size_t kValues = 5 * ExactGrid::kBlock + 37;
  std::vector<std::vector<float>> contributions;
  for (int k = 0; k < 8; ++k)  // 8 micro-batches of one step, gradients of varied scales
    contributions.push_back(RandomGradient(kValues, 100 + k, k % 3 == 0 ? 1e-3f : 0.02f));
  for (const ExactGrid& grid : {kBlock48, kBlock32, ExactGrid{}}) {
    bool narrow = false;
    const std::vector<__int128> one = GroupSum(contributions, 1, grid, false, &narrow);
    for (int ranks : {1, 2, 4, 8})
      for (bool reverse : {false, true}) {
        const std::vector<__int128> sum = GroupSum(contributions, ranks, grid, reverse, &narrow);
        EXPECT_TRUE(sum == one) << grid.name() << " on " << ranks << " ranks";
        if (grid.wire_bits() < 128) {
          EXPECT_TRUE(narrow) << grid.name() << " " << ranks;
        }
      }
  }
}

TEST(ExactGroupSum, TheNarrowWireLeavesHeadroomForTheRankCount) {
  // One block whose sums span 46 bits on one rank: 48-bit integers carry 2 ranks (47 bits and a
  // sign), not 4.
  std::vector<__int128> sums(ExactGrid::kBlock, 0);
  sums[0] = (__int128{1} << 46) - 1;
  sums[1] = 1;
  std::vector<uint8_t> agreed(2);
  exact_wire::Describe(sums.data(), sums.size(), agreed.data());
  EXPECT_EQ(agreed[0], 127);  // lowest set bit 0
  EXPECT_EQ(agreed[1], 46);
  EXPECT_TRUE(exact_wire::Fits(agreed.data(), 1, 2, 48));
  EXPECT_FALSE(exact_wire::Fits(agreed.data(), 1, 3, 48));
  // A block of zeros fits anything.
  std::vector<__int128> zeros(ExactGrid::kBlock, 0);
  exact_wire::Describe(zeros.data(), zeros.size(), agreed.data());
  EXPECT_TRUE(agreed[0] == 0 && agreed[1] == 0);
  EXPECT_TRUE(exact_wire::Fits(agreed.data(), 1, 4096, 32));
}

TEST(ExactGroupSum, PackingIsLosslessForNegativeSumsAndLargeShifts) {
  std::vector<__int128> sums(ExactGrid::kBlock + 3, 0);
  sums[0] = -(__int128{5} << 70);
  sums[1] = __int128{3} << 72;
  sums[ExactGrid::kBlock] = -1;
  sums[ExactGrid::kBlock + 2] = 12345;
  std::vector<uint8_t> agreed(4);
  exact_wire::Describe(sums.data(), sums.size(), agreed.data());
  EXPECT_EQ(127 - agreed[0], 70);
  for (int width : {4, 6}) {
    std::vector<unsigned char> packed(sums.size() * width);
    exact_wire::Pack(sums.data(), sums.size(), 0, agreed.data(), width, packed.data());
    std::vector<__int128> back(sums.size(), 7);
    exact_wire::Unpack(packed.data(), sums.size(), 0, agreed.data(), width, back.data());
    EXPECT_TRUE(back == sums) << width;
    // An unpacking that starts inside the second block uses that block's shift.
    std::vector<__int128> tail(2, 7);
    exact_wire::Unpack(packed.data() + (ExactGrid::kBlock + 1) * width, 2, ExactGrid::kBlock + 1,
                       agreed.data(), width, tail.data());
    EXPECT_TRUE(tail[0] == 0 && tail[1] == 12345);
  }
}

// The wire's block arithmetic by its definition, one __int128 at a time: what the vectorised
// Describe, Pack and Unpack (on 64-bit words) must give bit for bit.
namespace reference {
int Shift(const std::vector<uint8_t>& agreed, size_t block) {
  return agreed[2 * block + 1] == 0 ? 0 : 127 - agreed[2 * block];
}
std::vector<uint8_t> Describe(const std::vector<__int128>& sums) {
  std::vector<uint8_t> out(2 * ((sums.size() + ExactGrid::kBlock - 1) / ExactGrid::kBlock), 0);
  for (size_t b = 0; 2 * b < out.size(); ++b) {
    int lowest = 127, length = 0;
    for (size_t i = b * ExactGrid::kBlock; i < std::min(sums.size(), (b + 1) * ExactGrid::kBlock);
         ++i) {
      if (sums[i] == 0) continue;
      using U128 = unsigned __int128;
      U128 magnitude = sums[i] < 0 ? -static_cast<U128>(sums[i]) : static_cast<U128>(sums[i]);
      int low = 0, bits = 0;
      while (((magnitude >> low) & 1) == 0) ++low;
      while (bits < 128 && (magnitude >> bits) != 0) ++bits;
      lowest = std::min(lowest, low);
      length = std::max(length, bits);
    }
    out[2 * b] = static_cast<uint8_t>(length == 0 ? 0 : 127 - lowest);
    out[2 * b + 1] = static_cast<uint8_t>(length);
  }
  return out;
}
}  // namespace reference

TEST(ExactGroupSum, TheVectorisedWireMatchesItsDefinitionBitForBit) {
  // Random blocks of every kind the wire sees: zeros, negative sums, shifts below, at and above
  // 64 (the two words of a sum), the most negative 128-bit integer, short last blocks, and
  // unpacking that starts inside a block; Pack is checked with any shift (its output is the low
  // bytes of sum >> shift whether or not it fits).
  std::mt19937_64 rng(35);
  for (int trial = 0; trial < 600; ++trial) {
    const size_t n = 1 + rng() % (3 * ExactGrid::kBlock + 7);
    const int mode = trial % 5;
    std::vector<__int128> sums(n, 0);
    for (size_t i = 0; i < n; ++i) {
      if (rng() % 7 == 0) continue;
      if (mode == 0) {
        sums[i] = static_cast<__int128>((static_cast<unsigned __int128>(rng()) << 64) | rng());
        continue;
      }
      const int bits = 1 + static_cast<int>(rng() % 47);
      const int shift = mode == 1   ? static_cast<int>(rng() % 3)
                        : mode == 2 ? 60 + static_cast<int>(rng() % 8)
                        : mode == 3 ? 64 + static_cast<int>(rng() % (64 - bits))
                                    : static_cast<int>(rng() % (128 - bits));
      int64_t value = static_cast<int64_t>(rng() >> (64 - bits));
      if (rng() & 1) value = -value;
      sums[i] = static_cast<__int128>(static_cast<unsigned __int128>(static_cast<__int128>(value))
                                      << shift);
    }
    if (mode == 4) sums[0] = std::numeric_limits<__int128>::min();
    const std::vector<uint8_t> described = reference::Describe(sums);
    std::vector<uint8_t> agreed(described.size());
    exact_wire::Describe(sums.data(), n, agreed.data());
    ASSERT_EQ(agreed, described) << "trial " << trial;
    if (mode == 0)  // any shift, any blocks of zeros
      for (size_t b = 0; 2 * b < agreed.size(); ++b) {
        agreed[2 * b] = static_cast<uint8_t>(rng() % 128);
        agreed[2 * b + 1] = rng() % 4 == 0 ? 0 : static_cast<uint8_t>(1 + rng() % 128);
      }
    for (int width : {4, 6, 8}) {
      std::vector<unsigned char> packed(n * width + 8, 0xab), expected(n * width + 8, 0xab);
      for (size_t i = 0; i < n; ++i) {
        const int64_t value =
            static_cast<int64_t>(sums[i] >> reference::Shift(agreed, i / ExactGrid::kBlock));
        std::memcpy(expected.data() + i * width, &value, width);
      }
      exact_wire::Pack(sums.data(), n, 0, agreed.data(), width, packed.data());
      ASSERT_EQ(packed, expected) << "trial " << trial << " width " << width;
      const size_t first = rng() % n, count = rng() % (n - first + 1);
      std::vector<__int128> back(count + 1, 7), want(count + 1, 7);
      for (size_t i = 0; i < count; ++i) {
        int64_t value = 0;
        std::memcpy(&value, packed.data() + (first + i) * width, width);
        value = static_cast<int64_t>(static_cast<uint64_t>(value) << (64 - 8 * width)) >>
                (64 - 8 * width);
        want[i] =
            static_cast<__int128>(static_cast<unsigned __int128>(static_cast<__int128>(value))
                                  << reference::Shift(agreed, (first + i) / ExactGrid::kBlock));
      }
      exact_wire::Unpack(packed.data() + first * width, count, first, agreed.data(), width,
                         back.data());
      ASSERT_TRUE(back == want) << "trial " << trial << " width " << width;
    }
  }
}

TEST(ExactGroupSum, OnOneRankTheFloatSumIsTheGridRoundedValue) {
  auto group = Communicator::OneRank();
  std::vector<float> values = RandomGradient(3 * ExactGrid::kBlock, 7, 0.1f);
  for (const ExactGrid& grid : {kBlock48, kBlock32, ExactGrid{}}) {
    ExactGroupSum sum(*group, grid);
    std::vector<float> out(values.size()), expected = values;
    EXPECT_TRUE(sum.AllReduceFloat(values.data(), out.data(), values.size(), "test"));
    RoundToBlockGrid(expected.data(), expected.size(), grid);
    RoundToFixedPointInPlace(expected.data(), expected.size());
    EXPECT_EQ(out, expected) << grid.name();
  }
  ExactGroupSum sum(*group, kBlock48);
  float bad[2] = {1.0f, std::nanf("")}, out[2];
  EXPECT_FALSE(sum.AllReduceFloat(bad, out, 2, "test"));
}

// Resolution against fp32: a block's values keep their bits down to 2^-23 (block48) or 2^-16
// (block32) of the block's leading power of two, so the error of a rounded contribution is at
// most half that step.
TEST(BlockGrid, TheRoundingErrorIsAtMostHalfAStepOfTheBlockGrid) {
  std::vector<float> values = RandomGradient(64 * ExactGrid::kBlock, 11, 0.05f);
  for (const ExactGrid& grid : {kBlock48, kBlock32}) {
    std::vector<float> rounded = values;
    RoundToBlockGrid(rounded.data(), rounded.size(), grid);
    for (size_t b = 0; b < 64; ++b) {
      float largest = 0;
      for (size_t i = 0; i < ExactGrid::kBlock; ++i)
        largest = std::max(largest, std::fabs(values[b * ExactGrid::kBlock + i]));
      const double step = std::ldexp(1.0, std::ilogb(largest) - grid.mantissa_bits());
      for (size_t i = 0; i < ExactGrid::kBlock; ++i) {
        const size_t k = b * ExactGrid::kBlock + i;
        ASSERT_LE(std::fabs(double(rounded[k]) - double(values[k])), step / 2) << grid.name();
        ASSERT_EQ(std::fmod(double(rounded[k]), step), 0.0) << grid.name();
      }
    }
  }
}

// The sum of the squares of `values` times `scale` (a power of two), each truncated: the
// formula of layout_free_norm.h, with the compiler's conversion to 128 bits.
__int128 TruncatedSquares(const std::vector<float>& values, double scale) {
  __int128 sum = 0;
  for (float g : values) sum += static_cast<__int128>(double(g) * double(g) * scale);
  return sum;
}

// The vectorised block sum is the sum of the truncated squares, for squares on both sides of the
// 2^48 split and up to the 2^97 bound, and for a whole block of the largest.
TEST(LayoutFreeNorm, TheBlockSumIsTheSumOfTheTruncatedSquares) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> uniform(0.5f, 1.0f);
  std::vector<float> values(kSquaresBlock);
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = std::ldexp(uniform(rng), -static_cast<int>(i % 70));
  values[0] = std::nextafter(1.0f, 0.0f);
  const double scale = 0x1p97;  // the largest square (just below 1) to just below 2^97
  EXPECT_TRUE(TruncatedSquaresSum(values.data(), values.size(), scale) ==
              TruncatedSquares(values, scale));
  const std::vector<float> largest(kSquaresBlock, std::nextafter(1.0f, 0.0f));
  EXPECT_TRUE(TruncatedSquaresSum(largest.data(), largest.size(), scale) ==
              TruncatedSquares(largest, scale));
}

// On one rank the sum is the integer sum of the squares on the grid of the largest exponent,
// truncated, whichever ranges cut the elements (several blocks of kSquaresBlock).
TEST(LayoutFreeNorm, TheSumIsTheTruncatedSquaresOnTheGridForAnyCutOfTheRanges) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(3 * kSquaresBlock + 1000);
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = std::ldexp(uniform(rng), static_cast<int>(i % 61) - 50);
  values[777] = 3.0f;  // the largest: biased exponent 128, grid 2^(256 - 349)
  auto group = Communicator::OneRank();
  const int grid = 2 * 128 - 349;
  const double want =
      std::ldexp(static_cast<double>(TruncatedSquares(values, std::ldexp(1.0, -grid))), grid);
  const double whole = LayoutFreeSumOfSquares(values.data(), 0, {{0, values.size()}}, *group);
  const double cut = LayoutFreeSumOfSquares(values.data(), 0,
                                            {{0, 1}, {1, 20001}, {20001, values.size()}}, *group);
  EXPECT_EQ(whole, want);
  EXPECT_EQ(cut, want);
  values[5] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isnan(LayoutFreeSumOfSquares(values.data(), 0, {{0, 10}}, *group)));
}

}  // namespace
}  // namespace crucible

namespace crucible {
namespace {

// The narrow wire's MPI sum (AddInt48, vectorised two integers a step) against the 64-bit sum of
// each pair of 6-byte integers, for every count from 0 to 40 (the vector loop's tail and its
// bound) and random values of every sign, the bytes past the buffers untouched.
TEST(ExactWire, AddInt48IsTheSumOfEachPairModulo2To48) {
  std::mt19937_64 rng(48);
  for (size_t count = 0; count <= 40; ++count) {
    std::vector<unsigned char> in(6 * count + 8), inout(6 * count + 8), want;
    for (auto& byte : in) byte = static_cast<unsigned char>(rng());
    for (auto& byte : inout) byte = static_cast<unsigned char>(rng());
    want = inout;
    for (size_t i = 0; i < count; ++i) {
      uint64_t x = 0, y = 0;
      std::memcpy(&x, in.data() + 6 * i, 6);
      std::memcpy(&y, want.data() + 6 * i, 6);
      const uint64_t sum = (x + y) & ((uint64_t{1} << 48) - 1);
      std::memcpy(want.data() + 6 * i, &sum, 6);
    }
    AddInt48(in.data(), inout.data(), count);
    EXPECT_EQ(inout, want) << "count " << count;
  }
}

}  // namespace
}  // namespace crucible
