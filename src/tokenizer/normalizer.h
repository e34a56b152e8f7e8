// The normalizer of a tokenizer.json: what Hugging Face `tokenizers` does to each piece of text
// between non-normalized added tokens before anything else (NFC, NFD, NFKC, NFKD at the Unicode
// version of the crate tokenizers uses, Lowercase as Rust's char::to_lowercase, Replace with a
// string or regex, Prepend, Strip, and a Sequence of these).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"

namespace crucible {

class Normalizer {
 public:
  // From the "normalizer" value of a tokenizer.json; null (or an empty Sequence) gives an empty
  // normalizer. Throws DataError naming `where` for a type or option it does not implement.
  static std::unique_ptr<Normalizer> FromJson(const nlohmann::json& value,
                                              const std::string& where);
  ~Normalizer();

  bool empty() const { return steps_.empty(); }
  // Normalizes `text` (valid UTF-8) into *out (replaced). Returns whether the result still
  // begins where `text` began in the original (false when a step removed or merged away its
  // first character: then a Metaspace "first" does not prepend, as in tokenizers).
  bool Normalize(std::string_view text, std::string* out, RegexScratch& scratch) const;
  // "Sequence[NFKC,Lowercase]" and the like.
  std::string Describe() const;

  struct Step;

 private:
  Normalizer() = default;
  std::vector<std::unique_ptr<Step>> steps_;
};

}  // namespace crucible
