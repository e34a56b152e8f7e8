// Encoding semantics: merge ranks, ties, ignore_merges, added tokens, threads.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "common/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace crucible {
namespace {

using testing::MakeTokenizer;
using testing::MakeTokenizerJson;
using testing::Special;
using testing::TestTokenizerSpec;
using Ids = std::vector<uint32_t>;

uint32_t Id(const Tokenizer& t, const std::string& raw) {
  return static_cast<uint32_t>(t.TokenToId(BytesToByteLevel(raw)));
}

TEST(Merges, LowerRankMergesFirst) {
  TestTokenizerSpec spec;
  spec.merges = {{"a", "b"}, {"b", "c"}};
  Tokenizer ab_first = MakeTokenizer(spec);
  EXPECT_EQ(ab_first.Encode("abc"), (Ids{Id(ab_first, "ab"), 'c'}));
  spec.merges = {{"b", "c"}, {"a", "b"}};
  Tokenizer bc_first = MakeTokenizer(spec);
  EXPECT_EQ(bc_first.Encode("abc"), (Ids{'a', Id(bc_first, "bc")}));
}

TEST(Merges, EqualRanksMergeLeftmostFirst) {
  TestTokenizerSpec spec;
  spec.merges = {{"a", "a"}};
  Tokenizer t = MakeTokenizer(spec);
  EXPECT_EQ(t.Encode("aaa"), (Ids{Id(t, "aa"), 'a'}));
  EXPECT_EQ(t.Encode("aaaa"), (Ids{Id(t, "aa"), Id(t, "aa")}));
}

TEST(Merges, IgnoreMergesLooksUpWholeWordsFirst) {
  TestTokenizerSpec spec;
  // "abc" is in the vocabulary, but merging "abc" by rank stops at [ab, c].
  spec.merges = {{"a", "b"}, {"b", "c"}, {"a", "bc"}};
  Tokenizer by_rank = MakeTokenizer(spec);
  EXPECT_EQ(by_rank.Encode("abc"), (Ids{Id(by_rank, "ab"), 'c'}));
  spec.ignore_merges = true;
  Tokenizer whole = MakeTokenizer(spec);
  EXPECT_EQ(whole.Encode("abc"), (Ids{Id(whole, "abc")}));
  EXPECT_EQ(whole.Encode("abcc"), (Ids{Id(whole, "ab"), 'c', 'c'}));
}

TEST(Merges, BothMergeSpellingsLoadTheSame) {
  TestTokenizerSpec spec;
  spec.merges = {{"t", "h"}, {"th", "e"}, {" ", "the"}, {"e", "r"}};
  Tokenizer strings = MakeTokenizer(spec);
  spec.array_merges = true;
  Tokenizer arrays = MakeTokenizer(spec);
  EXPECT_EQ(strings.Checksum(), arrays.Checksum());
  EXPECT_EQ(strings.Encode("the other theme"), arrays.Encode("the other theme"));
  EXPECT_EQ(strings.Encode(" the"), (Ids{Id(strings, " the")}));
}

// The reference: repeatedly merge the lowest-rank adjacent pair, leftmost on ties.
Ids ReferenceMerge(Ids symbols, const std::vector<std::array<uint32_t, 3>>& merges) {
  while (true) {
    size_t best = SIZE_MAX, best_rank = SIZE_MAX;
    for (size_t i = 0; i + 1 < symbols.size(); ++i)
      for (size_t r = 0; r < merges.size() && r < best_rank; ++r)
        if (merges[r][0] == symbols[i] && merges[r][1] == symbols[i + 1]) {
          best = i;
          best_rank = r;
        }
    if (best == SIZE_MAX) return symbols;
    symbols[best] = merges[best_rank][2];
    symbols.erase(symbols.begin() + best + 1);
  }
}

TEST(Merges, ShortAndLongWordPathsAgreeWithTheReference) {
  std::mt19937 rng(7);
  std::array<int32_t, 256> byte_ids;
  for (int b = 0; b < 256; ++b) byte_ids[b] = b;
  std::vector<std::array<uint32_t, 3>> merges;
  uint32_t next = 256;
  std::vector<uint32_t> alphabet = {'a', 'b', 'c'};
  std::set<std::pair<uint32_t, uint32_t>> used;  // a pair listed twice keeps its last rank
  while (merges.size() < 40) {
    uint32_t l = alphabet[rng() % alphabet.size()], r = alphabet[rng() % alphabet.size()];
    if (!used.insert({l, r}).second) continue;
    merges.push_back({l, r, next});
    alphabet.push_back(next++);
  }
  BpeModel model(byte_ids, merges, {}, false);
  BpeScratch scratch;
  for (int trial = 0; trial < 300; ++trial) {
    size_t length = 2 + rng() % (trial % 2 ? 40 : 300);  // both sides of the 64-symbol switch
    Ids word;
    for (size_t i = 0; i < length; ++i) word.push_back("abc"[rng() % 3]);
    scratch.symbols = word;
    model.MergeSymbols(scratch);
    EXPECT_EQ(scratch.symbols, ReferenceMerge(word, merges)) << "length " << length;
  }
}

TEST(AddedTokens, AreCutFromRawTextLeftmostLongest) {
  TestTokenizerSpec spec;
  spec.added_tokens = {Special("<|end_of_text|>"), Special("<|e"), Special("<|end_of_text|>!")};
  Tokenizer t = MakeTokenizer(spec);
  uint32_t eos = static_cast<uint32_t>(t.TokenToId("<|end_of_text|>"));
  uint32_t bang = static_cast<uint32_t>(t.TokenToId("<|end_of_text|>!"));
  EXPECT_EQ(t.eos_id(), eos);
  EXPECT_EQ(t.Encode("a<|end_of_text|>b"), (Ids{'a', eos, 'b'}));
  EXPECT_EQ(t.Encode("<|end_of_text|>!"), (Ids{bang}));
  EXPECT_EQ(t.Encode("<|end_of_tex"), (Ids{static_cast<uint32_t>(t.TokenToId("<|e")), 'n', 'd', '_',
                                           'o', 'f', '_', 't', 'e', 'x'}));
}

TEST(SpecialTokens, EndAndBeginOfTextAreFoundByTheNamesOfCommonTokenizers) {
  // DeepSeek spells them with U+FF5C (fullwidth vertical line) and U+2581 (lower one eighth).
  const std::string end =
      "<\xEF\xBD\x9C"
      "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";
  const std::string begin =
      "<\xEF\xBD\x9C"
      "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";
  TestTokenizerSpec spec;
  spec.added_tokens = {Special(begin), Special(end), Special("<|User|>")};
  Tokenizer t = MakeTokenizer(spec);
  EXPECT_EQ(t.eos_id(), t.TokenToId(end));
  EXPECT_EQ(t.bos_id(), t.TokenToId(begin));
  // End of text wins over end of turn; GPT-2's <|endoftext|> is both.
  SpecialTokenIds ids = FindSpecialTokens({{"<|eot_id|>", 7}, {"<|end_of_text|>", 9}});
  EXPECT_EQ(ids.eos, 9);
  EXPECT_EQ(ids.bos, -1);
  ids = FindSpecialTokens({{"<|endoftext|>", 3}});
  EXPECT_EQ(ids.eos, 3);
  EXPECT_EQ(ids.bos, 3);
  EXPECT_EQ(FindSpecialTokens({{"<|im_end|>", 4}, {"<s>", 1}}).eos, 4);
}

TEST(SpecialTokens, AnEndOfTextTokenCanBeNamedAndAnUnknownNameIsAUsageError) {
  TestTokenizerSpec spec;
  spec.added_tokens = {Special("<|end_of_text|>"), Special("<|eot_id|>")};
  Tokenizer t = MakeTokenizer(spec);
  EXPECT_EQ(t.EndOfTextId(""), t.eos_id());
  EXPECT_EQ(t.EndOfTextId("<|eot_id|>"), t.TokenToId("<|eot_id|>"));
  EXPECT_EQ(t.EndOfTextId("a"), 'a');  // a vocabulary entry, as tokenizer.json writes it
  try {
    t.EndOfTextId("<|no_such_token|>");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    EXPECT_NE(std::string(e.what()).find("test.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("<|no_such_token|>"), std::string::npos) << e.what();
  }
  TestTokenizerSpec none;
  EXPECT_EQ(MakeTokenizer(none).EndOfTextId(""), -1);
}

TEST(AddedTokens, LstripAndRstripSwallowWhitespace) {
  TestTokenizerSpec spec;
  spec.added_tokens = {Special("<m>", /*lstrip=*/true, /*rstrip=*/true)};
  Tokenizer t = MakeTokenizer(spec);
  uint32_t m = static_cast<uint32_t>(t.TokenToId("<m>"));
  uint32_t space = Id(t, " ");
  EXPECT_EQ(t.Encode("a  <m>\n b"), (Ids{'a', m, 'b'}));
  spec.added_tokens = {Special("<m>")};
  Tokenizer plain = MakeTokenizer(spec);
  EXPECT_EQ(plain.Encode("a <m> b"), (Ids{'a', space, m, space, 'b'}));
}

TEST(AddedTokens, NonNormalizedOnesWinOverNormalizedOnes) {
  TestTokenizerSpec spec;
  // "ab" (normalized) would match first, but "bc" (not normalized) is cut out first.
  spec.added_tokens = {Special("ab", false, false, /*normalized=*/true), Special("bc")};
  Tokenizer t = MakeTokenizer(spec);
  EXPECT_EQ(t.Encode("abc"), (Ids{'a', static_cast<uint32_t>(t.TokenToId("bc"))}));
}

TEST(Encode, InvalidUtf8IsReadAsReplacementCharacters) {
  TestTokenizerSpec spec;
  Tokenizer t = MakeTokenizer(spec);
  EXPECT_EQ(t.Encode("a\xFF"
                     "b"),
            t.Encode("a\xEF\xBF\xBD"
                     "b"));
  EXPECT_EQ(t.Decode(t.Encode("a\xFF"
                              "b")),
            "a\xEF\xBF\xBD"
            "b");
}

TEST(Decode, CutCharactersBecomeReplacementCharactersAndSpecialsCanBeSkipped) {
  TestTokenizerSpec spec;
  spec.added_tokens = {Special("<|end_of_text|>")};
  Tokenizer t = MakeTokenizer(spec);
  Ids ids = t.Encode("\xC3\xA9<|end_of_text|>");  // é is two byte tokens
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(t.Decode({ids[0]}), "\xEF\xBF\xBD");
  EXPECT_EQ(t.Decode(ids), "\xC3\xA9<|end_of_text|>");
  EXPECT_EQ(t.Decode(ids, /*skip_special_tokens=*/true), "\xC3\xA9");
  EXPECT_EQ(t.Decode({999999}), "");  // unknown ids are skipped
}

TEST(EncodeBatch, IsIdenticalToEncodeForEveryThreadCount) {
  TestTokenizerSpec spec;
  spec.merges = {{"e", " "}, {"t", "h"}, {"th", "e"}, {" ", "the"}, {"i", "n"}, {"in", "g"}};
  spec.added_tokens = {Special("<|end_of_text|>")};
  Tokenizer t = MakeTokenizer(spec);
  std::mt19937 rng(3);
  const char* words[] = {"the",  " thing",          "ing", " ", "\n", "é",
                         "東京", "<|end_of_text|>", "42",  "'s"};
  std::vector<std::string> storage;
  for (int d = 0; d < 500; ++d) {
    std::string doc;
    for (int w = 0, n = rng() % 60; w < n; ++w) doc += words[rng() % 10];
    storage.push_back(doc);
  }
  std::vector<std::string_view> docs(storage.begin(), storage.end());
  std::vector<Ids> expected;
  for (auto d : docs) expected.push_back(t.Encode(d));
  for (int threads : {1, 2, 3, 8}) EXPECT_EQ(t.EncodeBatch(docs, threads), expected) << threads;
}

TEST(SaveLoad, RoundTripKeepsIdsAndChecksum) {
  TestTokenizerSpec spec;
  spec.merges = {{"a", "b"}, {"ab", "c"}};
  spec.added_tokens = {Special("<|begin_of_text|>"), Special("<|end_of_text|>")};
  Tokenizer t = MakeTokenizer(spec);
  Tokenizer back = Tokenizer::FromJson(t.ToJson(), "saved.json");
  EXPECT_EQ(back.Checksum(), t.Checksum());
  EXPECT_EQ(back.Encode("abc <|begin_of_text|>"), t.Encode("abc <|begin_of_text|>"));
  EXPECT_EQ(back.bos_id(), t.bos_id());
  // Formatting does not change the checksum; content does.
  Tokenizer compact = Tokenizer::FromJson(MakeTokenizerJson(spec).dump(), "a.json");
  Tokenizer pretty = Tokenizer::FromJson(MakeTokenizerJson(spec).dump(4), "b.json");
  EXPECT_EQ(compact.Checksum(), pretty.Checksum());
  spec.merges = {{"a", "b"}};
  EXPECT_NE(MakeTokenizer(spec).Checksum(), t.Checksum());
}

TEST(PreTokenizer, Llama3SplitsLikeHuggingFace) {
  TestTokenizerSpec spec;
  spec.pre_tokenizer = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"Regex", kLlama3Pattern}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  Tokenizer t = MakeTokenizer(spec);
  // Expected pieces from tokenizers' pre_tokenize_str with the same pre-tokenizer.
  EXPECT_EQ(t.PreTokenize("Hello world! It's 12345 \n\n  x"),
            (std::vector<std::string>{"Hello", " world", "!", " It", "'s", " ", "123", "45",
                                      " \n\n", " ", " x"}));
}

}  // namespace
}  // namespace crucible
