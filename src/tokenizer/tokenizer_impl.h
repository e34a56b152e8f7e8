// Tokenizer::Impl, shared by tokenizer.cc (load, encode, decode), tokenizer_json.cc (save,
// checksum) and trainer.cc (which builds one from trained parts). Not a public header.
#pragma once

#include <array>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace crucible {

struct Tokenizer::Impl {
  // What a tokenizer.json holds, parsed but not yet checked or indexed.
  struct Parts {
    std::string name;  // file name, for errors
    std::vector<std::pair<std::string, uint32_t>> vocab;
    std::vector<std::pair<std::string, std::string>> merges;  // rank order
    bool ignore_merges = false;
    bool byte_fallback = false, fuse_unk = false;
    std::string unk_token;
    std::vector<AddedToken> added_tokens;  // in file order
    nlohmann::json normalizer_json, pre_tokenizer_json, post_processor_json, decoder_json;
  };
  // Checks and indexes the parts; throws DataError naming parts.name.
  static std::shared_ptr<const Impl> Build(Parts parts);

  Impl();
  ~Impl();

  struct EncoderState;
  // Borrows a per-thread encoder state (regex scratch, word cache) from the pool.
  class StateLease {
   public:
    explicit StateLease(const Impl& impl);
    ~StateLease();
    EncoderState& state() { return *state_; }

   private:
    const Impl& impl_;
    std::unique_ptr<EncoderState> state_;
  };
  void EncodeInto(std::string_view text, EncoderState& state, std::vector<uint32_t>* out) const;
  // Cuts out added tokens, pre-tokenizes the rest, and calls on_piece(piece, added_id) in order
  // (added_id -1 for a pre-token). `text` must be valid UTF-8.
  template <class OnPiece>
  void ForEachPiece(std::string_view text, EncoderState& state, OnPiece&& on_piece) const;
  std::string ComputeChecksum() const;
  nlohmann::ordered_json ToJson() const;

  std::string name;
  std::unordered_map<std::string, uint32_t> model_vocab;  // spelling as written -> id
  size_t model_entries = 0;
  std::vector<std::array<uint32_t, 3>> merges;  // (left, right, merged) in rank order
  bool ignore_merges = false;
  // Byte-level (a ByteLevel pre-tokenizer step: tokens spell bytes) or over characters
  // (SentencePiece style: tokens are text as written, unknown characters go to byte_fallback's
  // <0xNN> tokens or unk_token).
  bool byte_level = true;
  bool byte_fallback = false, fuse_unk = false;
  std::string unk_token;
  bool model_options_matter = false;              // the unk/byte_fallback options can change ids
  std::vector<AddedToken> added_tokens;           // id order, ids as Hugging Face assigns them
  AddedTokenMatcher added_raw, added_normalized;  // normalized ones by their normalized content
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> bpe;
  std::unique_ptr<Decoder> decoder;
  nlohmann::json normalizer_json, pre_tokenizer_json, post_processor_json, decoder_json;

  int64_t vocab_size = 0;  // highest id + 1
  std::vector<std::string> id_to_token;
  // The string decoding starts from (a normalized added token's normalized content, as in
  // tokenizers), and, for a ByteLevel decoder, the bytes it makes of each token.
  std::vector<std::string> id_to_decode, id_to_bytes;
  std::vector<char> id_known, id_special;
  int64_t eos_id = -1, bos_id = -1;
  std::string checksum;

  mutable std::mutex pool_mutex;
  mutable std::vector<std::unique_ptr<EncoderState>> pool;
};

}  // namespace crucible
