// The regex layer: the ASCII fast path for the GPT-2 and Llama 3 patterns must split exactly as
// PCRE2 does, and the Oniguruma translation must keep PCRE2 in step with `tokenizers`.
#include "tokenizer/regex.h"

#include <gtest/gtest.h>

#include <random>

#include "tokenizer/tokenizer.h"

namespace crucible {
namespace {

std::vector<std::pair<size_t, size_t>> Matches(const Regex& regex, std::string_view text) {
  RegexScratch scratch;
  std::vector<std::pair<size_t, size_t>> out;
  regex.ForEachMatch(text, scratch, [&](size_t s, size_t e) { out.emplace_back(s, e); });
  return out;
}

TEST(Regex, FastPathSplitsExactlyAsPcre2) {
  // ASCII of every class, contraction letters in both cases, and non-ASCII characters that sit
  // on the decisions: a letter, a digit, Unicode spaces (U+00A0, U+0085), 'ſ' (folds to s).
  const std::vector<std::string> pool = {"a",
                                         "Z",
                                         "s",
                                         "S",
                                         "t",
                                         "r",
                                         "e",
                                         "E",
                                         "v",
                                         "l",
                                         "L",
                                         "m",
                                         "d",
                                         "D",
                                         "0",
                                         "7",
                                         "'",
                                         " ",
                                         " ",
                                         "  ",
                                         "\t",
                                         "\n",
                                         "\r",
                                         "\r\n",
                                         "\v",
                                         "\f",
                                         "!",
                                         "-",
                                         "(",
                                         "\x1c",
                                         "\x7f",
                                         "_",
                                         "\xC3\xA9",
                                         "\xD9\xA3",
                                         "\xC2\xA0",
                                         "\xC2\x85",
                                         "\xC5\xBF",
                                         "\xE6\x9D\xB1",
                                         "\xF0\x9F\x8E\x89"};
  std::mt19937 rng(11);
  for (const char* pattern : {kGpt2Pattern, kLlama3Pattern}) {
    Regex fast(pattern, "fast"), slow(pattern, "slow", /*allow_fast=*/false);
    for (int trial = 0; trial < 10000; ++trial) {
      std::string text;
      for (int k = 0, n = 1 + rng() % 24; k < n; ++k) text += pool[rng() % pool.size()];
      ASSERT_EQ(Matches(fast, text), Matches(slow, text))
          << (pattern == kGpt2Pattern ? "gpt2" : "llama3") << " on '" << text << "'";
    }
  }
}

TEST(Regex, OnigurumaSpaceClassIsUnicodeWhiteSpace) {
  Regex space("\\s+", "test");
  // U+0085 is White_Space (PCRE2 alone says no); U+180E is not (PCRE2 alone says yes).
  EXPECT_EQ(Matches(space,
                    "a\xC2\x85"
                    "b"),
            (std::vector<std::pair<size_t, size_t>>{{1, 3}}));
  EXPECT_TRUE(Matches(space,
                      "a\xE1\xA0\x8E"
                      "b")
                  .empty());
  Regex letters("\\p{L}+", "test");
  // U+1C89 (Unicode 16) is a letter for the Oniguruma in tokenizers.
  EXPECT_EQ(Matches(letters, "\xE1\xB2\x89"), (std::vector<std::pair<size_t, size_t>>{{0, 3}}));
}

TEST(Regex, BadPatternIsADataErrorNamingTheFile) {
  try {
    Regex bad("(unclosed", "my/tokenizer.json");
    FAIL();
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("my/tokenizer.json"), std::string::npos);
  }
}

}  // namespace
}  // namespace crucible
