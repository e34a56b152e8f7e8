#include "model/hf_config.h"

#include "common/error.h"
#include "common/strings.h"

namespace crucible {

// The value of `key` in `object`, or `fallback` when it is absent or null; DataError naming the
// file when it is not a boolean.
bool HfBoolean(const nlohmann::json& object, const char* key, bool fallback,
               const std::string& path) {
  if (!object.contains(key) || object[key].is_null()) return fallback;
  if (!object[key].is_boolean()) throw DataError(path + ": '" + key + "' is not true/false");
  return object[key].get<bool>();
}

// The value of `key` in `object`, or nullopt when it is absent or null; DataError naming the file
// and `where` (the key's path in the file) when it is not a number.
std::optional<double> HfNumber(const nlohmann::json& object, const char* key,
                               const std::string& where, const std::string& path) {
  if (!object.contains(key) || object[key].is_null()) return std::nullopt;
  if (!object[key].is_number()) throw DataError(path + ": '" + where + "' is not a number");
  return object[key].get<double>();
}

// The RoPE base of a config.json, in either spelling: transformers < 5 writes a top-level
// `rope_theta` (and `rope_scaling` {type or rope_type, factor, ...} for the other RoPE types),
// transformers >= 5 `rope_parameters` {rope_type, rope_theta}; the base is taken as transformers
// takes it (rope_parameters' first, then the top-level one, then 10000). Only the default RoPE is
// implemented: another rope_type in either object (llama3, yarn, linear, dynamic, ...) is refused,
// as are two spellings of the base that disagree.
double ReadHfRopeTheta(const nlohmann::json& c, const std::string& path) {
  const std::optional<double> top = HfNumber(c, "rope_theta", "rope_theta", path);
  std::optional<double> nested;
  std::string nested_key;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!c.contains(key) || c[key].is_null()) continue;
    const nlohmann::json& rope = c[key];
    if (!rope.is_object()) throw DataError(path + ": '" + key + "' is not an object");
    std::string type = "default";
    for (const char* type_key : {"rope_type", "type"}) {
      if (!rope.contains(type_key)) continue;
      if (!rope[type_key].is_string())
        throw DataError(path + ": '" + key + "." + type_key + "' is not a string");
      type = rope[type_key].get<std::string>();
      break;
    }
    if (type != "default")
      throw DataError(path + ": rope_type '" + type + "' (" + key +
                      ") is not supported: crucible implements only the default RoPE "
                      "(rope_type 'default', base rope_theta); use a model trained with it");
    const std::string where = std::string(key) + ".rope_theta";
    if (std::optional<double> theta = HfNumber(rope, "rope_theta", where, path)) {
      if (nested && *nested != *theta)
        throw DataError(StrFormat("%s: %s=%g and %s=%g disagree; keep one", path.c_str(),
                                  nested_key.c_str(), *nested, where.c_str(), *theta));
      nested = theta;
      nested_key = where;
    }
  }
  if (top && nested && *top != *nested)
    throw DataError(StrFormat("%s: rope_theta=%g and %s=%g disagree; keep one", path.c_str(), *top,
                              nested_key.c_str(), *nested));
  const double theta = nested ? *nested : top ? *top : 10000.0;
  if (!(theta > 0)) throw DataError(path + ": rope_theta must be positive");
  return theta;
}

void AppendHfCommonKeys(const HfCommonKeys& k, nlohmann::ordered_json* config) {
  const nlohmann::ordered_json rope_parameters = {{"rope_theta", k.rope_theta},
                                                  {"rope_type", "default"}};
  nlohmann::ordered_json& c = *config;
  c["hidden_act"] = "silu";
  c["max_position_embeddings"] = k.max_position_embeddings;
  c["rms_norm_eps"] = k.norm_eps;
  c["rope_theta"] = k.rope_theta;
  c["rope_parameters"] = rope_parameters;
  c["attention_bias"] = false;
  c["attention_dropout"] = 0.0;
  c["initializer_range"] = k.init_std;
  c["tie_word_embeddings"] = k.tie_embeddings;
  c["torch_dtype"] = "float32";
  c["dtype"] = "float32";
  c["use_cache"] = true;
  c["bos_token_id"] = k.bos_token_id;
  c["eos_token_id"] = k.eos_token_id;
}

std::string HfQuoted(const nlohmann::json& value) {
  return value.is_string() ? "'" + value.get<std::string>() + "'" : value.dump();
}

void RequireHfSiluWithoutBiases(const nlohmann::json& c, const std::string& path,
                                const char* family, std::initializer_list<const char*> bias_keys) {
  if (c.contains("hidden_act") && c["hidden_act"] != "silu")
    throw DataError(path + ": hidden_act " + HfQuoted(c["hidden_act"]) +
                    " is not supported: crucible's " + family + " uses silu (SwiGLU)");
  for (const char* key : bias_keys)
    if (HfBoolean(c, key, false, path))
      throw DataError(path + ": " + key + "=true is not supported: crucible's " + family +
                      " has no biases");
}

}  // namespace crucible
