// Added tokens (special tokens and user-added words) and how Hugging Face `tokenizers` cuts them
// out of raw text before pre-tokenization: leftmost-longest matching, a match that fails its
// single_word test is dropped, lstrip/rstrip swallow the whitespace beside a match.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace crucible {

struct AddedToken {
  std::string content;
  uint32_t id = 0;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

// A piece of text: an added token (id >= 0) or plain text to pre-tokenize (id == -1).
struct TextSegment {
  int64_t id;
  size_t start, end;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);
  bool empty() const { return tokens_.empty(); }
  // Splits text[begin, end) (valid UTF-8) into segments, appended to *out; as
  // AddedVocabulary::find_matches.
  void Split(std::string_view text, size_t begin, size_t end, std::vector<TextSegment>* out) const;

 private:
  // Leftmost-longest match at or after `from`; false if none.
  bool FindLeftmostLongest(std::string_view text, size_t from, size_t* start,
                           const AddedToken** token) const;
  std::vector<AddedToken> tokens_;  // longest first
  bool first_byte_[256] = {};
};

// Unicode White_Space (Rust's char::is_whitespace / regex \s).
bool IsUnicodeWhitespace(uint32_t codepoint);

}  // namespace crucible
