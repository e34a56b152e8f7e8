#include "tokenizer/replace_pattern.h"

#include "common/error.h"

namespace crucible {

ReplacePattern::ReplacePattern(const nlohmann::json& value, const std::string& where,
                               const std::string& what) {
  if (!value.contains("content") || !value["content"].is_string())
    throw DataError(where + ": " + what + " needs a \"content\" string");
  content_ = value["content"].get<std::string>();
  const nlohmann::json& pattern = value.value("pattern", nlohmann::json());
  if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()) {
    literal_ = pattern["String"].get<std::string>();
    if (literal_.empty())
      throw DataError(where + ": unsupported: " + what + " with an empty String pattern");
  } else if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
    regex_ = std::make_unique<Regex>(pattern["Regex"].get<std::string>(), where,
                                     /*allow_fast=*/false);
  } else {
    throw DataError(where + ": " + what + " pattern must be {\"String\": ...} or {\"Regex\": ...}");
  }
}

}  // namespace crucible
