// The pre-tokenizer of a tokenizer.json: the steps Hugging Face `tokenizers` runs on each piece of
// text between added tokens before BPE (Split with a regex or string, ByteLevel, Digits,
// Metaspace, and a Sequence of these). Pieces are raw UTF-8 bytes: the byte-level character
// mapping is implicit.
#pragma once

#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"

namespace crucible {

// Reusable per-thread buffers for PreTokenizer::Split.
struct PreTokenizerScratch {
  RegexScratch regex;
  std::vector<std::string_view> pieces, next;
  std::deque<std::string> arena;  // pieces that got a prefix space or a Metaspace rewrite
  // Whether pieces[0] starts where the text given to Split started in the original input
  // (what Metaspace's prepend_scheme "first" asks of its piece).
  bool first_at_origin = true;
};

class PreTokenizer {
 public:
  // From the "pre_tokenizer" value of a tokenizer.json (null: no splitting). Throws DataError
  // naming `where` for a type or option it does not implement.
  static std::unique_ptr<PreTokenizer> FromJson(const nlohmann::json& value,
                                                const std::string& where);
  ~PreTokenizer();

  // Appends the pre-tokens of `text` (valid UTF-8) to scratch.pieces (cleared first). The views
  // point into `text` or into scratch.arena, valid until the next call with this scratch.
  // `at_origin`: the text starts at the beginning of the original input (no added token, and
  // nothing a normalizer removed, before it).
  void Split(std::string_view text, PreTokenizerScratch& scratch, bool at_origin = true) const;
  // "Sequence[Split(Regex),ByteLevel]" and the like, for `tokenizer info`.
  std::string Describe() const;
  // True when the last step is a ByteLevel and no other step is: the layout under which
  // splitting raw bytes is the same as Hugging Face splitting byte-level characters.
  bool byte_level_last() const;
  bool has_byte_level() const;
  // True when a Metaspace with prepend_scheme "first" comes after another step (which may split
  // before it: whether a later piece starts the original text then depends on alignments that a
  // normalizer can move).
  bool metaspace_first_after_other_step() const;

  struct Step;

 private:
  PreTokenizer() = default;
  std::vector<std::unique_ptr<Step>> steps_;
};

}  // namespace crucible
