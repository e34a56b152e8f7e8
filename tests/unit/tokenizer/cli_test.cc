// The tokenizer CLI on bad input: malformed tokenizer.json files are exit 65 with the file named.
#include <gtest/gtest.h>
#include <sys/wait.h>

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
  j["normalizer"] = {{"type", "NFC"}};
  ExpectBadData("nfc.json", j, "NFC");
  j = Valid();
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  ExpectBadData("metaspace.json", j, "Metaspace");
  j = Valid();
  j["pre_tokenizer"] = {{"type", "Split"},
                        {"pattern", {{"Regex", "\\s+"}}},
                        {"behavior", "Isolated"},
                        {"invert", false}};
  ExpectBadData("no_byte_level.json", j, "not byte-level");
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

TEST(TokenizerCli, BadJsonlLineIsNamed) {
  std::string input = WriteFile("bad.jsonl", "{\"text\": \"ok\"}\n{\"body\": \"no text\"}\n");
  std::string tokenizer = WriteFile("valid.json", Valid().dump());
  Result r = RunCrucible("tokenizer encode -t " + tokenizer + " " + input);
  EXPECT_EQ(r.exit_code, 65);
  EXPECT_NE(r.output.find(input + ":2"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace crucible
