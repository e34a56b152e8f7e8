// The decoder of a tokenizer.json: what Hugging Face `tokenizers` does to the token strings of
// decoded ids before joining them (Decoder::decode_chain, then concatenation). ByteLevel (token
// characters back to bytes, lossy UTF-8), Replace (a string or regex pattern in each token),
// ByteFallback (runs of <0xNN> tokens back to bytes: their UTF-8, or one U+FFFD per byte when
// invalid), Fuse (one string), Strip (up to `start`/`stop` copies of a character at each end of
// each token), Metaspace (the replacement character back to spaces, dropped in the first token
// unless prepend_scheme is never), and Sequence of these; none joins the tokens with spaces.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace crucible {

class Decoder {
 public:
  // From the "decoder" value of a tokenizer.json (null: none). Throws DataError naming `where`
  // for a type or option it does not implement.
  static std::unique_ptr<Decoder> FromJson(const nlohmann::json& value, const std::string& where);
  ~Decoder();

  // The decoded text of these token strings (as tokenizer.json spells them), valid UTF-8.
  std::string Decode(std::vector<std::string> tokens) const;
  // True when the decoder is ByteLevel alone (or a Sequence of ByteLevel only): decoding is then
  // the concatenation of each token's bytes, which Tokenizer precomputes.
  bool byte_level_only() const;
  bool empty() const { return steps_.empty(); }

  struct Step;

 private:
  Decoder() = default;
  std::vector<std::unique_ptr<Step>> steps_;
};

}  // namespace crucible
