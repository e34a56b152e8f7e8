// The tokenizer CLI on bad input: malformed tokenizer.json files are exit 65 with the file named.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "tokenizer_test_util.h"

namespace crucible {
namespace {

struct Result {
  int exit_code;
  std::string output;
};

Result RunCrucible(const std::string& arguments) {
  std::string command = std::string(CRUCIBLE_BINARY) + " " + arguments + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

std::string WriteFile(const std::string& name, const std::string& contents) {
  std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << contents;
  return path;
}

nlohmann::ordered_json Valid() {
  testing::TestTokenizerSpec spec;
  spec.merges = {{"a", "b"}};
  return testing::MakeTokenizerJson(spec);
}

void ExpectBadData(const std::string& name, const nlohmann::ordered_json& json,
                   const std::string& feature) {
  std::string path = WriteFile(name, json.dump());
  Result r = RunCrucible("tokenizer info " + path);
  EXPECT_EQ(r.exit_code, 65) << r.output;
  EXPECT_NE(r.output.find(path), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(feature), std::string::npos) << r.output;
}

TEST(TokenizerCli, MalformedTokenizerJsonIsExit65NamingTheFile) {
  std::string path = WriteFile("not_json.json", "{\"model\": ");
  Result r = RunCrucible("tokenizer info " + path);
  EXPECT_EQ(r.exit_code, 65);
  EXPECT_NE(r.output.find(path + ": not valid JSON"), std::string::npos) << r.output;

  auto j = Valid();
  j["model"]["type"] = "WordPiece";
  ExpectBadData("wordpiece.json", j, "WordPiece");
  j = Valid();
  j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "AAAA"}};
  ExpectBadData("precompiled.json", j, "unsupported normalizer \"Precompiled\"");
  j = Valid();
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers", {{{"type", "NFKC"}}, {{"type", "BertNormalizer"}}}}};
  ExpectBadData("bert_normalizer.json", j, "BertNormalizer");
  j = Valid();
  j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", ""}}}, {"content", "x"}};
  ExpectBadData("empty_replace.json", j, "empty String pattern");
  j = Valid();
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  ExpectBadData("metaspace.json", j, "Metaspace pre_tokenizer needs a \"replacement\"");
  j = Valid();
  j["normalizer"] = {{"type", "Lowercase"}};
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"String", "-"}}},
         {"behavior", "Removed"},
         {"invert", false}},
        {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "first"}}}}};
  ExpectBadData("metaspace_first_late.json", j, "prepend_scheme \"first\" after another");
  j = Valid();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "ByteLevel"}},
                          {{"type", "Split"},
                           {"pattern", {{"Regex", "\\s+"}}},
                           {"behavior", "Isolated"},
                           {"invert", false}}}}};
  ExpectBadData("byte_level_not_last.json", j, "not the last one");
  j = Valid();
  j["decoder"] = {{"type", "Strip"}, {"content", "ab"}, {"start", 1}, {"stop", 0}};
  ExpectBadData("strip_two_chars.json", j, "must be one character");
  j = Valid();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"},
                           {"pattern", {{"Regex", "(unclosed"}}},
                           {"behavior", "Isolated"},
                           {"invert", false}},
                          {{"type", "ByteLevel"}}}}};
  ExpectBadData("bad_regex.json", j, "(unclosed");
  j = Valid();
  j["model"]["merges"].push_back("a zzz");
  ExpectBadData("bad_merge.json", j, "merge 2");
  j = Valid();
  j["model"]["merges"].push_back("a b c");
  ExpectBadData("three_part_merge.json", j, "merge 2");
  j = Valid();
  j["model"]["dropout"] = 0.1;
  ExpectBadData("dropout.json", j, "dropout");
  j = Valid();
  j["model"]["vocab"]["x"] = -3;
  ExpectBadData("negative_id.json", j, "\"x\"");
  j = Valid();
  j["model"].erase("vocab");
  ExpectBadData("no_vocab.json", j, "vocab");
  j = Valid();
  j["decoder"] = {{"type", "WordPiece"}};
  ExpectBadData("decoder.json", j, "decoder");
  // A property crucible cannot match at the Unicode version of `tokenizers` (a script).
  j = Valid();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"},
                           {"pattern", {{"Regex", "\\p{Han}+|\\p{L}+"}}},
                           {"behavior", "Isolated"},
                           {"invert", false}},
                          {{"type", "ByteLevel"}}}}};
  ExpectBadData("script_property.json", j, "\\p{Han}");
}

TEST(TokenizerCli, MissingFileIsAUsageError) {
  Result r = RunCrucible("tokenizer info /nonexistent/tokenizer.json");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("/nonexistent/tokenizer.json"), std::string::npos);
}

TEST(TokenizerCli, TrainEncodeDecodeRoundTrip) {
  std::string text =
      "Hello world, it's a test.\ncaf\xC3\xA9 \xE6\x9D\xB1\xE4\xBA\xAC 123 <|end_of_text|> x\n";
  std::string corpus;
  for (int i = 0; i < 50; ++i) corpus += text;
  std::string input = WriteFile("corpus.txt", corpus);
  std::string tokenizer = ::testing::TempDir() + "/cli_tokenizer.json";
  Result train = RunCrucible("tokenizer train " + input + " -o " + tokenizer + " --vocab-size 280");
  ASSERT_EQ(train.exit_code, 0) << train.output;
  Result info = RunCrucible("tokenizer info " + tokenizer);
  EXPECT_NE(info.output.find("vocab_size=280"), std::string::npos) << info.output;
  EXPECT_NE(info.output.find("<|end_of_text|>:279"), std::string::npos) << info.output;
  std::string ids = ::testing::TempDir() + "/cli_ids.txt";
  ASSERT_EQ(RunCrucible("tokenizer encode -t " + tokenizer + " " + input + " -o " + ids).exit_code,
            0);
  std::string decoded = ::testing::TempDir() + "/cli_decoded.txt";
  ASSERT_EQ(
      RunCrucible("tokenizer decode -t " + tokenizer + " " + ids + " -o " + decoded).exit_code, 0);
  std::ifstream in(decoded);
  std::string back((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(back, corpus);
  std::string bin = ::testing::TempDir() + "/cli_ids.bin";
  ASSERT_EQ(RunCrucible("tokenizer encode --eos --threads 2 -t " + tokenizer + " " + input +
                        " --out-bin " + bin)
                .exit_code,
            0);
  Result bad = RunCrucible("tokenizer decode -t " + tokenizer + " " + input);  // text is not ids
  EXPECT_EQ(bad.exit_code, 65);
  EXPECT_NE(bad.output.find(input + ":1"), std::string::npos) << bad.output;
}

TEST(TokenizerCli, InfoListsSpecialTokensOnePerLineAndNamesTheEndOfText) {
  auto j = Valid();
  const std::string end =
      "<\xEF\xBD\x9C"
      "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";
  j["added_tokens"].push_back({{"id", 257}, {"content", end}, {"special", true}});
  for (int k = 0; k < 300; ++k)
    j["added_tokens"].push_back({{"id", 258 + k},
                                 {"content", "<|reserved_" + std::to_string(k) + "|>"},
                                 {"special", true}});
  std::string path = WriteFile("many_specials.json", j.dump());
  Result r = RunCrucible("tokenizer info " + path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\neos_id=257\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\neos_token=" + end + "\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\nspecial_tokens=301\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\nspecial_token=" + end + ":257\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\nspecial_tokens_not_listed=285"), std::string::npos) << r.output;
  size_t longest = 0;
  for (size_t start = 0, end_of_line; start < r.output.size(); start = end_of_line + 1) {
    end_of_line = r.output.find('\n', start);
    if (end_of_line == std::string::npos) end_of_line = r.output.size();
    longest = std::max(longest, end_of_line - start);
  }
  EXPECT_LT(longest, 200u) << r.output;
  // --all lists every one; --eos-token names another end of text.
  Result all = RunCrucible("tokenizer info --all " + path);
  EXPECT_NE(all.output.find("special_token=<|reserved_299|>:557\n"), std::string::npos);
  Result named = RunCrucible("tokenizer info --eos-token '<|reserved_7|>' " + path);
  EXPECT_NE(named.output.find("\neos_id=265\n"), std::string::npos) << named.output;
  Result unknown = RunCrucible("tokenizer info --eos-token '<|nope|>' " + path);
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.output.find(path), std::string::npos) << unknown.output;
  EXPECT_NE(unknown.output.find("<|nope|>"), std::string::npos) << unknown.output;
}

TEST(TokenizerCli, EncodeEosTokenAppendsTheNamedToken) {
  auto j = Valid();
  j["added_tokens"].push_back({{"id", 257}, {"content", "<|end_of_text|>"}, {"special", true}});
  j["added_tokens"].push_back({{"id", 258}, {"content", "<|eot_id|>"}, {"special", true}});
  std::string tokenizer = WriteFile("two_ends.json", j.dump());
  std::string input = WriteFile("two_docs.txt", "ab\nb\n");
  std::string out = ::testing::TempDir() + "/two_docs.ids";
  auto ids = [&](const std::string& options) {
    EXPECT_EQ(
        RunCrucible("tokenizer encode " + options + " -t " + tokenizer + " " + input + " -o " + out)
            .exit_code,
        0);
    std::ifstream in(out);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  EXPECT_EQ(ids("--eos"), "256 257\n98 257\n");
  EXPECT_EQ(ids("--eos-token '<|eot_id|>'"), "256 258\n98 258\n");
}

TEST(TokenizerCli, BadJsonlLineIsNamed) {
  std::string input = WriteFile("bad.jsonl", "{\"text\": \"ok\"}\n{\"body\": \"no text\"}\n");
  std::string tokenizer = WriteFile("valid.json", Valid().dump());
  Result r = RunCrucible("tokenizer encode -t " + tokenizer + " " + input);
  EXPECT_EQ(r.exit_code, 65);
  EXPECT_NE(r.output.find(input + ":2"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace crucible
