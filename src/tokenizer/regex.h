// PCRE2 (UTF + Unicode properties, JIT-compiled) with the semantics Hugging Face `tokenizers` gets
// from Oniguruma: the pattern translated (tokenizer/oniguruma.h) and the same find-all iteration.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace crucible {

// Per-thread matching state (PCRE2 match data and JIT stack). Not shareable between threads.
class RegexScratch {
 public:
  RegexScratch();
  ~RegexScratch();
  RegexScratch(const RegexScratch&) = delete;
  RegexScratch& operator=(const RegexScratch&) = delete;

 private:
  friend class Regex;
  void* match_data_;     // pcre2_match_data_8*
  void* match_context_;  // pcre2_match_context_8*
  void* jit_stack_;      // pcre2_jit_stack_8*
};

class Regex {
 public:
  // Compiles an Oniguruma-syntax pattern as tokenizer.json writes it. Throws DataError naming
  // `where` when it uses a construct the translation refuses or PCRE2 rejects it.
  // The GPT-2 and Llama 3 patterns get a hand-written matcher for ASCII text that hands over to
  // PCRE2 whenever a decision depends on a non-ASCII character (allow_fast=false: PCRE2 only).
  // translate=false compiles a pattern written for PCRE2 itself (crucible's own).
  Regex(const std::string& pattern, const std::string& where, bool allow_fast = true,
        bool translate = true);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls on_match(start, end) for each match in `text` (valid UTF-8), left to right: after a
  // match the search resumes at its end, and an empty match right where the previous one ended
  // is skipped (Oniguruma / Rust find_iter).
  template <class OnMatch>
  void ForEachMatch(std::string_view text, RegexScratch& scratch, OnMatch&& on_match) const {
    size_t search_from = 0;
    size_t last_match_end = static_cast<size_t>(-1);
    size_t start, end;
    while (search_from <= text.size()) {
      if (fast_ != FastPattern::kNone && search_from < text.size() &&
          FastMatchAt(text, search_from, &end)) {
        on_match(search_from, end);
        search_from = last_match_end = end;
        continue;
      }
      if (!Find(text, search_from, scratch, &start, &end)) break;
      if (start == end && end == last_match_end) {
        if (search_from >= text.size()) break;
        search_from += CharLength(static_cast<unsigned char>(text[search_from]));
        continue;
      }
      on_match(start, end);
      search_from = end;
      last_match_end = end;
    }
  }

  // The pattern as PCRE2 compiled it (after the Oniguruma translation).
  const std::string& pcre2_pattern() const { return translated_; }

 private:
  enum class FastPattern { kNone, kGpt2, kLlama3 };
  bool Find(std::string_view text, size_t from, RegexScratch& scratch, size_t* start,
            size_t* end) const;
  // The match that starts at text[pos] (these patterns match every character, so one does),
  // when it can be decided from ASCII bytes alone; false means "ask PCRE2".
  bool FastMatchAt(std::string_view text, size_t pos, size_t* end) const;
  static size_t CharLength(unsigned char lead) {
    return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
  }

  std::string where_;
  std::string translated_;
  void* code_ = nullptr;  // pcre2_code_8*
  FastPattern fast_ = FastPattern::kNone;
  bool jit_ = false;
};

}  // namespace crucible
