// BPE tokenizer, compatible with Hugging Face `tokenizers` tokenizer.json files: byte-level
// (GPT-2 and Llama-3 style) and over characters (SentencePiece style: Llama 2, Mistral, Gemma,
// with byte_fallback and unk_token): train (byte-level), encode, decode, load and save.
//
// Encoding follows the `tokenizers` pipeline exactly: non-normalized added tokens (special or
// not) are cut out of the raw text first (leftmost-longest, honouring lstrip/rstrip/single_word),
// each remaining piece is normalized (NFC/NFKC/Lowercase/Replace/..., tokenizer/normalizer.h) and
// the normalized added tokens cut from it, the pieces go through the pre-tokenizer (Split
// regexes, ByteLevel, Digits, Metaspace, in a Sequence), and each pre-token is merged by BPE rank
// (or looked up whole when the model sets ignore_merges). Decoding runs the decoder chain
// (tokenizer/decoder.h). Input that is not valid UTF-8 is read as Python's
// bytes.decode("utf-8", "replace") reads it.
// A Tokenizer is immutable and cheap to copy; all methods are safe to call from many threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace crucible {

class Tokenizer {
 public:
  // Loads a Hugging Face tokenizer.json (a BPE). Throws UsageError if missing,
  // DataError if malformed or of an unsupported model type (the message names the file and the
  // feature).
  static Tokenizer Load(const std::string& path);
  // The same from the contents of a tokenizer.json; `name` is used in error messages.
  static Tokenizer FromJson(std::string_view json_text, const std::string& name);

  // Encodes text without adding special tokens (special tokens written in the text are
  // recognised as such, as Hugging Face does for added tokens).
  std::vector<uint32_t> Encode(std::string_view text) const;
  // Encodes many documents on `threads` OpenMP threads (0: all). The result is identical to
  // calling Encode on each document, whatever the thread count.
  std::vector<std::vector<uint32_t>> EncodeBatch(const std::vector<std::string_view>& documents,
                                                 int threads = 0) const;
  std::string Decode(const std::vector<uint32_t>& ids) const;
  // The pieces BPE sees (pre-tokens as raw bytes, and added tokens as written): for debugging
  // and for comparing pre-tokenization with Hugging Face's pre_tokenize_str.
  std::vector<std::string> PreTokenize(std::string_view text) const;
  // As Hugging Face's decode(ids, skip_special_tokens): unknown ids are skipped, bytes that do
  // not form valid UTF-8 become U+FFFD.
  std::string Decode(const std::vector<uint32_t>& ids, bool skip_special_tokens) const;

  int64_t vocab_size() const;  // including added/special tokens
  // The end- and beginning-of-text tokens, found by name (FindSpecialTokens below); -1 if none.
  int64_t eos_id() const;
  int64_t bos_id() const;
  // The token that ends documents: the one named `token` (an added token, or a vocabulary entry
  // as tokenizer.json spells it; UsageError naming the file and the token if there is none), or
  // eos_id() when `token` is empty.
  int64_t EndOfTextId(const std::string& token) const;
  // Content checksum of the tokenizer (vocab, merges, pre-tokenizer, special tokens), hex.
  std::string Checksum() const;

  // Id of a token (model vocabulary or added token) written as in tokenizer.json; -1 if none.
  int64_t TokenToId(const std::string& token) const;
  // Token string of an id as written in tokenizer.json; empty if the id is unknown.
  std::string IdToToken(uint32_t id) const;
  // Added tokens marked special, in id order.
  std::vector<std::pair<std::string, uint32_t>> SpecialTokens() const;
  // "BPE", the pre-tokenizer in one line ("Sequence[Split(Regex),ByteLevel]"), and merges count.
  std::string Describe() const;
  int64_t merges_count() const;

  // Serialises as a Hugging Face tokenizer.json (merges written as "a b" strings, readable by
  // every `tokenizers` version).
  std::string ToJson() const;
  // Writes ToJson() atomically (temporary file, fsync, rename).
  void Save(const std::string& path) const;

  // Implementation detail, defined in tokenizer.cc.
  struct Impl;
  Tokenizer() = default;  // empty: only assignment is valid on it
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<const Impl> impl_;
};

// The end- and beginning-of-text tokens among a tokenizer's added tokens (content, id), by the
// names released tokenizers give them, first name first: EOS <|end_of_text|> <|endoftext|> </s>
// <eos> <｜end▁of▁sentence｜> (DeepSeek) <|eot_id|> <|im_end|>; BOS <|begin_of_text|> <s> <bos>
// <|startoftext|> <｜begin▁of▁sentence｜> <|endoftext|> (GPT-2's is both). -1 for none. The one
// detector: Tokenizer and the Hugging Face export (which also reads tokenizers crucible cannot
// encode with) both use it.
struct SpecialTokenIds {
  int64_t bos = -1, eos = -1;
};
SpecialTokenIds FindSpecialTokens(const std::vector<std::pair<std::string, int64_t>>& added_tokens);

// Trains a byte-level BPE tokenizer: the 256 byte tokens, then merges of the most frequent
// adjacent pair (ties broken by the smaller pair of ids, so the result is deterministic and
// independent of the thread count), then the special tokens as added tokens.
struct TokenizerTrainOptions {
  int64_t vocab_size = 8192;  // total, special tokens included
  std::vector<std::string> special_tokens = {"<|begin_of_text|>", "<|end_of_text|>"};
  std::string pretokenizer = "llama3";  // "llama3" or "gpt2"
  int64_t min_frequency = 2;            // a pair seen fewer times is never merged
  int threads = 0;                      // 0: all OpenMP threads
};

class TokenizerTrainer {
 public:
  explicit TokenizerTrainer(const TokenizerTrainOptions& options);
  ~TokenizerTrainer();
  TokenizerTrainer(const TokenizerTrainer&) = delete;
  TokenizerTrainer& operator=(const TokenizerTrainer&) = delete;

  // Counts the pre-tokens of these documents (special tokens in the text are left out).
  void AddDocuments(const std::vector<std::string_view>& documents);
  int64_t documents() const;
  int64_t unique_words() const;
  // Runs the merges. `progress` (may be null) is called now and then with (merges done, target).
  Tokenizer Train(void (*progress)(int64_t done, int64_t target) = nullptr);

  struct State;

 private:
  TokenizerTrainOptions options_;
  std::unique_ptr<State> state_;
};

// The pre-tokenizer regexes of GPT-2 and Llama 3, as Hugging Face writes them.
extern const char* const kGpt2Pattern;
extern const char* const kLlama3Pattern;

}  // namespace crucible
