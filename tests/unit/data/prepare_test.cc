#include "data/prepare.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "common/error.h"
#include "common/files.h"
#include "common/hash.h"
#include "data/indexed_dataset.h"
#include "data/manifest.h"
#include "data_test_util.h"

namespace crucible {
namespace {

using testing::ByteEncoder;
using testing::ScratchDir;

std::vector<int64_t> Ids(const std::string& text, bool eos = true) {
  std::vector<int64_t> ids;
  for (unsigned char c : text) ids.push_back(c);
  if (eos) ids.push_back(256);
  return ids;
}

PrepareResult Prepare(const std::vector<std::string>& inputs, const std::string& prefix,
                      const std::string& split = "file", const std::string& field = "text") {
  PrepareOptions options;
  options.inputs = inputs;
  options.output_prefix = prefix;
  options.split = split;
  options.json_field = field;
  options.progress = false;
  return PrepareShard(options, ByteEncoder());
}

TEST(Prepare, JsonlDocumentsEndWithEosAndTheManifestMatchesTheFiles) {
  ScratchDir dir;
  AtomicWriteFile(
      dir / "in.jsonl",
      "{\"text\": \"hello\", \"id\": 1}\n\n{\"text\": \"\"}\n{\"text\": \"w\\u00f6rld\"}");
  PrepareResult result = Prepare({dir / "in.jsonl"}, dir / "out/shard");
  IndexedDataset data(dir / "out/shard");
  ASSERT_EQ(data.sequence_count(), 2);
  EXPECT_EQ(data.Sequence(0), Ids("hello"));
  EXPECT_EQ(data.Sequence(1), Ids("w\xc3\xb6rld"));
  EXPECT_EQ(result.skipped_empty, 1);
  const ShardManifest m = ReadManifest(dir / "out/shard");
  EXPECT_EQ(m.documents, 2);
  EXPECT_EQ(m.tokens, 6 + 7);
  EXPECT_EQ(m.max_token, 256);
  EXPECT_EQ(m.dtype, "uint16");
  EXPECT_EQ(m.tokenizer_checksum, "bytes-v1");
  EXPECT_EQ(m.bin.xxh3_128, HashFileHex(dir / "out/shard.bin"));
  EXPECT_EQ(m.idx.xxh3_128, HashFileHex(dir / "out/shard.idx"));
  ASSERT_EQ(m.sources.size(), 1u);
  EXPECT_EQ(m.sources[0].xxh3_128, HashFileHex(dir / "in.jsonl"));
  EXPECT_TRUE(VerifyShard(dir / "out/shard", m).empty());
}

TEST(Prepare, OtherJsonFieldAndTextSplits) {
  ScratchDir dir;
  AtomicWriteFile(dir / "in.jsonl", "{\"body\": \"x\"}\n");
  EXPECT_EQ(IndexedDataset((Prepare({dir / "in.jsonl"}, dir / "j", "file", "body"), dir / "j"))
                .Sequence(0),
            Ids("x"));
  AtomicWriteFile(dir / "in.txt", "para one\nstill one\n\n\npara two\r\nline\n");
  Prepare({dir / "in.txt"}, dir / "f", "file");
  Prepare({dir / "in.txt"}, dir / "p", "paragraph");
  Prepare({dir / "in.txt"}, dir / "l", "line");
  EXPECT_EQ(IndexedDataset(dir / "f").Sequence(0), Ids("para one\nstill one\n\n\npara two\nline"));
  IndexedDataset paragraphs(dir / "p");
  ASSERT_EQ(paragraphs.sequence_count(), 2);
  EXPECT_EQ(paragraphs.Sequence(0), Ids("para one\nstill one"));
  EXPECT_EQ(paragraphs.Sequence(1), Ids("para two\nline"));
  EXPECT_EQ(IndexedDataset(dir / "l").sequence_count(), 4);
}

TEST(Prepare, ManyDocumentsKeepTheirOrderWhenEncodedInParallel) {
  ScratchDir dir;
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "{\"text\": \"doc " + std::to_string(i) + "\"}\n";
  AtomicWriteFile(dir / "in.jsonl", text);
  Prepare({dir / "in.jsonl"}, dir / "s");
  IndexedDataset data(dir / "s");
  ASSERT_EQ(data.sequence_count(), 20000);
  for (int i : {0, 1, 4095, 4096, 12345, 19999})
    EXPECT_EQ(data.Sequence(i), Ids("doc " + std::to_string(i)));
}

void ExpectBadDataLeavesNothing(const std::string& input_text, const std::string& needle) {
  ScratchDir dir;
  AtomicWriteFile(dir / "in.jsonl", input_text);
  try {
    Prepare({dir / "in.jsonl"}, dir / "s");
    FAIL() << "expected an error for " << input_text;
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitBadData);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    EXPECT_EQ(entry.path().filename(), "in.jsonl") << "left behind: " << entry.path();
}

TEST(Prepare, BadInputIsNamedAndLeavesNothing) {
  ExpectBadDataLeavesNothing("{\"text\": \"a\"}\n{\"text\": 5}\n",
                             "in.jsonl:2: field 'text' is not a string");
  ExpectBadDataLeavesNothing("{\"text\": \"a\"}\n\n{oops\n", "in.jsonl:3: not valid JSON");
  ExpectBadDataLeavesNothing("{\"body\": \"a\"}\n", "in.jsonl:1: no field 'text'");
  ExpectBadDataLeavesNothing("\n\n{\"text\": \"\"}\n", "empty corpus");
}

TEST(Prepare, VocabularyOverflowFromTheEncoderIsBadData) {
  ScratchDir dir;
  AtomicWriteFile(dir / "in.txt", "abc");
  PrepareOptions options;
  options.inputs = {dir / "in.txt"};
  options.output_prefix = dir / "s";
  options.progress = false;
  TokenEncoder encoder = ByteEncoder(98);  // 'c' = 99 does not fit
  EXPECT_THROW(PrepareShard(options, encoder), Error);
  EXPECT_FALSE(FileExists(dir / "s.bin"));
  EXPECT_FALSE(FileExists(dir / "s.manifest.json"));
}

TEST(Prepare, RepreparingRemovesTheOldManifestFirst) {
  ScratchDir dir;
  AtomicWriteFile(dir / "in.jsonl", "{\"text\": \"a\"}\n");
  Prepare({dir / "in.jsonl"}, dir / "s");
  ASSERT_TRUE(FileExists(dir / "s.manifest.json"));
  AtomicWriteFile(dir / "in.jsonl", "{\"text\": 1}\n");
  EXPECT_THROW(Prepare({dir / "in.jsonl"}, dir / "s"), Error);
  // The old .bin/.idx may remain, but nothing vouches for them any more.
  EXPECT_FALSE(FileExists(dir / "s.manifest.json"));
}

TEST(Prepare, MissingInputIsBadData) {
  ScratchDir dir;
  try {
    Prepare({dir / "nope.txt"}, dir / "s");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitBadData);
    EXPECT_NE(std::string(e.what()).find("nope.txt"), std::string::npos);
  }
}

}  // namespace
}  // namespace crucible
