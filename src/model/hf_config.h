// What the Hugging Face mappings of every family read alike from a config.json (model.h's
// HfMapping): booleans, numbers and the RoPE base in transformers' spellings. DataError naming the
// file and the key for a value of the wrong type.
#pragma once

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

}  // namespace crucible
