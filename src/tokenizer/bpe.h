// The BPE model of a byte-level tokenizer: turns one pre-token (raw bytes) into token ids by
// applying merges in rank order, exactly as Hugging Face `tokenizers` does (lowest rank first,
// leftmost first among equal ranks), with an optional whole-word lookup (ignore_merges) and a
// per-thread cache of words already seen.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace crucible {

// Open-addressing map from a pair of ids to (rank, merged id).
class PairTable {
 public:
  struct Entry {
    uint64_t key;
    uint32_t rank;
    uint32_t merged;
  };
  void Reserve(size_t count);
  // A later insert of the same pair replaces the earlier one (as a Rust HashMap collect does).
  void Insert(uint32_t left, uint32_t right, uint32_t rank, uint32_t merged);
  const Entry* Find(uint32_t left, uint32_t right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t key = Key(left, right);
    for (uint64_t i = Mix(key) & mask_;; i = (i + 1) & mask_) {
      const Entry& e = slots_[i];
      if (e.key == key) return &e;
      if (e.key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ULL;
  static uint64_t Key(uint32_t left, uint32_t right) {
    return (static_cast<uint64_t>(left) << 32) | right;
  }
  static uint64_t Mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
  }
  std::vector<Entry> slots_;
  uint64_t mask_ = 0;
  size_t count_ = 0;
};

// Cache of word bytes -> ids, one per thread; bounded (cleared when full).
class WordCache {
 public:
  bool Find(std::string_view word, uint64_t hash, std::vector<uint32_t>* out) const;
  void Insert(std::string_view word, uint64_t hash, const uint32_t* ids, size_t count);
  size_t size() const { return count_; }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t key_offset = kEmpty, key_length = 0, ids_offset = 0, ids_length = 0;
  };
  static constexpr uint32_t kEmpty = ~0u;
  void Rebuild(size_t slot_count);
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<uint32_t> ids_;
  size_t count_ = 0;
};

struct BpeScratch {
  WordCache cache;
  std::vector<uint32_t> symbols, ranks, merged;
  std::vector<int32_t> prev, next;
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const;
};
using TokenIdMap = std::unordered_map<std::string, uint32_t, StringHash, std::equal_to<>>;

// How a word's characters become its first symbols, as Hugging Face's BPE::merge_word does it:
// each character's token, else (byte_fallback) the <0xNN> tokens of its UTF-8 bytes when all
// exist, else the unk token (consecutive ones fused into one with fuse_unk), else nothing.
struct BpeUnits {
  // true: a word is raw bytes and byte b is spelled as the byte-level character for b (byte_ids);
  // false: a word is UTF-8 text and each character is looked up in the vocabulary as written.
  bool byte_level = true;
  bool byte_fallback = false;
  bool fuse_unk = false;
  int64_t unk_id = -1;  // -1: no unk token
  // The unk token when it is named but not in the vocabulary: encoding a character that needs it
  // is an error (DataError naming `where`), as in tokenizers.
  std::string missing_unk_token;
  std::array<int32_t, 256> fallback_ids;  // id of <0xNN>, or -1
  std::string where;
  BpeUnits() { fallback_ids.fill(-1); }
};

class BpeModel {
 public:
  // byte_ids[b]: id of the single-byte token for byte b, or -1 (such bytes are dropped, as
  // Hugging Face drops characters missing from the vocabulary when there is no unk_token).
  // merges: (left, right, merged) in rank order. whole_words: raw bytes -> id of every model
  // token (byte-level units) or the vocabulary as written (character units), used when
  // ignore_merges is set and to look characters up.
  BpeModel(const std::array<int32_t, 256>& byte_ids,
           const std::vector<std::array<uint32_t, 3>>& merges, TokenIdMap whole_words,
           bool ignore_merges, BpeUnits units = BpeUnits());

  // Appends the ids of one pre-token.
  void EncodeWord(std::string_view word, BpeScratch& scratch, std::vector<uint32_t>* out) const;
  // The merge loop alone, on symbols already in scratch.symbols (exposed for tests).
  void MergeSymbols(BpeScratch& scratch) const;

 private:
  void MergeShort(BpeScratch& scratch) const;
  void MergeLong(BpeScratch& scratch) const;
  // The first symbols of a word when units are characters or a byte can be missing.
  void Units(std::string_view word, std::vector<uint32_t>* symbols) const;

  std::array<int32_t, 256> byte_ids_;
  PairTable pairs_;
  TokenIdMap whole_words_;
  bool ignore_merges_;
  BpeUnits units_;
  bool plain_bytes_ = true;  // byte-level units, every byte in the vocabulary or dropped
};

}  // namespace crucible
