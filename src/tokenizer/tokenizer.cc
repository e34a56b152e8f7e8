// Tokenizer: loading a tokenizer.json, encoding, decoding, saving, checksum.
#include "tokenizer/tokenizer.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "common/error.h"
#include "common/files.h"
#include "common/hash.h"
#include "common/log.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace crucible {

using json = nlohmann::json;

namespace {

std::string Quote(const std::string& s) {
  return json(s).dump();
}

bool OptionalBool(const json& object, const char* key, bool fallback, const std::string& where) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) throw DataError(where + ": \"" + key + "\" must be true or false");
  return it->get<bool>();
}

bool IsNullOrEmptyString(const json& object, const char* key) {
  auto it = object.find(key);
  return it == object.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty());
}

std::pair<std::string, std::string> ParseMerge(const json& merge, size_t index,
                                               const std::string& where) {
  if (merge.is_string()) {
    const std::string& line = merge.get_ref<const std::string&>();
    size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
      throw DataError(where + ": merge " + std::to_string(index + 1) + " " + Quote(line) +
                      " is not two tokens separated by one space");
    return {line.substr(0, space), line.substr(space + 1)};
  }
  if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string())
    return {merge[0].get<std::string>(), merge[1].get<std::string>()};
  throw DataError(where + ": merge " + std::to_string(index + 1) +
                  " must be \"a b\" or [\"a\", \"b\"], got " + merge.dump());
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Construction

std::shared_ptr<const Tokenizer::Impl> Tokenizer::Impl::Build(Parts parts) {
  auto impl = std::make_shared<Impl>();
  Impl& t = *impl;
  t.name = parts.name;
  t.ignore_merges = parts.ignore_merges;
  t.byte_fallback = parts.byte_fallback;
  t.fuse_unk = parts.fuse_unk;
  t.unk_token = parts.unk_token;
  t.normalizer_json = std::move(parts.normalizer_json);
  t.pre_tokenizer_json = std::move(parts.pre_tokenizer_json);
  t.post_processor_json = std::move(parts.post_processor_json);
  t.decoder_json = std::move(parts.decoder_json);
  t.normalizer = Normalizer::FromJson(t.normalizer_json, t.name);
  t.pre_tokenizer = PreTokenizer::FromJson(t.pre_tokenizer_json, t.name);
  t.byte_level = t.pre_tokenizer->has_byte_level();
  if (t.byte_level && !t.pre_tokenizer->byte_level_last())
    throw DataError(t.name + ": pre_tokenizer " + Quote(t.pre_tokenizer->Describe()) +
                    " has a ByteLevel step that is not the last one (it must come last, once)");
  if (t.pre_tokenizer->metaspace_first_after_other_step() && !t.normalizer->empty())
    throw DataError(t.name +
                    ": unsupported: a Metaspace with prepend_scheme \"first\" after "
                    "another pre-tokenizer step, behind a normalizer");
  t.decoder = Decoder::FromJson(t.decoder_json, t.name);

  // Model vocabulary.
  uint32_t max_id = 0;
  for (const auto& [token, id] : parts.vocab) {
    t.model_vocab.emplace(token, id);
    max_id = std::max(max_id, id);
  }
  t.model_entries = t.model_vocab.size();
  std::array<int32_t, 256> byte_ids;
  byte_ids.fill(-1);
  int missing_bytes = 0;
  if (t.byte_level) {
    for (int b = 0; b < 256; ++b) {
      std::string s;
      AppendUtf8(ByteToCodepoint(static_cast<uint8_t>(b)), &s);
      auto it = t.model_vocab.find(s);
      byte_ids[b] = it == t.model_vocab.end() ? -1 : static_cast<int32_t>(it->second);
      missing_bytes += byte_ids[b] < 0;
    }
  }
  BpeUnits units;
  units.byte_level = t.byte_level;
  units.byte_fallback = t.byte_fallback;
  units.fuse_unk = t.fuse_unk;
  units.where = t.name;
  if (!t.unk_token.empty()) {
    auto it = t.model_vocab.find(t.unk_token);
    if (it == t.model_vocab.end())
      units.missing_unk_token = t.unk_token;
    else
      units.unk_id = it->second;
  }
  if (t.byte_fallback)
    for (int b = 0; b < 256; ++b) {
      char spelling[8];
      std::snprintf(spelling, sizeof(spelling), "<0x%02X>", b);
      auto it = t.model_vocab.find(spelling);
      units.fallback_ids[b] = it == t.model_vocab.end() ? -1 : static_cast<int32_t>(it->second);
    }
  t.model_options_matter =
      !t.byte_level || (missing_bytes > 0 && (t.byte_fallback || !t.unk_token.empty()));
  TokenIdMap whole_words;
  std::string bytes;
  for (const auto& [token, id] : t.model_vocab) {
    if (!t.byte_level)
      whole_words.emplace(token, id);
    else if (ByteLevelToBytes(token, &bytes))
      whole_words.emplace(bytes, id);
  }

  // Merges, in rank order.
  t.merges.reserve(parts.merges.size());
  for (size_t i = 0; i < parts.merges.size(); ++i) {
    const auto& [left, right] = parts.merges[i];
    auto find = [&](const std::string& token) {
      auto it = t.model_vocab.find(token);
      if (it == t.model_vocab.end())
        throw DataError(t.name + ": merge " + std::to_string(i + 1) + " (" + Quote(left) + ", " +
                        Quote(right) + ") uses " + Quote(token) + ", which is not in the vocab");
      return it->second;
    };
    t.merges.push_back({find(left), find(right), find(left + right)});
  }
  t.bpe = std::make_unique<BpeModel>(byte_ids, t.merges, std::move(whole_words), t.ignore_merges,
                                     std::move(units));

  // Added tokens get their ids as Hugging Face's AddedVocabulary::add_tokens gives them.
  std::map<std::string, uint32_t> added_ids;
  std::map<uint32_t, AddedToken> added_by_id;
  uint32_t next_id = static_cast<uint32_t>(t.model_entries);
  for (AddedToken token : parts.added_tokens) {
    if (token.content.empty()) continue;
    uint32_t stated = token.id;
    if (auto it = added_ids.find(token.content); it != added_ids.end()) {
      token.id = it->second;
    } else if (auto jt = t.model_vocab.find(token.content); jt != t.model_vocab.end()) {
      token.id = jt->second;
    } else {
      token.id = next_id++;
    }
    if (token.id != stated)
      LogWarn(t.name + ": added token " + Quote(token.content) + " is listed with id " +
              std::to_string(stated) + " but gets id " + std::to_string(token.id) +
              " (as in Hugging Face tokenizers)");
    added_ids[token.content] = token.id;
    added_by_id[token.id] = token;
    max_id = std::max(max_id, token.id);
  }
  // A normalized added token is matched, and decoded, by its normalized content.
  std::map<uint32_t, std::string> normalized_content;
  std::vector<AddedToken> plain, normalized;
  RegexScratch scratch;
  for (const auto& [id, token] : added_by_id) {
    t.added_tokens.push_back(token);
    if (!token.normalized) {
      plain.push_back(token);
      continue;
    }
    AddedToken matched = token;
    if (!t.normalizer->empty()) {
      t.normalizer->Normalize(token.content, &matched.content, scratch);
      if (matched.content != token.content) normalized_content[id] = matched.content;
    }
    if (!matched.content.empty()) normalized.push_back(std::move(matched));
  }
  t.added_raw = AddedTokenMatcher(plain);
  t.added_normalized = AddedTokenMatcher(normalized);

  // Id -> token, the string decoding starts from, and (ByteLevel decoder) decoded bytes.
  t.vocab_size = (t.model_vocab.empty() && t.added_tokens.empty()) ? 0 : int64_t{max_id} + 1;
  t.id_to_token.assign(t.vocab_size, std::string());
  t.id_known.assign(t.vocab_size, 0);
  t.id_special.assign(t.vocab_size, 0);
  for (const auto& [token, id] : t.model_vocab) {
    t.id_to_token[id] = token;
    t.id_known[id] = 1;
  }
  for (const AddedToken& token : t.added_tokens) {
    t.id_to_token[token.id] = token.content;
    t.id_known[token.id] = 1;
  }
  t.id_to_decode = t.id_to_token;
  for (const auto& [id, content] : normalized_content) t.id_to_decode[id] = content;
  // Special status follows the string decoded, as in Hugging Face's decode.
  std::set<std::string> special_contents;
  for (const AddedToken& token : t.added_tokens)
    if (token.special) special_contents.insert(token.content);
  for (size_t id = 0; id < t.id_to_decode.size(); ++id)
    t.id_special[id] = t.id_known[id] && special_contents.count(t.id_to_decode[id]) > 0;
  if (t.decoder->byte_level_only()) {
    t.id_to_bytes.resize(t.vocab_size);
    for (size_t id = 0; id < t.id_to_decode.size(); ++id)
      if (!ByteLevelToBytes(t.id_to_decode[id], &t.id_to_bytes[id]))
        t.id_to_bytes[id] = t.id_to_decode[id];
  }

  std::vector<std::pair<std::string, int64_t>> added;
  for (const AddedToken& token : t.added_tokens) added.emplace_back(token.content, token.id);
  const SpecialTokenIds special = FindSpecialTokens(added);
  t.eos_id = special.eos;
  t.bos_id = special.bos;
  t.checksum = t.ComputeChecksum();
  return impl;
}

Tokenizer Tokenizer::FromJson(std::string_view json_text, const std::string& name) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    throw DataError(name + ": not valid JSON (" + e.what() + ")");
  }
  if (!root.is_object()) throw DataError(name + ": a tokenizer.json must be a JSON object");
  if (root.contains("version") && root["version"] != "1.0")
    throw DataError(name + ": unsupported tokenizer.json version " + root["version"].dump());
  for (const char* key : {"truncation", "padding"})
    if (root.contains(key) && !root[key].is_null())
      LogWarn(name + ": \"" + key + "\" is ignored: crucible never truncates or pads");

  if (!root.contains("model") || !root["model"].is_object())
    throw DataError(name + ": no \"model\" object");
  const json& model = root["model"];
  const std::string type = model.value("type", model.contains("merges") ? "BPE" : "");
  if (type != "BPE")
    throw DataError(name + ": unsupported model type " + Quote(type.empty() ? "?" : type) +
                    " (only byte-level BPE is supported)");
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0))
    throw DataError(name + ": unsupported: BPE dropout " + model["dropout"].dump());
  if (!IsNullOrEmptyString(model, "continuing_subword_prefix"))
    throw DataError(name + ": unsupported: continuing_subword_prefix in a BPE");
  if (!IsNullOrEmptyString(model, "end_of_word_suffix"))
    throw DataError(name + ": unsupported: end_of_word_suffix in a BPE");

  Impl::Parts parts;
  parts.name = name;
  parts.ignore_merges = OptionalBool(model, "ignore_merges", false, name);
  parts.byte_fallback = OptionalBool(model, "byte_fallback", false, name);
  parts.fuse_unk = OptionalBool(model, "fuse_unk", false, name);
  if (model.contains("unk_token") && model["unk_token"].is_string())
    parts.unk_token = model["unk_token"].get<std::string>();
  if (!model.contains("vocab") || !model["vocab"].is_object())
    throw DataError(name + ": model has no \"vocab\" object");
  constexpr uint64_t kMaxId = 0x7fffffffULL;  // ids are int32 wherever they are stored
  std::map<uint64_t, std::string> token_of_id;
  for (const auto& [token, id] : model["vocab"].items()) {
    if (!id.is_number_unsigned())
      throw DataError(name + ": vocab entry " + Quote(token) + " has id " + id.dump() +
                      ", not a non-negative integer");
    if (id.get<uint64_t>() > kMaxId)
      throw DataError(name + ": vocab entry " + Quote(token) + ": id " + id.dump() +
                      " is out of range (ids are 0 to " + std::to_string(kMaxId) + ")");
    if (auto [it, added] = token_of_id.emplace(id.get<uint64_t>(), token); !added)
      throw DataError(name + ": vocab entries " + Quote(it->second) + " and " + Quote(token) +
                      " have the same id " + id.dump() + " (each id names one token)");
    parts.vocab.emplace_back(token, id.get<uint32_t>());
  }
  if (!model.contains("merges") || !model["merges"].is_array())
    throw DataError(name + ": model has no \"merges\" list");
  const json& merges = model["merges"];
  parts.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) parts.merges.push_back(ParseMerge(merges[i], i, name));

  if (root.contains("added_tokens") && !root["added_tokens"].is_null()) {
    if (!root["added_tokens"].is_array())
      throw DataError(name + ": \"added_tokens\" must be a list");
    for (const auto& entry : root["added_tokens"]) {
      if (!entry.is_object() || !entry.contains("content") || !entry["content"].is_string() ||
          !entry.contains("id") || !entry["id"].is_number_unsigned())
        throw DataError(name + ": added token " + entry.dump() + " needs \"id\" and \"content\"");
      AddedToken token;
      token.content = entry["content"].get<std::string>();
      token.id = entry["id"].get<uint32_t>();
      token.single_word = OptionalBool(entry, "single_word", false, name);
      token.lstrip = OptionalBool(entry, "lstrip", false, name);
      token.rstrip = OptionalBool(entry, "rstrip", false, name);
      token.special = OptionalBool(entry, "special", false, name);
      token.normalized = OptionalBool(entry, "normalized", !token.special, name);
      parts.added_tokens.push_back(std::move(token));
    }
  }
  parts.normalizer_json = root.value("normalizer", json());
  parts.pre_tokenizer_json = root.value("pre_tokenizer", json());
  parts.post_processor_json = root.value("post_processor", json());
  parts.decoder_json = root.value("decoder", json());
  return Tokenizer(Impl::Build(std::move(parts)));
}

Tokenizer Tokenizer::Load(const std::string& path) {
  return FromJson(ReadConfigFile(path), path);
}

// ---------------------------------------------------------------------------------------------
// Encoding

struct Tokenizer::Impl::EncoderState {
  PreTokenizerScratch pre;
  BpeScratch bpe;
  std::vector<TextSegment> segments, raw_segments;
  std::string repaired, normalized;
};

Tokenizer::Impl::StateLease::StateLease(const Impl& impl) : impl_(impl) {
  std::lock_guard<std::mutex> lock(impl.pool_mutex);
  if (!impl.pool.empty()) {
    state_ = std::move(impl.pool.back());
    impl.pool.pop_back();
  } else {
    state_ = std::make_unique<EncoderState>();
  }
}

Tokenizer::Impl::StateLease::~StateLease() {
  std::lock_guard<std::mutex> lock(impl_.pool_mutex);
  impl_.pool.push_back(std::move(state_));
}

Tokenizer::Impl::Impl() = default;
Tokenizer::Impl::~Impl() = default;

template <class OnPiece>
void Tokenizer::Impl::ForEachPiece(std::string_view text, EncoderState& state,
                                   OnPiece&& on_piece) const {
  auto plain = [&](std::string_view piece_text, bool at_origin) {
    pre_tokenizer->Split(piece_text, state.pre, at_origin);
    for (std::string_view piece : state.pre.pieces) on_piece(piece, int64_t{-1});
  };
  // Each piece between non-normalized added tokens is normalized on its own, then normalized
  // added tokens are cut from the result (matched by their normalized content), as in
  // AddedVocabulary::extract_and_normalize.
  auto normalized_piece = [&](size_t start, size_t end) {
    std::string_view piece = text.substr(start, end - start);
    bool kept = true;
    if (!normalizer->empty()) {
      kept = normalizer->Normalize(piece, &state.normalized, state.pre.regex);
      piece = state.normalized;
    }
    const bool at_origin = start == 0 && kept;
    if (added_normalized.empty()) {
      plain(piece, at_origin);
      return;
    }
    state.segments.clear();
    added_normalized.Split(piece, 0, piece.size(), &state.segments);
    for (const TextSegment& s : state.segments) {
      if (s.id >= 0)
        on_piece(piece.substr(s.start, s.end - s.start), s.id);
      else
        plain(piece.substr(s.start, s.end - s.start), at_origin && s.start == 0);
    }
  };
  if (added_raw.empty()) {
    normalized_piece(0, text.size());
    return;
  }
  state.raw_segments.clear();
  added_raw.Split(text, 0, text.size(), &state.raw_segments);
  for (const TextSegment& s : state.raw_segments) {
    if (s.id >= 0)
      on_piece(text.substr(s.start, s.end - s.start), s.id);
    else
      normalized_piece(s.start, s.end);
  }
}

void Tokenizer::Impl::EncodeInto(std::string_view text, EncoderState& state,
                                 std::vector<uint32_t>* out) const {
  if (!IsValidUtf8(text)) {
    state.repaired = RepairUtf8(text);
    text = state.repaired;
  }
  ForEachPiece(text, state, [&](std::string_view piece, int64_t added_id) {
    if (added_id >= 0)
      out->push_back(static_cast<uint32_t>(added_id));
    else
      bpe->EncodeWord(piece, state.bpe, out);
  });
}

std::vector<std::string> Tokenizer::PreTokenize(std::string_view text) const {
  Impl::StateLease lease(*impl_);
  std::string repaired;
  if (!IsValidUtf8(text)) {
    repaired = RepairUtf8(text);
    text = repaired;
  }
  std::vector<std::string> pieces;
  impl_->ForEachPiece(text, lease.state(),
                      [&](std::string_view piece, int64_t) { pieces.emplace_back(piece); });
  return pieces;
}

std::vector<uint32_t> Tokenizer::Encode(std::string_view text) const {
  Impl::StateLease lease(*impl_);
  std::vector<uint32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  impl_->EncodeInto(text, lease.state(), &ids);
  return ids;
}

std::vector<std::vector<uint32_t>> Tokenizer::EncodeBatch(
    const std::vector<std::string_view>& documents, int threads) const {
  std::vector<std::vector<uint32_t>> results(documents.size());
  if (threads <= 0) threads = omp_get_max_threads();
  threads = static_cast<int>(std::min<size_t>(threads, std::max<size_t>(1, documents.size())));
  std::exception_ptr error;
  std::mutex error_mutex;
#pragma omp parallel num_threads(threads)
  {
    Impl::StateLease lease(*impl_);
#pragma omp for schedule(dynamic, 8)
    for (size_t i = 0; i < documents.size(); ++i) {
      try {
        results[i].reserve(documents[i].size() / 3 + 4);
        impl_->EncodeInto(documents[i], lease.state(), &results[i]);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
  return results;
}

// ---------------------------------------------------------------------------------------------
// Decoding and queries

std::string Tokenizer::Decode(const std::vector<uint32_t>& ids) const {
  return Decode(ids, false);
}

std::string Tokenizer::Decode(const std::vector<uint32_t>& ids, bool skip_special_tokens) const {
  const Impl& t = *impl_;
  auto wanted = [&](uint32_t id) {
    return id < t.id_known.size() && t.id_known[id] && !(skip_special_tokens && t.id_special[id]);
  };
  if (!t.id_to_bytes.empty()) {  // a ByteLevel decoder: each token's bytes, concatenated
    std::string bytes;
    for (uint32_t id : ids)
      if (wanted(id)) bytes += t.id_to_bytes[id];
    return IsValidUtf8(bytes) ? bytes : RepairUtf8(bytes);
  }
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (uint32_t id : ids)
    if (wanted(id)) tokens.push_back(t.id_to_decode[id]);
  return t.decoder->Decode(std::move(tokens));
}

int64_t Tokenizer::vocab_size() const {
  return impl_->vocab_size;
}
int64_t Tokenizer::eos_id() const {
  return impl_->eos_id;
}
int64_t Tokenizer::bos_id() const {
  return impl_->bos_id;
}

int64_t Tokenizer::EndOfTextId(const std::string& token) const {
  if (token.empty()) return impl_->eos_id;
  const int64_t id = TokenToId(token);
  if (id < 0)
    throw UsageError(impl_->name + ": has no token '" + token +
                     "' (neither an added token nor a vocabulary entry) to end documents with");
  return id;
}

SpecialTokenIds FindSpecialTokens(
    const std::vector<std::pair<std::string, int64_t>>& added_tokens) {
  auto find = [&](std::initializer_list<const char*> names) -> int64_t {
    for (const char* name : names)
      for (const auto& [content, id] : added_tokens)
        if (content == name) return id;
    return -1;
  };
  SpecialTokenIds ids;
  ids.eos = find({"<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>",
                  "<\xEF\xBD\x9C"
                  "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
                  "<|eot_id|>", "<|im_end|>"});
  ids.bos = find({"<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>",
                  "<\xEF\xBD\x9C"
                  "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
                  "<|endoftext|>"});
  return ids;
}
std::string Tokenizer::Checksum() const {
  return impl_->checksum;
}
int64_t Tokenizer::merges_count() const {
  return static_cast<int64_t>(impl_->merges.size());
}

int64_t Tokenizer::TokenToId(const std::string& token) const {
  for (const AddedToken& t : impl_->added_tokens)
    if (t.content == token) return t.id;
  auto it = impl_->model_vocab.find(token);
  return it == impl_->model_vocab.end() ? int64_t{-1} : static_cast<int64_t>(it->second);
}

std::string Tokenizer::IdToToken(uint32_t id) const {
  return id < impl_->id_to_token.size() ? impl_->id_to_token[id] : std::string();
}

std::vector<std::pair<std::string, uint32_t>> Tokenizer::SpecialTokens() const {
  std::vector<std::pair<std::string, uint32_t>> out;
  for (const AddedToken& t : impl_->added_tokens)
    if (t.special) out.emplace_back(t.content, t.id);
  return out;
}

std::string Tokenizer::Describe() const {
  const Impl& t = *impl_;
  std::string out = std::string("BPE(") + (t.byte_level ? "byte-level" : "characters") +
                    (t.byte_fallback ? ",byte_fallback" : "") +
                    (!t.byte_level && !t.unk_token.empty() ? ",unk=" + t.unk_token : "") +
                    (t.ignore_merges ? ",ignore_merges" : "") + ")";
  if (!t.normalizer->empty()) out += " normalizer=" + t.normalizer->Describe();
  return out + " pre_tokenizer=" + t.pre_tokenizer->Describe();
}

}  // namespace crucible
