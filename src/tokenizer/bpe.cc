#include "tokenizer/bpe.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <queue>

#include "common/error.h"
#include "tokenizer/utf8.h"

namespace crucible {

size_t StringHash::operator()(std::string_view s) const {
  return XXH3_64bits(s.data(), s.size());
}

void PairTable::Reserve(size_t count) {
  size_t size = 16;
  while (size < count * 2) size *= 2;
  slots_.assign(size, Entry{kEmpty, 0, 0});
  mask_ = size - 1;
  count_ = 0;
}

void PairTable::Insert(uint32_t left, uint32_t right, uint32_t rank, uint32_t merged) {
  if ((count_ + 1) * 2 > slots_.size()) {
    std::vector<Entry> old = std::move(slots_);
    Reserve(std::max<size_t>(16, old.size()));
    for (const Entry& e : old)
      if (e.key != kEmpty)
        Insert(static_cast<uint32_t>(e.key >> 32), static_cast<uint32_t>(e.key), e.rank, e.merged);
  }
  const uint64_t key = Key(left, right);
  for (uint64_t i = Mix(key) & mask_;; i = (i + 1) & mask_) {
    Entry& e = slots_[i];
    if (e.key == key) {
      e.rank = rank;
      e.merged = merged;
      return;
    }
    if (e.key == kEmpty) {
      e = Entry{key, rank, merged};
      ++count_;
      return;
    }
  }
}

namespace {
constexpr size_t kCacheMinSlots = 1 << 14;
constexpr size_t kCacheMaxSlots = 1 << 21;
constexpr size_t kCacheMaxWordBytes = 256;
}  // namespace

bool WordCache::Find(std::string_view word, uint64_t hash, std::vector<uint32_t>* out) const {
  if (slots_.empty()) return false;
  const size_t mask = slots_.size() - 1;
  for (size_t i = hash & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.key_offset == kEmpty) return false;
    if (s.hash == hash && s.key_length == word.size() &&
        std::memcmp(keys_.data() + s.key_offset, word.data(), word.size()) == 0) {
      out->insert(out->end(), ids_.begin() + s.ids_offset,
                  ids_.begin() + s.ids_offset + s.ids_length);
      return true;
    }
  }
}

void WordCache::Rebuild(size_t slot_count) {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(slot_count, Slot{});
  const size_t mask = slot_count - 1;
  for (const Slot& s : old) {
    if (s.key_offset == kEmpty) continue;
    size_t i = s.hash & mask;
    while (slots_[i].key_offset != kEmpty) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

void WordCache::Insert(std::string_view word, uint64_t hash, const uint32_t* ids, size_t count) {
  if (word.size() > kCacheMaxWordBytes) return;
  if (slots_.empty()) Rebuild(kCacheMinSlots);
  if ((count_ + 1) * 2 > slots_.size()) {
    if (slots_.size() < kCacheMaxSlots) {
      Rebuild(slots_.size() * 2);
    } else {  // full: start again rather than grow without bound
      slots_.assign(slots_.size(), Slot{});
      keys_.clear();
      ids_.clear();
      count_ = 0;
    }
  }
  const size_t mask = slots_.size() - 1;
  size_t i = hash & mask;
  while (slots_[i].key_offset != kEmpty) i = (i + 1) & mask;
  slots_[i] = Slot{hash, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(word.size()),
                   static_cast<uint32_t>(ids_.size()), static_cast<uint32_t>(count)};
  keys_.append(word);
  ids_.insert(ids_.end(), ids, ids + count);
  ++count_;
}

BpeModel::BpeModel(const std::array<int32_t, 256>& byte_ids,
                   const std::vector<std::array<uint32_t, 3>>& merges, TokenIdMap whole_words,
                   bool ignore_merges, BpeUnits units)
    : byte_ids_(byte_ids),
      whole_words_(std::move(whole_words)),
      ignore_merges_(ignore_merges),
      units_(std::move(units)) {
  pairs_.Reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank)
    pairs_.Insert(merges[rank][0], merges[rank][1], static_cast<uint32_t>(rank), merges[rank][2]);
  const bool missing_byte =
      std::any_of(byte_ids_.begin(), byte_ids_.end(), [](int32_t id) { return id < 0; });
  plain_bytes_ =
      units_.byte_level && !(missing_byte && (units_.byte_fallback || units_.unk_id >= 0 ||
                                              !units_.missing_unk_token.empty()));
}

void BpeModel::Units(std::string_view word, std::vector<uint32_t>* symbols) const {
  bool pending_unk = false;
  auto unit = [&](std::string_view spelling, int64_t id) {
    if (id >= 0) {
      if (pending_unk) symbols->push_back(static_cast<uint32_t>(units_.unk_id));
      pending_unk = false;
      symbols->push_back(static_cast<uint32_t>(id));
      return;
    }
    if (units_.byte_fallback) {
      bool all = true;
      for (unsigned char b : spelling) all = all && units_.fallback_ids[b] >= 0;
      if (all) {  // a pending unk stays pending, as in tokenizers
        for (unsigned char b : spelling)
          symbols->push_back(static_cast<uint32_t>(units_.fallback_ids[b]));
        return;
      }
    }
    if (!units_.missing_unk_token.empty())
      throw DataError(units_.where + ": unk_token \"" + units_.missing_unk_token +
                      "\" is not in the vocabulary, and the text holds a character that needs it");
    if (units_.unk_id < 0) return;  // dropped, as tokenizers does without an unk token
    if (pending_unk && !units_.fuse_unk) symbols->push_back(static_cast<uint32_t>(units_.unk_id));
    pending_unk = true;
  };
  if (units_.byte_level) {
    std::string spelling;
    for (unsigned char b : word) {
      spelling.clear();
      AppendUtf8(ByteToCodepoint(b), &spelling);
      unit(spelling, byte_ids_[b]);
    }
  } else {
    for (size_t pos = 0; pos < word.size();) {
      const size_t start = pos;
      NextCodepoint(word, &pos);
      const std::string_view c = word.substr(start, pos - start);
      auto it = whole_words_.find(c);
      unit(c, it == whole_words_.end() ? int64_t{-1} : int64_t{it->second});
    }
  }
  if (pending_unk) symbols->push_back(static_cast<uint32_t>(units_.unk_id));
}

void BpeModel::EncodeWord(std::string_view word, BpeScratch& scratch,
                          std::vector<uint32_t>* out) const {
  if (word.empty()) return;
  if (word.size() == 1 && plain_bytes_) {  // a single byte is its own token under either path
    int32_t id = byte_ids_[static_cast<unsigned char>(word[0])];
    if (id >= 0) out->push_back(static_cast<uint32_t>(id));
    return;
  }
  // One cache probe serves both paths: whole-word lookups (ignore_merges) and merge results.
  const uint64_t hash = XXH3_64bits(word.data(), word.size());
  if (scratch.cache.Find(word, hash, out)) return;
  scratch.symbols.clear();
  auto whole = ignore_merges_ ? whole_words_.find(word) : whole_words_.end();
  if (whole != whole_words_.end()) {
    scratch.symbols.push_back(whole->second);
  } else {
    if (plain_bytes_) {
      for (unsigned char b : word)
        if (byte_ids_[b] >= 0) scratch.symbols.push_back(static_cast<uint32_t>(byte_ids_[b]));
    } else {
      Units(word, &scratch.symbols);
    }
    MergeSymbols(scratch);
  }
  scratch.cache.Insert(word, hash, scratch.symbols.data(), scratch.symbols.size());
  out->insert(out->end(), scratch.symbols.begin(), scratch.symbols.end());
}

void BpeModel::MergeSymbols(BpeScratch& scratch) const {
  if (scratch.symbols.size() < 2) return;
  if (scratch.symbols.size() <= 64)
    MergeShort(scratch);
  else
    MergeLong(scratch);
}

// Quadratic in the worst case but tight for the short words that dominate text: one rank per
// adjacent pair, merge the lowest (leftmost on ties), refresh the two neighbouring ranks.
void BpeModel::MergeShort(BpeScratch& scratch) const {
  constexpr uint32_t kNone = ~0u;
  auto& symbols = scratch.symbols;
  auto& ranks = scratch.ranks;
  auto& merged = scratch.merged;
  size_t n = symbols.size();
  ranks.resize(n);
  merged.resize(n);
  auto refresh = [&](size_t i) {
    const PairTable::Entry* e = pairs_.Find(symbols[i], symbols[i + 1]);
    ranks[i] = e ? e->rank : kNone;
    merged[i] = e ? e->merged : 0;
  };
  for (size_t i = 0; i + 1 < n; ++i) refresh(i);
  while (n > 1) {
    size_t best = 0;
    uint32_t best_rank = ranks[0];
    for (size_t i = 1; i + 1 < n; ++i)
      if (ranks[i] < best_rank) {
        best_rank = ranks[i];
        best = i;
      }
    if (best_rank == kNone) break;
    symbols[best] = merged[best];
    symbols.erase(symbols.begin() + best + 1);
    ranks.erase(ranks.begin() + best + 1);
    merged.erase(merged.begin() + best + 1);
    --n;
    if (best + 1 < n)
      refresh(best);
    else
      ranks[best] = kNone;
    if (best > 0) refresh(best - 1);
  }
}

// Hugging Face's algorithm for long words: a heap of (rank, position) over a linked list of
// symbols; stale heap entries are recognised and skipped.
void BpeModel::MergeLong(BpeScratch& scratch) const {
  auto& symbols = scratch.symbols;
  auto& prev = scratch.prev;
  auto& next = scratch.next;
  const int32_t n = static_cast<int32_t>(symbols.size());
  prev.resize(n);
  next.resize(n);
  std::vector<char> alive(n, 1);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    uint32_t merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  for (int32_t i = 0; i + 1 < n; ++i)
    if (const PairTable::Entry* e = pairs_.Find(symbols[i], symbols[i + 1]))
      queue.push({e->rank, i, e->merged});
  while (!queue.empty()) {
    Candidate top = queue.top();
    queue.pop();
    if (!alive[top.pos] || next[top.pos] < 0) continue;
    const int32_t right = next[top.pos];
    const PairTable::Entry* current = pairs_.Find(symbols[top.pos], symbols[right]);
    if (!current || current->merged != top.merged) continue;  // stale entry
    symbols[top.pos] = top.merged;
    alive[right] = 0;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = top.pos;
    if (prev[top.pos] >= 0)
      if (const PairTable::Entry* e = pairs_.Find(symbols[prev[top.pos]], symbols[top.pos]))
        queue.push({e->rank, prev[top.pos], e->merged});
    if (next[top.pos] >= 0)
      if (const PairTable::Entry* e = pairs_.Find(symbols[top.pos], symbols[next[top.pos]]))
        queue.push({e->rank, top.pos, e->merged});
  }
  size_t out = 0;
  for (int32_t i = 0; i >= 0 && i < n; i = next[i]) symbols[out++] = symbols[i];
  symbols.resize(out);
}

}  // namespace crucible
