// SentencePiece-style BPE (characters, byte_fallback, unk), Metaspace, the decoders and the
// normalizers, on small tokenizers whose expected ids and strings were taken from Hugging Face
// `tokenizers` 0.23.3 (tests/integration/test_tokenizer_spm_hf.py compares whole corpora).
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_normalization.h"

namespace crucible {
namespace {

using nlohmann::json;

const char* const kMeta = "\xE2\x96\x81";  // U+2581, SentencePiece's space

struct Spec {
  bool byte_fallback = true, fuse_unk = true;
  std::string drop;  // a token left out of the vocabulary
  json normalizer, pre_tokenizer, decoder;
  json added = json::array();
};

// Vocab: <unk>, <0x00>..<0xFF>, a, b, ab, ▁, ▁a (ids in that order, less `drop`); merges a b and
// ▁ a.
Tokenizer Make(const Spec& spec) {
  std::vector<std::string> tokens = {"<unk>"};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    tokens.push_back(name);
  }
  for (const char* t : {"a", "b", "ab"}) tokens.push_back(t);
  tokens.push_back(kMeta);
  tokens.push_back(std::string(kMeta) + "a");
  json vocab = json::object();
  for (const std::string& t : tokens)
    if (t != spec.drop) vocab[t] = vocab.size();
  json added = json::array();
  for (json token : spec.added) {
    token["id"] = vocab.size() + added.size();
    added.push_back(token);
  }
  json j = {{"version", "1.0"},
            {"added_tokens", added},
            {"normalizer", spec.normalizer},
            {"pre_tokenizer", spec.pre_tokenizer},
            {"decoder", spec.decoder},
            {"model",
             {{"type", "BPE"},
              {"unk_token", "<unk>"},
              {"fuse_unk", spec.fuse_unk},
              {"byte_fallback", spec.byte_fallback},
              {"vocab", vocab},
              {"merges", json::array({json::array({"a", "b"}), json::array({kMeta, "a"})})}}}};
  return Tokenizer::FromJson(j.dump(), "spm.json");
}

using Ids = std::vector<uint32_t>;

TEST(SentencePieceBpe, CharactersMissingFromTheVocabularyBecomeTheirUtf8ByteTokens) {
  // "ab€a": ab merges, € is E2 82 AC, one <0xNN> token per byte (id = byte + 1).
  EXPECT_EQ(Make({}).Encode("ab\xE2\x82\xAC"
                            "a"),
            (Ids{259, 227, 131, 173, 257}));
}

TEST(SentencePieceBpe, WithoutByteFallbackUnknownCharactersAreUnkFusedOrNot) {
  Spec spec;
  spec.byte_fallback = false;
  const std::string text =
      "a\xE2\x82\xAC\xE2\x82\xAC"
      "b";
  EXPECT_EQ(Make(spec).Encode(text), (Ids{257, 0, 258}));
  spec.fuse_unk = false;
  EXPECT_EQ(Make(spec).Encode(text), (Ids{257, 0, 0, 258}));
}

TEST(SentencePieceBpe, AByteFallbackLeavesAPendingUnkPendingAsTokenizersDoes) {
  // <0x82> is missing, so € is unk; é's bytes come out before that unk, as in tokenizers.
  Spec spec;
  spec.drop = "<0x82>";
  EXPECT_EQ(Make(spec).Encode("\xE2\x82\xAC\xC3\xA9"
                              "a"),
            (Ids{195, 169, 0, 256}));
}

TEST(SentencePieceBpe, AnUnkTokenMissingFromTheVocabularyFailsOnlyWhenNeeded) {
  Spec spec;
  spec.byte_fallback = false;
  spec.drop = "<unk>";
  const Tokenizer tokenizer = Make(spec);
  EXPECT_EQ(tokenizer.Encode("ab").size(), 1u);
  try {
    tokenizer.Encode("\xE2\x82\xAC");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 65);
    EXPECT_NE(std::string(e.what()).find("spm.json: unk_token \"<unk>\" is not in the vocabulary"),
              std::string::npos)
        << e.what();
  }
}

TEST(SentencePieceDecoders, ReplaceByteFallbackFuseStripAsLlama2) {
  Spec spec;
  spec.decoder = {{"type", "Sequence"},
                  {"decoders",
                   {{{"type", "Replace"}, {"pattern", {{"String", kMeta}}}, {"content", " "}},
                    {{"type", "ByteFallback"}},
                    {{"type", "Fuse"}},
                    {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  // ▁ <0xE2> <0x82> a <0xC3> <0xA9> ▁ ▁a: the cut € gives one U+FFFD per byte.
  EXPECT_EQ(Make(spec).Decode({260, 227, 131, 257, 196, 170, 260, 261}),
            "\xEF\xBF\xBD\xEF\xBF\xBD"
            "a\xC3\xA9  a");
}

TEST(SentencePieceMetaspace, PrependSchemeFirstPrefixesOnlyThePieceThatStartsTheText) {
  Spec spec;
  spec.pre_tokenizer = {
      {"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "first"}, {"split", true}};
  spec.decoder = spec.pre_tokenizer;
  spec.added = json::array({{{"content", "<X>"},
                             {"single_word", false},
                             {"lstrip", false},
                             {"rstrip", false},
                             {"normalized", false},
                             {"special", true}}});
  const Tokenizer tokenizer = Make(spec);
  EXPECT_EQ(tokenizer.Encode("a b"), (Ids{261, 260, 258}));
  EXPECT_EQ(tokenizer.Encode("<X>a b"), (Ids{262, 257, 260, 258}));
  EXPECT_EQ(tokenizer.Encode("a<X>a"), (Ids{261, 262, 257}));
  EXPECT_EQ(tokenizer.Decode({261, 260, 258}), "a b");
  EXPECT_EQ(tokenizer.Describe(),
            "BPE(characters,byte_fallback,unk=<unk>) pre_tokenizer=Metaspace(first,split)");
}

std::string Nfc(std::string_view s, NormalizationForm form = NormalizationForm::kNfc) {
  std::string out;
  NormalizeUnicode(form, s, &out);
  return out;
}

TEST(UnicodeNormalization, ComposesReordersAndDecomposesAtUnicode9) {
  EXPECT_EQ(Nfc("e\xCC\x81"), "\xC3\xA9");     // e + U+0301 -> é
  EXPECT_EQ(Nfc("\xE2\x84\xAB"), "\xC3\x85");  // U+212B ANGSTROM SIGN -> Å
  EXPECT_EQ(Nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "\xEA\xB0\x81");  // jamo -> 각
  // U+0323 (class 220) moves before U+0301 (230), then both compose onto a: ạ́ is ạ + U+0301.
  EXPECT_EQ(Nfc("a\xCC\x81\xCC\xA3"), "\xE1\xBA\xA1\xCC\x81");
  EXPECT_EQ(Nfc("\xEF\xAC\x81", NormalizationForm::kNfkc), "fi");  // ﬁ
  EXPECT_EQ(Nfc("\xEF\xAC\x81", NormalizationForm::kNfc), "\xEF\xAC\x81");
  EXPECT_EQ(Nfc("\xC3\xA9", NormalizationForm::kNfd), "e\xCC\x81");
  // U+08D4 (Unicode 9) has class 230 and reorders; U+08D3 (Unicode 11) does not, as in
  // tokenizers.
  EXPECT_EQ(Nfc("a\xE0\xA3\x94\xCC\xB4"), "a\xCC\xB4\xE0\xA3\x94");
  EXPECT_EQ(Nfc("a\xE0\xA3\x93\xCC\xB4"), "a\xE0\xA3\x93\xCC\xB4");
}

TEST(UnicodeNormalization, LowercaseIsRustsFullMappingCharacterByCharacter) {
  std::string out;
  AppendLowercase("\xC4\xB0Stanbul \xCE\x91\xCE\xA3", &out);  // İStanbul ΑΣ
  EXPECT_EQ(out, "i\xCC\x87stanbul \xCE\xB1\xCF\x83");        // i̇stanbul ασ (no final sigma)
}

TEST(SentencePieceNormalizers, Llama2PrependAndReplaceAroundASpecialToken) {
  Spec spec;
  spec.normalizer = {{"type", "Sequence"},
                     {"normalizers",
                      {{{"type", "Prepend"}, {"prepend", kMeta}},
                       {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMeta}}}}};
  spec.added = json::array({{{"content", "<X>"},
                             {"single_word", false},
                             {"lstrip", false},
                             {"rstrip", false},
                             {"normalized", false},
                             {"special", true}}});
  // "a<X> a": "▁a", <X>, "▁▁a" (each piece between special tokens normalized on its own).
  EXPECT_EQ(Make(spec).Encode("a<X> a"), (Ids{261, 262, 260, 261}));
}

}  // namespace
}  // namespace crucible
