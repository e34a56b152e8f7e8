#include "data/indexed_dataset.h"

#include <gtest/gtest.h>

#include <fstream>

#include "common/error.h"
#include "common/files.h"
#include "data_test_util.h"

namespace crucible {
namespace {

using testing::ScratchDir;

void WriteShard(const std::string& prefix, const std::vector<std::vector<uint32_t>>& docs,
                TokenDtype dtype) {
  IndexedDatasetWriter writer(prefix, dtype);
  for (const auto& d : docs) writer.AddDocument(d.data(), d.size(), "test");
  writer.Commit();
}

TEST(IndexedDataset, RoundTripsDocumentsInEveryIntegerDtype) {
  ScratchDir dir;
  const std::vector<std::vector<uint32_t>> docs = {{1, 2, 3}, {}, {100}, {7, 8, 9, 10, 11}};
  for (TokenDtype dtype : {TokenDtype::kUint8, TokenDtype::kUint16, TokenDtype::kInt16,
                           TokenDtype::kInt32, TokenDtype::kInt64}) {
    const std::string prefix = dir / (std::string("shard_") + DtypeName(dtype));
    WriteShard(prefix, docs, dtype);
    IndexedDataset data(prefix);
    EXPECT_EQ(data.dtype(), dtype);
    ASSERT_EQ(data.sequence_count(), 4);
    ASSERT_EQ(data.document_count(), 4);
    EXPECT_EQ(data.total_tokens(), 9);
    for (size_t i = 0; i < docs.size(); ++i) {
      EXPECT_EQ(data.document_begin(i), static_cast<int64_t>(i));
      EXPECT_EQ(data.Sequence(i), std::vector<int64_t>(docs[i].begin(), docs[i].end()));
    }
    EXPECT_EQ(data.MaxToken(), 100);
  }
}

TEST(IndexedDataset, WritesMegatronHeaderBytes) {
  ScratchDir dir;
  WriteShard(dir / "s", {{5, 6}, {7}}, TokenDtype::kUint16);
  const std::string idx = ReadFile(dir / "s.idx");
  ASSERT_EQ(idx.size(), 34u + 2 * 12 + 3 * 8);
  EXPECT_EQ(idx.substr(0, 9), std::string("MMIDIDX\0\0", 9));
  EXPECT_EQ(idx[9], 1);   // version
  EXPECT_EQ(idx[17], 8);  // uint16
  EXPECT_EQ(idx[18], 2);  // sequences
  EXPECT_EQ(idx[26], 3);  // document index entries
  EXPECT_EQ(ReadFile(dir / "s.bin"), std::string("\x05\0\x06\0\x07\0", 6));
}

TEST(IndexedDataset, VocabularyOverflowLeavesNoFiles) {
  ScratchDir dir;
  {
    IndexedDatasetWriter writer(dir / "s", TokenDtype::kUint16);
    std::vector<uint32_t> doc = {1, 70000};
    try {
      writer.AddDocument(doc.data(), doc.size(), "input.jsonl:3");
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), kExitBadData);
      EXPECT_NE(std::string(e.what()).find("input.jsonl:3"), std::string::npos);
    }
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

std::string ErrorOf(const std::string& prefix) {
  try {
    IndexedDataset data(prefix);
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitBadData) << e.what();
    return e.what();
  }
  return "";
}

TEST(IndexedDataset, RejectsDamagedIndexesNamingTheFile) {
  ScratchDir dir;
  WriteShard(dir / "s", {{1, 2, 3}, {4, 5}}, TokenDtype::kUint16);
  const std::string good = ReadFile(dir / "s.idx");
  auto with_idx = [&](const std::string& bytes) {
    AtomicWriteFile(dir / "s.idx", bytes);
    return ErrorOf(dir / "s");
  };
  EXPECT_NE(with_idx(good.substr(0, good.size() - 3)).find("truncated"), std::string::npos);
  EXPECT_NE(with_idx(good.substr(0, 20)).find("truncated"), std::string::npos);
  std::string magic = good;
  magic[0] = 'X';
  EXPECT_NE(with_idx(magic).find("wrong magic"), std::string::npos);
  std::string version = good;
  version[9] = 2;
  EXPECT_NE(with_idx(version).find("version"), std::string::npos);
  std::string dtype = good;
  dtype[17] = 4;  // int32: pointers no longer match the lengths
  EXPECT_NE(with_idx(dtype).find("dtype mismatch"), std::string::npos);
  std::string floats = good;
  floats[17] = 7;
  EXPECT_NE(with_idx(floats).find("float32"), std::string::npos);
  EXPECT_EQ(with_idx(good), "");  // the undamaged index opens
  // Truncated .bin.
  AtomicWriteFile(dir / "s.bin", ReadFile(dir / "s.bin").substr(0, 4));
  const std::string message = ErrorOf(dir / "s");
  EXPECT_NE(message.find("s.bin"), std::string::npos) << message;
}

TEST(IndexedDataset, MissingFileIsAUsageError) {
  ScratchDir dir;
  try {
    IndexedDataset data(dir / "absent");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    EXPECT_NE(std::string(e.what()).find("absent.idx"), std::string::npos);
  }
}

}  // namespace
}  // namespace crucible
