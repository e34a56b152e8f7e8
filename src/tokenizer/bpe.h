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

class BpeModel {
 public:
  // byte_ids[b]: id of the single-byte token for byte b, or -1 (such bytes are dropped, as
  // Hugging Face drops characters missing from the vocabulary when there is no unk_token).
  // merges: (left, right, merged) in rank order. whole_words: raw bytes -> id of every model
  // token, used when ignore_merges is set.
  BpeModel(const std::array<int32_t, 256>& byte_ids,
           const std::vector<std::array<uint32_t, 3>>& merges, TokenIdMap whole_words,
           bool ignore_merges);

  // Appends the ids of one pre-token.
  void EncodeWord(std::string_view word, BpeScratch& scratch, std::vector<uint32_t>* out) const;
  // The merge loop alone, on symbols already in scratch.symbols (exposed for tests).
  void MergeSymbols(BpeScratch& scratch) const;

 private:
  void MergeShort(BpeScratch& scratch) const;
  void MergeLong(BpeScratch& scratch) const;

  std::array<int32_t, 256> byte_ids_;
  PairTable pairs_;
  TokenIdMap whole_words_;
  bool ignore_merges_;
};

}  // namespace crucible
