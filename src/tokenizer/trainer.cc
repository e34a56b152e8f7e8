// Byte-level BPE training: count pre-tokens, then merge the most frequent adjacent pair until the
// vocabulary is full. Pair counts are kept incrementally (only the words holding the merged pair
// are touched) and the best pair comes from a max-heap with lazy deletion, so one merge costs
// about the number of its occurrences rather than a recount of the corpus.
#include <omp.h>

#include <algorithm>
#include <queue>
#include <unordered_map>

#include "common/error.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace crucible {

using json = nlohmann::json;

namespace {

json PreTokenizerJson(const std::string& style) {
  if (style == "gpt2")
    return {{"type", "ByteLevel"},
            {"add_prefix_space", false},
            {"trim_offsets", true},
            {"use_regex", true}};
  if (style == "llama3")
    return {{"type", "Sequence"},
            {"pretokenizers", json::array({{{"type", "Split"},
                                            {"pattern", {{"Regex", kLlama3Pattern}}},
                                            {"behavior", "Isolated"},
                                            {"invert", false}},
                                           {{"type", "ByteLevel"},
                                            {"add_prefix_space", false},
                                            {"trim_offsets", true},
                                            {"use_regex", false}}})}};
  throw UsageError("unknown pre-tokenizer '" + style + "' (expected gpt2 or llama3)");
}

uint64_t PairKey(uint32_t a, uint32_t b) {
  return (static_cast<uint64_t>(a) << 32) | b;
}

}  // namespace

struct TokenizerTrainer::State {
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  AddedTokenMatcher specials;
  std::unordered_map<std::string, int64_t> word_counts;
  int64_t documents = 0;
};

TokenizerTrainer::TokenizerTrainer(const TokenizerTrainOptions& options)
    : options_(options), state_(std::make_unique<State>()) {
  if (options.vocab_size < 256 + static_cast<int64_t>(options.special_tokens.size()))
    throw UsageError("--vocab-size " + std::to_string(options.vocab_size) +
                     " is too small: a byte-level BPE needs 256 byte tokens plus " +
                     std::to_string(options.special_tokens.size()) + " special tokens");
  state_->pre_tokenizer = PreTokenizer::FromJson(PreTokenizerJson(options.pretokenizer), "train");
  std::vector<AddedToken> specials;
  for (const std::string& s : options.special_tokens) {
    if (s.empty()) throw UsageError("empty special token");
    AddedToken t;
    t.content = s;
    t.normalized = false;
    t.special = true;
    specials.push_back(t);
  }
  state_->specials = AddedTokenMatcher(specials);
}

TokenizerTrainer::~TokenizerTrainer() = default;
int64_t TokenizerTrainer::documents() const {
  return state_->documents;
}
int64_t TokenizerTrainer::unique_words() const {
  return static_cast<int64_t>(state_->word_counts.size());
}

void TokenizerTrainer::AddDocuments(const std::vector<std::string_view>& documents) {
  int threads = options_.threads > 0 ? options_.threads : omp_get_max_threads();
  std::vector<std::unordered_map<std::string, int64_t>> partial(threads);
#pragma omp parallel num_threads(threads)
  {
    auto& counts = partial[omp_get_thread_num()];
    PreTokenizerScratch scratch;
    std::vector<TextSegment> segments;
    std::string repaired;
#pragma omp for schedule(dynamic, 16)
    for (size_t i = 0; i < documents.size(); ++i) {
      std::string_view text = documents[i];
      if (!IsValidUtf8(text)) {
        repaired = RepairUtf8(text);
        text = repaired;
      }
      segments.clear();
      state_->specials.Split(text, 0, text.size(), &segments);
      for (const TextSegment& s : segments) {
        if (s.id >= 0) continue;  // special tokens are not learned from
        state_->pre_tokenizer->Split(text.substr(s.start, s.end - s.start), scratch);
        for (std::string_view piece : scratch.pieces) {
          auto it = counts.find(std::string(piece));
          if (it == counts.end())
            counts.emplace(piece, 1);
          else
            ++it->second;
        }
      }
    }
  }
  for (auto& counts : partial)
    for (auto& [word, count] : counts) state_->word_counts[word] += count;
  state_->documents += static_cast<int64_t>(documents.size());
}

Tokenizer TokenizerTrainer::Train(void (*progress)(int64_t done, int64_t target)) {
  // Words in a fixed (sorted) order; the result does not depend on it, but the run time does not
  // depend on hash-table layout either.
  std::vector<std::pair<std::string, int64_t>> words(state_->word_counts.begin(),
                                                     state_->word_counts.end());
  std::sort(words.begin(), words.end());
  std::vector<std::vector<uint32_t>> symbols(words.size());
  std::vector<std::string> token_bytes(256);
  std::unordered_map<std::string, uint32_t> bytes_to_id;
  for (int b = 0; b < 256; ++b) {
    token_bytes[b] = std::string(1, static_cast<char>(b));
    bytes_to_id[token_bytes[b]] = b;
  }

  std::unordered_map<uint64_t, int64_t> pair_counts;
  std::unordered_map<uint64_t, std::vector<uint32_t>> pair_words;
  for (size_t w = 0; w < words.size(); ++w) {
    const std::string& word = words[w].first;
    symbols[w].assign(word.begin(), word.end());
    for (auto& s : symbols[w]) s &= 0xFF;
    for (size_t i = 0; i + 1 < symbols[w].size(); ++i) {
      uint64_t key = PairKey(symbols[w][i], symbols[w][i + 1]);
      pair_counts[key] += words[w].second;
      auto& list = pair_words[key];
      if (list.empty() || list.back() != w) list.push_back(static_cast<uint32_t>(w));
    }
  }

  struct Candidate {
    int64_t count;
    uint64_t pair;
    // Max-heap on count; on equal counts the smaller (left, right) pair of ids wins.
    bool operator<(const Candidate& o) const {
      return count != o.count ? count < o.count : pair > o.pair;
    }
  };
  std::priority_queue<Candidate> queue;
  for (const auto& [pair, count] : pair_counts) queue.push({count, pair});

  const int64_t target_tokens =
      options_.vocab_size - static_cast<int64_t>(options_.special_tokens.size());
  const int64_t target_merges = target_tokens - 256;
  const int64_t min_count = std::max<int64_t>(1, options_.min_frequency);
  std::vector<std::pair<uint32_t, uint32_t>> merges;
  std::vector<uint32_t> stamp(words.size(), ~0u), merged_word;
  std::vector<uint64_t> new_pairs;
  while (static_cast<int64_t>(token_bytes.size()) < target_tokens && !queue.empty()) {
    Candidate top = queue.top();
    queue.pop();
    auto found = pair_counts.find(top.pair);
    const int64_t current = found == pair_counts.end() ? 0 : found->second;
    if (current != top.count) {  // stale: the count went down since this entry was pushed
      if (current > 0) queue.push({current, top.pair});
      continue;
    }
    if (current < min_count) break;
    const uint32_t a = static_cast<uint32_t>(top.pair >> 32), b = static_cast<uint32_t>(top.pair);
    std::string bytes = token_bytes[a] + token_bytes[b];
    uint32_t x;
    if (auto it = bytes_to_id.find(bytes); it != bytes_to_id.end()) {
      x = it->second;  // the same string reached by another merge: reuse its id
    } else {
      x = static_cast<uint32_t>(token_bytes.size());
      bytes_to_id.emplace(bytes, x);
      token_bytes.push_back(std::move(bytes));
    }
    const uint32_t merge_index = static_cast<uint32_t>(merges.size());
    merges.emplace_back(a, b);

    std::vector<uint32_t> affected = std::move(pair_words[top.pair]);
    pair_words.erase(top.pair);
    new_pairs.clear();
    auto add = [&](uint32_t left, uint32_t right, int64_t delta, uint32_t w) {
      uint64_t key = PairKey(left, right);
      int64_t& count = pair_counts[key];
      count += delta;
      if (delta > 0) {
        auto& list = pair_words[key];
        if (list.empty() || list.back() != w) list.push_back(w);
        new_pairs.push_back(key);
      }
    };
    for (uint32_t w : affected) {
      if (stamp[w] == merge_index) continue;
      stamp[w] = merge_index;
      std::vector<uint32_t>& s = symbols[w];
      const int64_t count = words[w].second;
      merged_word.clear();
      bool changed = false;
      for (size_t i = 0; i < s.size();) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          if (!merged_word.empty()) {
            add(merged_word.back(), a, -count, w);
            add(merged_word.back(), x, count, w);
          }
          if (i + 2 < s.size()) {
            add(b, s[i + 2], -count, w);
            add(x, s[i + 2], count, w);
          }
          add(a, b, -count, w);
          merged_word.push_back(x);
          i += 2;
          changed = true;
        } else {
          merged_word.push_back(s[i]);
          i += 1;
        }
      }
      if (changed) s.swap(merged_word);
    }
    pair_counts.erase(top.pair);
    std::sort(new_pairs.begin(), new_pairs.end());
    new_pairs.erase(std::unique(new_pairs.begin(), new_pairs.end()), new_pairs.end());
    for (uint64_t key : new_pairs)
      if (auto it = pair_counts.find(key); it != pair_counts.end() && it->second > 0)
        queue.push({it->second, key});
    if (progress && (merges.size() % 256 == 0)) progress(merges.size(), target_merges);
  }
  if (progress) progress(merges.size(), target_merges);

  Tokenizer::Impl::Parts parts;
  parts.name = "trained tokenizer";
  for (size_t id = 0; id < token_bytes.size(); ++id)
    parts.vocab.emplace_back(BytesToByteLevel(token_bytes[id]), static_cast<uint32_t>(id));
  for (const auto& [left, right] : merges)
    parts.merges.emplace_back(BytesToByteLevel(token_bytes[left]),
                              BytesToByteLevel(token_bytes[right]));
  parts.ignore_merges = options_.pretokenizer == "llama3";
  uint32_t next_id = static_cast<uint32_t>(token_bytes.size());
  for (const std::string& s : options_.special_tokens) {
    AddedToken t;
    t.content = s;
    t.id = next_id++;
    t.normalized = false;
    t.special = true;
    parts.added_tokens.push_back(t);
  }
  parts.pre_tokenizer_json = PreTokenizerJson(options_.pretokenizer);
  parts.decoder_json = {{"type", "ByteLevel"},
                        {"add_prefix_space", true},
                        {"trim_offsets", true},
                        {"use_regex", true}};
  parts.post_processor_json = {{"type", "ByteLevel"},
                               {"add_prefix_space", true},
                               {"trim_offsets", false},
                               {"use_regex", true}};
  return Tokenizer(Tokenizer::Impl::Build(std::move(parts)));
}

}  // namespace crucible
