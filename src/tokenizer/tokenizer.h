// Byte-level BPE tokenizer, compatible with Hugging Face `tokenizers` tokenizer.json files
// (GPT-2 and Llama-3 style): train, encode, decode, load and save.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace crucible {

class Tokenizer {
 public:
  // Loads a Hugging Face tokenizer.json (byte-level BPE). Throws UsageError if missing,
  // DataError if malformed or of an unsupported model type.
  static Tokenizer Load(const std::string& path);

  // Encodes text without adding special tokens (special tokens written in the text are
  // recognised as such, as Hugging Face does for added tokens).
  std::vector<uint32_t> Encode(std::string_view text) const;
  std::string Decode(const std::vector<uint32_t>& ids) const;

  int64_t vocab_size() const;  // including added/special tokens
  // Id of <|end_of_text|> (or the tokenizer's EOS-like special token); -1 if none.
  int64_t eos_id() const;
  int64_t bos_id() const;
  // Content checksum of the tokenizer (vocab, merges, pre-tokenizer, special tokens), hex.
  std::string Checksum() const;

  // Implementation detail, defined in tokenizer.cc.
  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace crucible
