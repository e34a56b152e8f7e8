// Tokenizer -> Hugging Face tokenizer.json, and the content checksum.
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/hash.h"
#include "tokenizer/tokenizer_impl.h"

namespace crucible {

using ordered_json = nlohmann::ordered_json;

namespace {

// Vocabulary entries in id order.
std::vector<std::pair<std::string, uint32_t>> SortedVocab(const Tokenizer::Impl& t) {
  std::vector<std::pair<std::string, uint32_t>> vocab(t.model_vocab.begin(), t.model_vocab.end());
  std::sort(vocab.begin(), vocab.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second < b.second : a.first < b.first;
  });
  return vocab;
}

ordered_json AddedTokensJson(const Tokenizer::Impl& t) {
  ordered_json list = ordered_json::array();
  for (const AddedToken& token : t.added_tokens)
    list.push_back({{"id", token.id},
                    {"content", token.content},
                    {"single_word", token.single_word},
                    {"lstrip", token.lstrip},
                    {"rstrip", token.rstrip},
                    {"normalized", token.normalized},
                    {"special", token.special}});
  return list;
}

}  // namespace

ordered_json Tokenizer::Impl::ToJson() const {
  ordered_json vocab = ordered_json::object();
  for (const auto& [token, id] : SortedVocab(*this)) vocab[token] = id;
  // "a b" strings unless a token holds a space (then the [a, b] form of tokenizers >= 0.20).
  bool pairs_form = false;
  for (const auto& m : merges)
    pairs_form = pairs_form || id_to_token[m[0]].find(' ') != std::string::npos ||
                 id_to_token[m[1]].find(' ') != std::string::npos;
  ordered_json merge_list = ordered_json::array();
  for (const auto& m : merges) {
    if (pairs_form)
      merge_list.push_back(ordered_json::array({id_to_token[m[0]], id_to_token[m[1]]}));
    else
      merge_list.push_back(id_to_token[m[0]] + " " + id_to_token[m[1]]);
  }
  ordered_json model = {{"type", "BPE"},
                        {"dropout", nullptr},
                        {"unk_token", unk_token.empty() ? ordered_json() : ordered_json(unk_token)},
                        {"continuing_subword_prefix", nullptr},
                        {"end_of_word_suffix", nullptr},
                        {"fuse_unk", fuse_unk},
                        {"byte_fallback", byte_fallback},
                        {"ignore_merges", ignore_merges},
                        {"vocab", std::move(vocab)},
                        {"merges", std::move(merge_list)}};
  ordered_json root;
  root["version"] = "1.0";
  root["truncation"] = nullptr;
  root["padding"] = nullptr;
  root["added_tokens"] = AddedTokensJson(*this);
  root["normalizer"] = ordered_json::parse(normalizer_json.dump());
  root["pre_tokenizer"] = ordered_json::parse(pre_tokenizer_json.dump());
  root["post_processor"] = ordered_json::parse(post_processor_json.dump());
  root["decoder"] = ordered_json::parse(decoder_json.dump());
  root["model"] = std::move(model);
  return root;
}

// XXH3-128 of a canonical serialisation: what decides the ids (vocab by id, merges by rank as
// ids, ignore_merges, added tokens with their flags, normalizer, pre-tokenizer and decoder with
// sorted keys, the unk/byte_fallback options where they matter),
// never the file's formatting, its merges spelling or its path.
std::string Tokenizer::Impl::ComputeChecksum() const {
  nlohmann::json canonical;
  canonical["format"] = "crucible-bpe-v1";
  nlohmann::json vocab = nlohmann::json::array();
  for (const auto& [token, id] : SortedVocab(*this)) vocab.push_back({id, token});
  canonical["vocab"] = std::move(vocab);
  nlohmann::json merge_ids = nlohmann::json::array();
  for (const auto& m : merges) merge_ids.push_back({m[0], m[1]});
  canonical["merges"] = std::move(merge_ids);
  canonical["ignore_merges"] = ignore_merges;
  canonical["added_tokens"] = nlohmann::json::parse(AddedTokensJson(*this).dump());
  canonical["pre_tokenizer"] = pre_tokenizer_json;  // nlohmann::json keeps keys sorted
  canonical["decoder"] = decoder_json;
  // Present only where they can change ids, so byte-level tokenizers keep their checksums.
  if (!normalizer_json.is_null()) canonical["normalizer"] = normalizer_json;
  if (model_options_matter)
    canonical["model_options"] = {
        {"unk_token", unk_token}, {"byte_fallback", byte_fallback}, {"fuse_unk", fuse_unk}};
  const std::string text = canonical.dump();
  StreamHasher hasher;
  hasher.Update(text.data(), text.size());
  return hasher.HexDigest128();
}

std::string Tokenizer::ToJson() const {
  return impl_->ToJson().dump(2) + "\n";
}

void Tokenizer::Save(const std::string& path) const {
  const std::string parent = ParentDirectory(path);
  if (!parent.empty()) MakeDirectories(parent);
  AtomicWriteFile(path, ToJson());
}

}  // namespace crucible
