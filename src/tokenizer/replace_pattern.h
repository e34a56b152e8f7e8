// tokenizers' Replace, shared by the normalizer and the decoder of that name: a pattern (a
// literal string or an Oniguruma regex) and the content each match becomes.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "tokenizer/regex.h"

namespace crucible {

class ReplacePattern {
 public:
  // Reads {"pattern": {"String": s} | {"Regex": r}, "content": c}. `what` names the step in the
  // errors ("Replace normalizer", "Replace decoder"); DataError naming `where` on a bad value or
  // an empty String pattern (tokenizers' behaviour for one is unsupported here).
  ReplacePattern(const nlohmann::json& value, const std::string& where, const std::string& what);

  // Calls on_match(start, end) for each match in `text`, left to right, non-overlapping.
  template <class OnMatch>
  void ForEachMatch(std::string_view text, RegexScratch& scratch, OnMatch&& on_match) const {
    if (regex_) {
      regex_->ForEachMatch(text, scratch, on_match);
      return;
    }
    for (size_t at = text.find(literal_); at != std::string_view::npos;
         at = text.find(literal_, at + literal_.size()))
      on_match(at, at + literal_.size());
  }
  const std::string& content() const { return content_; }
  bool is_regex() const { return regex_ != nullptr; }

 private:
  std::string literal_, content_;
  std::unique_ptr<Regex> regex_;
};

}  // namespace crucible
