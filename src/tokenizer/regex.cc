#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "common/error.h"
#include "tokenizer/oniguruma.h"
#include "tokenizer/tokenizer.h"

namespace crucible {

RegexScratch::RegexScratch() {
  match_data_ = pcre2_match_data_create(1, nullptr);
  match_context_ = pcre2_match_context_create(nullptr);
  jit_stack_ = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  if (jit_stack_)
    pcre2_jit_stack_assign(static_cast<pcre2_match_context*>(match_context_), nullptr, jit_stack_);
}

RegexScratch::~RegexScratch() {
  pcre2_match_data_free(static_cast<pcre2_match_data*>(match_data_));
  pcre2_match_context_free(static_cast<pcre2_match_context*>(match_context_));
  if (jit_stack_) pcre2_jit_stack_free(static_cast<pcre2_jit_stack*>(jit_stack_));
}

Regex::Regex(const std::string& pattern, const std::string& where, bool allow_fast, bool translate)
    : where_(where), translated_(translate ? TranslateOnigurumaPattern(pattern, where) : pattern) {
  if (allow_fast && pattern == kGpt2Pattern) fast_ = FastPattern::kGpt2;
  if (allow_fast && pattern == kLlama3Pattern) fast_ = FastPattern::kLlama3;
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated_.data()), translated_.size(),
                    PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (!code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    throw DataError(where + ": unsupported pre-tokenizer regex '" + pattern +
                    "' (PCRE2: " + reinterpret_cast<const char*>(message) + " at offset " +
                    std::to_string(error_offset) + ")");
  }
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  code_ = code;
}

Regex::~Regex() {
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

bool Regex::Find(std::string_view text, size_t from, RegexScratch& scratch, size_t* start,
                 size_t* end) const {
  auto* code = static_cast<pcre2_code*>(code_);
  auto* data = static_cast<pcre2_match_data*>(scratch.match_data_);
  auto* context = static_cast<pcre2_match_context*>(scratch.match_context_);
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // The caller guarantees valid UTF-8; PCRE2's own check would rescan the whole text per call.
  int rc =
      jit_ ? pcre2_jit_match(code, subject, text.size(), from, PCRE2_NO_UTF_CHECK, data, context)
           : pcre2_match(code, subject, text.size(), from, PCRE2_NO_UTF_CHECK, data, context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(rc, message, sizeof(message));
    throw DataError(where_ + ": pre-tokenizer regex failed on the input (PCRE2: " +
                    reinterpret_cast<const char*>(message) + ")");
  }
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
  *start = ovector[0];
  *end = ovector[1];
  return true;
}

namespace {

// ASCII classes as the patterns see them: \p{L}, \p{N}, \s, and the rest ([^\s\p{L}\p{N}]).
inline bool IsAsciiLetter(unsigned char c) {
  return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
}
inline bool IsAsciiDigit(unsigned char c) {
  return c >= '0' && c <= '9';
}
inline bool IsAsciiSpace(unsigned char c) {
  return c == ' ' || (c >= '\t' && c <= '\r');
}
inline bool IsAsciiOther(unsigned char c) {
  return c < 0x80 && !IsAsciiLetter(c) && !IsAsciiDigit(c) && !IsAsciiSpace(c);
}
inline bool IsNewline(unsigned char c) {
  return c == '\n' || c == '\r';
}

}  // namespace

bool Regex::FastMatchAt(std::string_view text, size_t pos, size_t* end) const {
  const auto* t = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  const unsigned char c = t[pos];
  if (c >= 0x80) return false;
  // Extends a run of `accept` characters from j; false if a non-ASCII character ends it (it
  // might belong to the run).
  auto run = [&](size_t j, auto accept, size_t* out) {
    while (j < n && t[j] < 0x80 && accept(t[j])) ++j;
    if (j < n && t[j] >= 0x80) return false;
    *out = j;
    return true;
  };
  const bool llama3 = fast_ == FastPattern::kLlama3;

  // Contractions: 's 't 're 've 'm 'll 'd (Llama 3: any case; 'ſ folds to 's, so non-ASCII after
  // the apostrophe goes to PCRE2).
  if (c == '\'' && pos + 1 < n) {
    unsigned char d = t[pos + 1];
    if (llama3 && d >= 0x80) return false;
    if (llama3) d = static_cast<unsigned char>(d | 0x20);
    if (d == 's' || d == 't' || d == 'm' || d == 'd') {
      *end = pos + 2;
      return true;
    }
    if (pos + 2 < n && (d == 'r' || d == 'v' || d == 'l')) {
      unsigned char e = t[pos + 2];
      if (llama3 && e < 0x80) e = static_cast<unsigned char>(e | 0x20);
      if ((d == 'l' && e == 'l') || (d != 'l' && e == 'e')) {
        *end = pos + 3;
        return true;
      }
    }
  }
  const unsigned char next = pos + 1 < n ? t[pos + 1] : 0;
  const bool has_next = pos + 1 < n;
  if (llama3) {
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (IsAsciiLetter(c)) return run(pos + 1, IsAsciiLetter, end);
    if (!IsNewline(c) && !IsAsciiDigit(c) && has_next) {
      if (next >= 0x80) return false;
      if (IsAsciiLetter(next)) return run(pos + 2, IsAsciiLetter, end);
    }
    // \p{N}{1,3}
    if (IsAsciiDigit(c)) {
      size_t j = pos + 1;
      while (j < n && j < pos + 3 && IsAsciiDigit(t[j])) ++j;
      if (j < n && j < pos + 3 && t[j] >= 0x80) return false;
      *end = j;
      return true;
    }
    // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    size_t start = SIZE_MAX;
    if (c == ' ' && has_next && IsAsciiOther(next)) start = pos + 1;
    if (IsAsciiOther(c)) start = pos;
    if (start != SIZE_MAX) {
      size_t j;
      if (!run(start, IsAsciiOther, &j)) return false;
      while (j < n && IsNewline(t[j])) ++j;
      *end = j;
      return true;
    }
    // Whitespace: \s*[\r\n]+, then \s+(?!\S), then \s+.
    size_t j;
    if (!run(pos, IsAsciiSpace, &j)) return false;
    for (size_t k = j; k > pos; --k)
      if (IsNewline(t[k - 1])) {
        *end = k;
        return true;
      }
    *end = (j < n && j - pos >= 2) ? j - 1 : j;
    return true;
  }
  // GPT-2: ' ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+'
  size_t start = pos;
  if (c == ' ' && has_next) {
    if (next >= 0x80) return false;
    if (!IsAsciiSpace(next)) start = pos + 1;
  }
  const unsigned char first = t[start];
  if (IsAsciiLetter(first)) return run(start + 1, IsAsciiLetter, end);
  if (IsAsciiDigit(first)) return run(start + 1, IsAsciiDigit, end);
  if (IsAsciiOther(first)) return run(start + 1, IsAsciiOther, end);
  size_t j;
  if (!run(pos, IsAsciiSpace, &j)) return false;
  *end = (j < n && j - pos >= 2) ? j - 1 : j;
  return true;
}

}  // namespace crucible
