// Megatron MMapIndexedDataset: the .bin/.idx pair that Megatron-LM, megatron-core and
// blendcorpus read. The .bin is the token ids of every sequence back to back; the .idx is
//
//   magic "MMIDIDX\0\0" (9 bytes) | version u64 = 1 | dtype code u8
//   sequence_count u64 | document_count u64 (entries of the document index, so documents + 1)
//   sequence lengths int32[sequence_count] (in tokens)
//   sequence pointers int64[sequence_count] (byte offsets into the .bin)
//   document index int64[document_count] (first sequence of each document, then sequence_count)
//
// all little-endian, no padding. Crucible writes one sequence per document (the document's
// tokens followed by EOS), as Megatron's preprocess_data.py does with --append-eod.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/files.h"
#include "common/hash.h"

namespace crucible {

// Megatron's DType codes.
enum class TokenDtype : uint8_t {
  kUint8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUint16 = 8,
};

// Bytes per element; 0 for an unknown code.
int DtypeSize(uint8_t code);
// "uint16", "int32", ...; "" for an unknown code.
const char* DtypeName(TokenDtype dtype);
// Parses a DtypeName; returns false when unknown.
bool ParseDtype(const std::string& name, TokenDtype* dtype);
// The dtype Megatron picks for a vocabulary: uint16 below 65500 ids, int32 otherwise.
TokenDtype OptimalDtype(int64_t vocab_size);
// Largest token id a dtype can hold (floats are not token dtypes: 0).
int64_t DtypeMaxToken(TokenDtype dtype);

std::string BinPath(const std::string& prefix);
std::string IdxPath(const std::string& prefix);

// The parsed .idx, pointing into memory that the caller keeps alive. The arrays start at byte
// 34 and are not aligned, so they are read through memcpy.
struct IndexView {
  TokenDtype dtype = TokenDtype::kUint16;
  int64_t sequence_count = 0;
  int64_t document_count = 0;          // documents, i.e. document index entries - 1
  const uint8_t* lengths = nullptr;    // int32[sequence_count]
  const uint8_t* pointers = nullptr;   // int64[sequence_count]
  const uint8_t* documents = nullptr;  // int64[document_count + 1]
  int64_t total_tokens = 0;
  int64_t expected_bin_bytes = 0;

  int64_t length(int64_t sequence) const;
  int64_t pointer(int64_t sequence) const;
  int64_t document_begin(int64_t document) const;
};

// Validates an .idx image completely: magic, version, dtype, counts against the size, lengths
// non-negative, pointers contiguous from 0, document index non-decreasing from 0 to
// sequence_count. Throws DataError naming `name` and what is wrong. Never reads outside
// [data, data + size).
IndexView ParseIndex(const uint8_t* data, size_t size, const std::string& name);

// A read-only, memory-mapped .bin/.idx pair.
class IndexedDataset {
 public:
  // Maps prefix.idx and prefix.bin and checks them against each other. Throws UsageError when a
  // file is missing, DataError when malformed (the message names the file).
  explicit IndexedDataset(const std::string& prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  TokenDtype dtype() const { return index_.dtype; }
  int64_t sequence_count() const { return index_.sequence_count; }
  int64_t document_count() const { return index_.document_count; }
  int64_t total_tokens() const { return index_.total_tokens; }
  int64_t sequence_length(int64_t sequence) const { return index_.length(sequence); }
  // Document d spans sequences [document_begin(d), document_begin(d + 1)).
  int64_t document_begin(int64_t document) const { return index_.document_begin(document); }

  // Copies `count` tokens of `sequence` starting at `offset` into out; the caller keeps the
  // range inside the sequence and has checked the ids against the vocabulary (MaxToken).
  void ReadTokens(int64_t sequence, int64_t offset, int64_t count, int32_t* out) const;
  std::vector<int64_t> Sequence(int64_t sequence) const;
  // Largest token id in the .bin (a full scan).
  int64_t MaxToken() const;

 private:
  std::string prefix_;
  const uint8_t* idx_map_ = nullptr;
  size_t idx_size_ = 0;
  const uint8_t* bin_map_ = nullptr;
  size_t bin_size_ = 0;
  IndexView index_;
};

// Writes a .bin/.idx pair under temporary names; Commit() renames both into place. Destroying
// an uncommitted writer removes the temporary files, so a failed or interrupted write leaves
// nothing with the final names.
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(const std::string& prefix, TokenDtype dtype);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // Appends one document made of one sequence. Throws DataError when a token does not fit the
  // dtype (`where` names the input in the message).
  void AddDocument(const uint32_t* tokens, size_t count, const std::string& where);
  int64_t documents() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t tokens() const { return tokens_; }
  // Writes the .idx, fsyncs both files and renames them to prefix.bin / prefix.idx.
  void Commit();
  // After Commit: xxh3-128 (hex) and size of what was written, hashed on the way out.
  const std::string& bin_checksum() const { return bin_checksum_; }
  const std::string& idx_checksum() const { return idx_checksum_; }
  int64_t bin_bytes() const { return bin_bytes_; }
  int64_t idx_bytes() const { return idx_bytes_; }

 private:
  void Flush();
  std::string prefix_;
  TokenDtype dtype_;
  int width_;
  int64_t max_token_;
  std::unique_ptr<OutputFile> bin_;  // replaced or written through (common/files.h)
  std::vector<uint8_t> buffer_;
  StreamHasher bin_hasher_;
  std::string bin_checksum_, idx_checksum_;
  int64_t bin_bytes_ = 0, idx_bytes_ = 0;
  std::vector<int32_t> lengths_;
  int64_t tokens_ = 0;
};

}  // namespace crucible
