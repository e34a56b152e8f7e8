// The regex layer: the ASCII fast path for the GPT-2 and Llama 3 patterns must split exactly as
// PCRE2 does, and the Oniguruma translation must keep PCRE2 in step with `tokenizers`.
#include "tokenizer/regex.h"

#include <gtest/gtest.h>

#include <random>

#include "common/error.h"
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

// The text of each match.
std::vector<std::string> Found(const std::string& pattern, std::string_view text) {
  Regex regex(pattern, "test.json");
  std::vector<std::string> out;
  for (auto [start, end] : Matches(regex, text)) out.emplace_back(text.substr(start, end - start));
  return out;
}

bool FullMatch(const std::string& pattern, const std::string& text) {
  return Found(pattern, text) == std::vector<std::string>{text};
}

TEST(Regex, EveryClassHoldsTheCodePointsOfOnigurumasUnicode) {
  // U+1FA76 (grey heart, Unicode 15) is a symbol for Oniguruma; Debian's PCRE2 says unassigned.
  const std::string heart = "\xF0\x9F\xA9\xB6";
  for (const char* pattern : {"\\p{So}", "\\p{S}", "[\\p{S}]", "[\\p{P}\\p{S}]", "\\P{Cn}",
                              "\\p{^Cn}", "[^\\p{Cn}]", "[\\P{C}]", "[^\\p{L}\\p{N}]"})
    EXPECT_TRUE(FullMatch(pattern, heart)) << pattern;
  for (const char* pattern :
       {"\\p{Cn}", "\\p{C}", "\\P{S}", "[^\\p{S}]", "[\\p{Cn}]", "[^\\P{Cn}]", "[\\p{L}\\p{N}]"})
    EXPECT_TRUE(Found(pattern, heart).empty()) << pattern;
  // U+1171E was a nonspacing mark (Mn) and is a spacing one (Mc) since Unicode 16.
  const std::string ahom = "\xF0\x91\x9C\x9E";
  EXPECT_TRUE(Found("\\p{Mn}", ahom).empty());
  EXPECT_TRUE(FullMatch("\\p{Mc}", ahom));
  EXPECT_TRUE(FullMatch("\\p{M}", ahom));
  EXPECT_TRUE(FullMatch("[\\p{Mn}\\p{Mc}]", ahom));
  EXPECT_TRUE(FullMatch("[^\\p{Mn}]", ahom));
  EXPECT_TRUE(FullMatch("\\P{Mn}", ahom));
  // U+1C89 is an upper-case letter (Unicode 16), U+1C8A its lower case.
  EXPECT_TRUE(FullMatch("\\p{Lu}", "\xE1\xB2\x89"));
  EXPECT_TRUE(FullMatch("\\p{LC}", "\xE1\xB2\x8A"));
  EXPECT_TRUE(FullMatch("\\p{lu}", "\xE1\xB2\x89"));  // names match loosely, as in Oniguruma
  // \d is Unicode 16's decimal digits (U+1E5F1, Ol Onal digit one).
  EXPECT_TRUE(FullMatch("\\d", "\xF0\x9E\x97\xB1"));
  EXPECT_TRUE(Found("[^\\d]", "\xF0\x9E\x97\xB1").empty());
}

TEST(Regex, PropertiesDoNotCaseFoldOutsideBracketsUnderCaseless) {
  // Oniguruma's (?i)\p{Lu} is upper case only; the added U+1C89 must not bring U+1C8A along.
  EXPECT_TRUE(FullMatch("(?i)\\p{Lu}", "\xE1\xB2\x89"));
  EXPECT_TRUE(Found("(?i)\\p{Lu}", "\xE1\xB2\x8A").empty());
  EXPECT_TRUE(Found("(?i)\\p{Lu}", "a").empty());
}

TEST(Regex, OnigurumaSyntaxMeansWhatItMeansInOniguruma) {
  // An isolated option applies to the rest of its group as one group: ab(?i:c|def).
  EXPECT_EQ(Found("ab(?i)c|def", "abC DEF def abdef"), (std::vector<std::string>{"abC", "abdef"}));
  EXPECT_EQ(Found("(x(?i)y|z)|w", "xY Z W w"), (std::vector<std::string>{"xY", "w"}));
  // ^ and $ are line anchors; (?m) lets the dot match a newline.
  EXPECT_EQ(Found("^a", "a\na"), (std::vector<std::string>{"a", "a"}));
  EXPECT_EQ(Found("a$", "a\na"), (std::vector<std::string>{"a", "a"}));
  EXPECT_EQ(Found("(?m)a.b", "a\nb"), (std::vector<std::string>{"a\nb"}));
  EXPECT_TRUE(Found("a.b", "a\nb").empty());
  // \v is the vertical tab only, \uHHHH a code point, {,n} is {0,n}.
  EXPECT_EQ(Found("\\v", "\n\v\r"), (std::vector<std::string>{"\v"}));
  EXPECT_EQ(Found("[\\v]", "\n\v\r"), (std::vector<std::string>{"\v"}));
  EXPECT_EQ(Found("\\u00e9", "\xC3\xA9"), (std::vector<std::string>{"\xC3\xA9"}));
  EXPECT_EQ(Found("x{,2}", "xxx"), (std::vector<std::string>{"xx", "x"}));
  // Literal '-' and '^' keep their meaning when a property moves to the end of the class.
  EXPECT_EQ(Found("[-\\p{So}]", "-a"), (std::vector<std::string>{"-"}));
  EXPECT_EQ(Found("[\\p{So}^]", "^a"), (std::vector<std::string>{"^"}));
}

TEST(Regex, ConstructsOnigurumaAndPcre2ReadDifferentlyAreRefusedNamingTheFile) {
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"\\p{Han}", "\\p{Han}"},
      {"[\\p{Greek}a]", "\\p{Greek}"},
      {"\\p{Alpha}", "\\p{Alpha}"},
      {"\\p{Letter}", "\\p{Letter}"},
      {"\\pL", "\\pL"},
      {"\\w+", "\\w"},
      {"[^\\W]", "\\W"},
      {"\\bx", "\\b"},
      {"\\h", "\\h"},
      {"\\X", "\\X"},
      {"[a[b]]", "[ inside a class"},
      {"[a-z&&[^b]]", "&&"},
      {"a{1,2}+", "{1,2}+"},
      {"(?s).", "(?s"},
      {"(?~abc)", "(?~"},
      {"(?i)[\\p{Lu}]", "\\p{Lu} inside brackets under (?i)"},
      {"(?i:\xC9\xA4)", "U+0264 under (?i)"},     // U+A7CB became its upper case in Unicode 16
      {"(?i)[a-\xC9\xBF]", "U+019B under (?i)"},  // the first such code point of the range
  };
  for (const auto& [pattern, named] : refused) {
    try {
      Regex regex(pattern, "dir/tokenizer.json");
      ADD_FAILURE() << pattern << " was accepted as " << regex.pcre2_pattern();
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), kExitBadData) << pattern;
      const std::string message = e.what();
      EXPECT_EQ(message.rfind("dir/tokenizer.json: ", 0), 0u) << message;
      EXPECT_NE(message.find(named), std::string::npos) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    }
  }
  // Case-insensitive ASCII and properties outside brackets stay accepted.
  EXPECT_NO_THROW(Regex("(?i:'s|'t|'re|'ve|'m|'ll|'d)|\\p{L}+", "t.json"));
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
