// What the Hugging Face mappings of every family read alike from a config.json (model.h's
// HfMapping): booleans, numbers and the RoPE base in transformers' spellings. DataError naming the
// file and the key for a value of the wrong type.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace crucible {

// The value of `key` in `object`, or `fallback` when it is absent or null; DataError naming the
// file when it is not a boolean.
bool HfBoolean(const nlohmann::json& object, const char* key, bool fallback,
               const std::string& path);
// The value of `key` in `object`, or nullopt when it is absent or null; DataError naming the file
// and `where` (the key's path in the file) when it is not a number.
std::optional<double> HfNumber(const nlohmann::json& object, const char* key,
                               const std::string& where, const std::string& path);
// The RoPE base of a config.json, in either spelling: transformers < 5 writes a top-level
// `rope_theta` (and `rope_scaling` {type or rope_type, factor, ...} for the other RoPE types),
// transformers >= 5 `rope_parameters` {rope_type, rope_theta}; the base is taken as transformers
// takes it (rope_parameters' first, then the top-level one, then 10000). Only the default RoPE is
// implemented: another rope_type in either object (llama3, yarn, linear, dynamic, ...) is refused,
// as are two spellings of the base that disagree.
double ReadHfRopeTheta(const nlohmann::json& config, const std::string& path);

// A config.json value for a message: a string as 'text', anything else as JSON.
std::string HfQuoted(const nlohmann::json& value);
// DataError naming the file and key unless the config's activation is silu (or absent) and every
// key of `bias_keys` is false (or absent): what every family here computes (SwiGLU, no biases).
// `family` names it in the message ("Llama", "DeepSeek-V3").
void RequireHfSiluWithoutBiases(const nlohmann::json& config, const std::string& path,
                                const char* family, std::initializer_list<const char*> bias_keys);

// The keys every family's exported config.json has alike, appended to `config`: the activation
// (silu), max_position_embeddings, rms_norm_eps, the RoPE base in both spellings (rope_theta and
// rope_parameters, each read natively by transformers < 5 and >= 5), no attention bias or
// dropout, initializer_range, tie_word_embeddings, the dtype in both spellings (torch_dtype,
// dtype), use_cache, and the BOS and EOS ids.
struct HfCommonKeys {
  int64_t max_position_embeddings = 0;
  double norm_eps = 0, rope_theta = 0, init_std = 0;
  bool tie_embeddings = false;
  nlohmann::json bos_token_id, eos_token_id;
};
void AppendHfCommonKeys(const HfCommonKeys& keys, nlohmann::ordered_json* config);

}  // namespace crucible
