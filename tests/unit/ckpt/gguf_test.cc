// GGUF export's conversions and pre-tokenizer mapping (the whole file is checked against
// llama.cpp's gguf reader and llama.cpp itself in tests/integration/test_gguf.py).
#include "ckpt/gguf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/error.h"
#include "tokenizer/tokenizer.h"

namespace crucible {
namespace {

float Pow2(int e) {
  return std::ldexp(1.0f, e);
}

TEST(GgufTest, Fp16RoundsToNearestEven) {
  EXPECT_EQ(FloatToFp16Bits(1.0f), 0x3C00);
  EXPECT_EQ(FloatToFp16Bits(-2.0f), 0xC000);
  EXPECT_EQ(FloatToFp16Bits(-0.0f), 0x8000);
  EXPECT_EQ(FloatToFp16Bits(1.0f + Pow2(-11)), 0x3C00);              // a tie: to the even 1.0
  EXPECT_EQ(FloatToFp16Bits(1.0f + 3 * Pow2(-11)), 0x3C02);          // a tie: to the even 1 + 2^-9
  EXPECT_EQ(FloatToFp16Bits(1.0f + Pow2(-11) + Pow2(-20)), 0x3C01);  // above the tie: up
  EXPECT_EQ(FloatToFp16Bits(65504.0f), 0x7BFF);                      // the largest finite
  EXPECT_EQ(FloatToFp16Bits(65519.0f), 0x7BFF);
  EXPECT_EQ(FloatToFp16Bits(65520.0f), 0x7C00);  // rounds past the largest: infinity
  EXPECT_EQ(FloatToFp16Bits(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(FloatToFp16Bits(Pow2(-14)), 0x0400);      // the smallest normal
  EXPECT_EQ(FloatToFp16Bits(Pow2(-24)), 0x0001);      // the smallest subnormal
  EXPECT_EQ(FloatToFp16Bits(Pow2(-25)), 0x0000);      // a tie: to the even 0
  EXPECT_EQ(FloatToFp16Bits(3 * Pow2(-25)), 0x0002);  // a tie: to the even 2 x 2^-24
  EXPECT_EQ(FloatToFp16Bits(std::nanf("")) & 0x7E00, 0x7E00);
}

TEST(GgufTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16Bits(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBf16Bits(1.0f + Pow2(-8)), 0x3F80);      // a tie: to the even 1.0
  EXPECT_EQ(FloatToBf16Bits(1.0f + 3 * Pow2(-8)), 0x3F82);  // a tie: up to the even
  EXPECT_EQ(FloatToBf16Bits(-3.0f), 0xC040);
  const uint16_t nan = FloatToBf16Bits(std::nanf(""));
  EXPECT_EQ(nan & 0x7F80, 0x7F80);
  EXPECT_NE(nan & 0x007F, 0);  // stays a NaN
}

TEST(GgufTest, Q8_0BlocksHoldAnFp16ScaleAndRoundedInt8s) {
  std::vector<float> x(64, 0.0f);
  for (int i = 0; i < 32; ++i) x[i] = (i - 16) * 0.25f;  // max |x| = 4: d = 4 / 127
  std::vector<uint8_t> out(68);
  QuantizeQ8_0(x.data(), x.size(), out.data());
  uint16_t scale;
  std::memcpy(&scale, out.data(), 2);
  EXPECT_EQ(scale, FloatToFp16Bits(4.0f / 127.0f));
  for (int i = 0; i < 32; ++i)
    EXPECT_EQ(static_cast<int8_t>(out[2 + i]), std::lround(x[i] * 127.0f / 4.0f)) << i;
  std::memcpy(&scale, out.data() + 34, 2);
  EXPECT_EQ(scale, 0);  // an all-zero block: scale 0, values 0
  for (int i = 0; i < 32; ++i) EXPECT_EQ(out[36 + i], 0);
}

TEST(GgufTest, PreTokenizersMapToLlamaCppNames) {
  using json = nlohmann::json;
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  EXPECT_EQ(GgufPreTokenizer(byte_level.dump()), "gpt-2");
  json prefixed = byte_level;
  prefixed["add_prefix_space"] = true;
  EXPECT_EQ(GgufPreTokenizer(prefixed.dump()), "");
  auto sequence = [](const char* regex) {
    return json{{"type", "Sequence"},
                {"pretokenizers",
                 {{{"type", "Split"},
                   {"pattern", {{"Regex", regex}}},
                   {"behavior", "Isolated"},
                   {"invert", false}},
                  {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}
        .dump();
  };
  EXPECT_EQ(GgufPreTokenizer(sequence(kLlama3Pattern)), "llama-bpe");
  EXPECT_EQ(GgufPreTokenizer(sequence(kGpt2Pattern)), "gpt-2");
  EXPECT_EQ(GgufPreTokenizer(sequence("\\s+")), "");
  EXPECT_EQ(GgufPreTokenizer("null"), "");
}

TEST(GgufTest, FileTypesParseAndRefuseOthers) {
  for (const char* name : {"f32", "f16", "bf16", "q8_0"})
    EXPECT_EQ(GgufFileTypeName(ParseGgufFileType(name)), name);
  try {
    ParseGgufFileType("q4_0");
    FAIL() << "q4_0 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    EXPECT_NE(std::string(e.what()).find("expected f32, f16, bf16 or q8_0"), std::string::npos);
  }
}

}  // namespace
}  // namespace crucible
