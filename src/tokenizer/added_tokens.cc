#include "tokenizer/added_tokens.h"

#include <algorithm>
#include <cctype>

#include "tokenizer/oniguruma.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace crucible {
namespace {

// Rust regex's Unicode \w (what `tokenizers` checks around a single_word token), as measured.
bool IsWordCodepoint(std::string_view text, size_t start, size_t end) {
  if (end - start == 1) {
    unsigned char c = static_cast<unsigned char>(text[start]);
    return std::isalnum(c) || c == '_';
  }
  static const Regex word(
      [] {
        std::string pattern = "^";
        pattern += Pcre2WordClass();
        return pattern += "$";
      }(),
      "\\w", /*allow_fast=*/false, /*translate=*/false);
  thread_local RegexScratch scratch;
  bool found = false;
  word.ForEachMatch(text.substr(start, end - start), scratch,
                    [&](size_t, size_t) { found = true; });
  return found;
}

size_t PreviousCharStart(std::string_view text, size_t pos) {
  do --pos;
  while (pos > 0 && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80);
  return pos;
}

}  // namespace

bool IsUnicodeWhitespace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  std::stable_sort(tokens_.begin(), tokens_.end(), [](const AddedToken& a, const AddedToken& b) {
    return a.content.size() > b.content.size();
  });
  for (const AddedToken& t : tokens_) first_byte_[static_cast<unsigned char>(t.content[0])] = true;
}

bool AddedTokenMatcher::FindLeftmostLongest(std::string_view text, size_t from, size_t* start,
                                            const AddedToken** token) const {
  for (size_t pos = from; pos < text.size(); ++pos) {
    if (!first_byte_[static_cast<unsigned char>(text[pos])]) continue;
    std::string_view rest = text.substr(pos);
    for (const AddedToken& t : tokens_) {
      if (rest.size() >= t.content.size() && rest.compare(0, t.content.size(), t.content) == 0) {
        *start = pos;
        *token = &t;
        return true;
      }
    }
  }
  return false;
}

void AddedTokenMatcher::Split(std::string_view full_text, size_t begin, size_t end,
                              std::vector<TextSegment>* out) const {
  std::string_view text = full_text.substr(begin, end - begin);
  size_t start_offset = 0, search_from = 0, match_start = 0;
  const AddedToken* token = nullptr;
  while (FindLeftmostLongest(text, search_from, &match_start, &token)) {
    size_t start = match_start, stop = match_start + token->content.size();
    search_from = stop;
    if (token->single_word) {
      bool start_space = start == 0;
      if (!start_space) {
        size_t p = PreviousCharStart(text, start);
        start_space = !IsWordCodepoint(text, p, start);
      }
      bool stop_space = stop == text.size();
      if (!stop_space) {
        size_t q = stop;
        NextCodepoint(text, &q);
        stop_space = !IsWordCodepoint(text, stop, q);
      }
      if (!start_space || !stop_space) continue;
    }
    if (token->lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        size_t p = PreviousCharStart(text, new_start), q = p;
        if (!IsUnicodeWhitespace(NextCodepoint(text, &q))) break;
        new_start = p;
      }
      start = std::max(new_start, start_offset);
    }
    if (token->rstrip) {
      while (stop < text.size()) {
        size_t q = stop;
        if (!IsUnicodeWhitespace(NextCodepoint(text, &q))) break;
        stop = q;
      }
    }
    if (start < start_offset) continue;  // an rstrip already swallowed this match's start
    if (start_offset < start) out->push_back({-1, begin + start_offset, begin + start});
    out->push_back({static_cast<int64_t>(token->id), begin + start, begin + stop});
    start_offset = stop;
  }
  if (start_offset < text.size()) out->push_back({-1, begin + start_offset, begin + text.size()});
}

}  // namespace crucible
