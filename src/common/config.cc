#include "common/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <set>
#include <sstream>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"

namespace crucible {

const char* ConfigTypeName(ConfigType type) {
  switch (type) {
    case ConfigType::kBool:
      return "a boolean (true or false)";
    case ConfigType::kInt:
      return "an integer";
    case ConfigType::kFloat:
      return "a number";
    case ConfigType::kString:
      return "a string";
    case ConfigType::kStringList:
      return "an array of strings";
    case ConfigType::kIntOrString:
      return "an integer or a string";
    case ConfigType::kBoolOrString:
      return "true, false or a string";
    case ConfigType::kTableList:
      return "an array of tables of strings, numbers, arrays of strings and arrays of such tables";
  }
  return "?";
}

namespace {

const char* TomlTypeName(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    default:
      return "a date or time";
  }
}

std::string Where(const std::string& source, const toml::node& node) {
  const auto& begin = node.source().begin;
  if (begin.line == 0) return source;
  return source + ":" + std::to_string(begin.line);
}

// The shortest text that reads back as `value` (std::to_chars), with ".0" on a whole number so
// that it stays a TOML float.
std::string ShortestDouble(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char text[64];
  const auto result = std::to_chars(text, text + sizeof(text), value);
  std::string out(text, result.ptr);
  if (out.find_first_of(".eE") == std::string::npos) out += ".0";
  return out;
}

// A table of scalars as a canonical inline TOML table: `{ key = value, ... }`, keys sorted (toml++
// keeps them so), strings quoted as FormatConfigValue quotes them. False when a value is not a
// string, integer, float, boolean, array of strings or array of such tables (a stage's `blends`).
bool CanonicalInlineTable(const toml::table& table, std::string* out) {
  std::string text = "{";
  for (const auto& [key, node] : table) {
    std::string value;
    if (auto v = node.value_exact<std::string>())
      value = FormatConfigValue(*v);
    else if (auto v = node.value_exact<int64_t>())
      value = std::to_string(*v);
    else if (auto v = node.value_exact<double>())
      value = ShortestDouble(*v);
    else if (auto v = node.value_exact<bool>())
      value = *v ? "true" : "false";
    else if (const toml::array* array = node.as_array()) {  // of strings, or of tables
      value = "[";
      for (const auto& element : *array) {
        std::string item;
        if (auto text = element.value_exact<std::string>())
          item = FormatConfigValue(*text);
        else if (const toml::table* inner = element.as_table();
                 !inner || !CanonicalInlineTable(*inner, &item))
          return false;
        value += (value.size() > 1 ? ", " : "") + item;
      }
      value += "]";
    } else
      return false;
    std::string name(key.str());
    if (name.empty() ||
        name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                               "0123456789_-") != std::string::npos)
      name = FormatConfigValue(name);  // a quoted key
    text += (text.size() > 1 ? ", " : " ") + name + " = " + value;
  }
  *out = text + (text.size() > 1 ? " }" : "}");
  return true;
}

// Converts a TOML node to the schema type, or returns false.
bool Convert(const toml::node& node, ConfigType type, ConfigValue* out) {
  switch (type) {
    case ConfigType::kBool:
      if (auto v = node.value_exact<bool>()) return *out = *v, true;
      return false;
    case ConfigType::kInt:
      if (auto v = node.value_exact<int64_t>()) return *out = *v, true;
      return false;
    case ConfigType::kFloat:
      if (auto v = node.value_exact<double>()) return *out = *v, true;
      if (auto v = node.value_exact<int64_t>()) return *out = static_cast<double>(*v), true;
      return false;
    case ConfigType::kString:
      if (auto v = node.value_exact<std::string>()) return *out = *v, true;
      return false;
    case ConfigType::kIntOrString:
      if (auto v = node.value_exact<int64_t>()) return *out = *v, true;
      if (auto v = node.value_exact<std::string>()) return *out = *v, true;
      return false;
    case ConfigType::kBoolOrString:
      if (auto v = node.value_exact<bool>()) return *out = std::string(*v ? "true" : "false"), true;
      if (auto v = node.value_exact<std::string>()) return *out = *v, true;
      return false;
    case ConfigType::kStringList: {
      const toml::array* array = node.as_array();
      if (!array) return false;
      std::vector<std::string> items;
      for (const auto& element : *array) {
        auto v = element.value_exact<std::string>();
        if (!v) return false;
        items.push_back(*v);
      }
      *out = items;
      return true;
    }
    case ConfigType::kTableList: {
      const toml::array* array = node.as_array();
      if (!array) return false;
      std::vector<std::string> items;
      for (const auto& element : *array) {
        const toml::table* table = element.as_table();
        std::string text;
        if (!table || !CanonicalInlineTable(*table, &text)) return false;
        items.push_back(text);
      }
      *out = items;
      return true;
    }
  }
  return false;
}

// Where each table of a kTableList key was given: Origin("<key>#<i>").
void RecordTableOrigins(const std::string& key, const toml::node& node, const std::string& source,
                        const std::string& where_all, std::map<std::string, std::string>* origin) {
  for (auto it = origin->lower_bound(key + "#");
       it != origin->end() && it->first.rfind(key + "#", 0) == 0;)
    it = origin->erase(it);
  const toml::array* array = node.as_array();
  if (!array) return;
  for (size_t i = 0; i < array->size(); ++i) {
    const std::string where = source.empty() ? where_all : Where(source, *array->get(i));
    (*origin)[key + "#" + std::to_string(i)] = where;
  }
}

std::string DidYouMean(const std::string& key) {
  std::string suggestion = Config::Suggest(key);
  return suggestion.empty() ? "" : " (did you mean '" + suggestion + "'?)";
}

bool IsBareWord(const std::string& text) {
  if (text.empty()) return false;
  for (char c : text) {
    if (std::isspace(static_cast<unsigned char>(c)) || c == '"' || c == '\'' || c == '[' ||
        c == ']' || c == '{' || c == '}' || c == '=' || c == '#')
      return false;
  }
  return true;
}

}  // namespace

const ConfigKeySpec* Config::FindSpec(const std::string& key) {
  for (const auto& spec : Schema())
    if (spec.key == key) return &spec;
  return nullptr;
}

std::string Config::Suggest(const std::string& key) {
  std::string best;
  size_t best_distance = std::string::npos;
  std::string name = key.substr(key.find('.') + 1);
  for (const auto& spec : Schema()) {
    size_t distance = EditDistance(key, spec.key);
    // The same name in another section is a likely slip too.
    std::string spec_name = spec.key.substr(spec.key.find('.') + 1);
    if (spec_name == name) distance = std::min<size_t>(distance, 1);
    if (distance < best_distance) {
      best_distance = distance;
      best = spec.key;
    }
  }
  size_t allowed = std::max<size_t>(2, key.size() / 3);
  return best_distance <= allowed ? best : "";
}

Config Config::Defaults() {
  Config config;
  for (const auto& spec : Schema()) config.values_[spec.key] = spec.default_value;
  return config;
}

Config Config::Load(const std::string& path, const std::vector<std::string>& overrides) {
  const std::string missing = StatFailure(path);
  if (!missing.empty()) throw UsageError(path + ": config file not found: " + missing);
  if (IsDirectory(path)) throw UsageError(path + ": is a directory, expected a TOML config file");
  return Parse(ReadConfigFile(path), path, overrides);
}

Config Config::Parse(std::string_view toml_text, const std::string& source,
                     const std::vector<std::string>& overrides) {
  Config config = Defaults();
  toml::table table;
  try {
    table = toml::parse(toml_text, source);
  } catch (const toml::parse_error& error) {
    const auto& begin = error.source().begin;
    throw UsageError(StrFormat(
        "%s:%u:%u: TOML syntax error: %s", source.c_str(), static_cast<unsigned>(begin.line),
        static_cast<unsigned>(begin.column), std::string(error.description()).c_str()));
  }
  std::set<std::string> sections;
  for (const auto& spec : Schema()) sections.insert(spec.key.substr(0, spec.key.find('.')));
  for (const auto& [section_key, section_node] : table) {
    std::string section(section_key.str());
    const toml::table* section_table = section_node.as_table();
    if (!section_table) {
      throw UsageError(Where(source, section_node) + ": '" + section +
                       "' must be a [section]; keys belong inside one of [" +
                       [&] {
                         std::string all;
                         for (const auto& s : sections) all += (all.empty() ? "" : "] [") + s;
                         return all;
                       }() +
                       "]" + DidYouMean("?." + section));
    }
    if (!sections.count(section)) {
      std::string best;
      size_t best_distance = std::string::npos;
      for (const auto& s : sections) {
        size_t d = EditDistance(section, s);
        if (d < best_distance) best_distance = d, best = s;
      }
      throw UsageError(Where(source, section_node) + ": unknown section [" + section + "]" +
                       (best_distance <= 3 ? " (did you mean [" + best + "]?)" : ""));
    }
    for (const auto& [name_key, node] : *section_table) {
      std::string key = section + "." + std::string(name_key.str());
      const ConfigKeySpec* spec = FindSpec(key);
      if (!spec)
        throw UsageError(Where(source, node) + ": unknown key '" + key + "'" + DidYouMean(key));
      ConfigValue value;
      if (!Convert(node, spec->type, &value)) {
        throw UsageError(Where(source, node) + ": " + key + ": expected " +
                         ConfigTypeName(spec->type) + ", got " + TomlTypeName(node));
      }
      config.values_[key] = value;
      config.set_[key] = true;
      config.origin_[key] = Where(source, node);
      if (spec->type == ConfigType::kTableList)
        RecordTableOrigins(key, node, source, "", &config.origin_);
    }
  }
  for (const auto& assignment : overrides) config.ApplyOverride(assignment);
  return config;
}

void Config::ApplyOverride(const std::string& assignment) {
  const std::string where = "--set " + assignment;
  size_t equals = assignment.find('=');
  if (equals == std::string::npos)
    throw UsageError(where + ": expected section.key=value (for example training.steps=200)");
  std::string key = Trim(assignment.substr(0, equals));
  std::string text = Trim(assignment.substr(equals + 1));
  size_t dot = key.find('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == key.size() ||
      key.find('.', dot + 1) != std::string::npos)
    throw UsageError(where + ": the key must be section.key (for example training.steps=200)");
  const ConfigKeySpec* spec = FindSpec(key);
  if (!spec) throw UsageError(where + ": unknown key '" + key + "'" + DidYouMean(key));
  if (text.empty()) throw UsageError(where + ": missing value after '='");
  ConfigValue value;
  bool converted = false;
  try {
    std::string document = "v = " + text;
    toml::table parsed = toml::parse(std::string_view(document), std::string_view("--set"));
    const toml::node* node = parsed.get("v");
    converted = node && Convert(*node, spec->type, &value);
    if (converted && spec->type == ConfigType::kTableList)
      RecordTableOrigins(key, *node, "", where, &origin_);
    if (!converted && node && spec->type == ConfigType::kString && IsBareWord(text)) {
      value = text;  // e.g. --set job.name=123
      converted = true;
    }
    if (!converted && node) {
      throw UsageError(where + ": " + key + ": expected " + ConfigTypeName(spec->type) + ", got " +
                       TomlTypeName(*node));
    }
  } catch (const toml::parse_error&) {
    if (IsBareWord(text) &&
        (spec->type == ConfigType::kString || spec->type == ConfigType::kIntOrString ||
         spec->type == ConfigType::kBoolOrString)) {
      value = text;  // a bare word is taken as a string
      converted = true;
    } else if (IsBareWord(text)) {
      throw UsageError(where + ": " + key + ": expected " + ConfigTypeName(spec->type) +
                       ", got the word '" + text + "'");
    } else {
      throw UsageError(where + ": the value is not valid TOML (quote strings: key=\"a b\")");
    }
  }
  values_[key] = value;
  set_[key] = true;
  origin_[key] = where;
}

bool Config::IsSet(const std::string& key) const {
  auto it = set_.find(key);
  return it != set_.end() && it->second;
}

std::string Config::Origin(const std::string& key) const {
  auto it = origin_.find(key);
  return it == origin_.end() ? "" : it->second;
}

bool ConfigRange::Contains(double value) const {
  if (std::isnan(value)) return false;
  const bool above = min_open ? value > min : value >= min;
  const bool below = max_open ? value < max : value <= max;
  return above && below;
}

std::string ConfigRange::Describe(ConfigType type) const {
  const bool integer = type != ConfigType::kFloat;
  std::string what = integer ? "an integer" : "a finite number";
  auto bound = [&](double v) { return StrFormat(integer ? "%.0f" : "%g", v); };
  const bool has_min = std::isfinite(min), has_max = std::isfinite(max);
  if (has_min && has_max)
    return what + " in " + (min_open ? "(" : "[") + bound(min) + ", " + bound(max) +
           (max_open ? ")" : "]");
  if (has_min) return what + (min_open ? " > " : " >= ") + bound(min);
  if (has_max) return what + (max_open ? " < " : " <= ") + bound(max);
  return what;
}

void Config::Validate() const {
  for (const auto& spec : Schema()) {
    const ConfigValue& value = Value(spec.key);
    double number;
    if (const auto* i = std::get_if<int64_t>(&value))
      number = static_cast<double>(*i);
    else if (const auto* d = std::get_if<double>(&value))
      number = *d;
    else
      continue;
    const bool finite_needed = spec.type == ConfigType::kFloat;
    if (spec.range.Contains(number) && (!finite_needed || std::isfinite(number))) continue;
    const std::string origin = Origin(spec.key);
    const std::string shown =
        std::holds_alternative<double>(value) ? StrFormat("%g", number) : FormatConfigValue(value);
    throw UsageError(StrFormat("%s%s = %s is out of range: expected %s",
                               origin.empty() ? "" : (origin + ": ").c_str(), spec.key.c_str(),
                               shown.c_str(), spec.range.Describe(spec.type).c_str()));
  }
}

const ConfigValue& Config::Value(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end())
    throw Error(kExitFailure, "internal: config key '" + key + "' is not in the schema");
  return it->second;
}

bool Config::Bool(const std::string& key) const {
  return std::get<bool>(Value(key));
}
int64_t Config::Int(const std::string& key) const {
  const ConfigValue& value = Value(key);
  if (const auto* s = std::get_if<std::string>(&value))
    throw UsageError("config key '" + key + "' is \"" + *s + "\" where an integer is needed here");
  return std::get<int64_t>(value);
}
double Config::Float(const std::string& key) const {
  return std::get<double>(Value(key));
}
const std::string& Config::String(const std::string& key) const {
  return std::get<std::string>(Value(key));
}
const std::vector<std::string>& Config::StringList(const std::string& key) const {
  return std::get<std::vector<std::string>>(Value(key));
}
bool Config::HoldsString(const std::string& key) const {
  return std::holds_alternative<std::string>(Value(key));
}

void Config::Set(const std::string& key, ConfigValue value) {
  if (!FindSpec(key))
    throw Error(kExitFailure, "internal: config key '" + key + "' is not in the schema");
  values_[key] = std::move(value);
}

std::string FormatConfigValue(const ConfigValue& value) {
  struct Visitor {
    std::string operator()(bool v) const { return v ? "true" : "false"; }
    std::string operator()(int64_t v) const { return std::to_string(v); }
    std::string operator()(double v) const {
      std::string text = FormatDouble(v);
      if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
      if (text == "inf") return "inf";
      return text;
    }
    std::string operator()(const std::string& v) const {
      std::ostringstream out;
      out << toml::value<std::string>(v);
      return out.str();
    }
    std::string operator()(const std::vector<std::string>& v) const {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + (*this)(v[i]);
      return out + "]";
    }
  };
  return std::visit(Visitor{}, value);
}

std::string FormatConfigChange(const std::string& key, const ConfigValue& from,
                               const ConfigValue& to) {
  const ConfigKeySpec* spec = Config::FindSpec(key);
  const auto* a = std::get_if<std::vector<std::string>>(&from);
  const auto* b = std::get_if<std::vector<std::string>>(&to);
  if (!spec || spec->type != ConfigType::kTableList || !a || !b)
    return key + ": " + FormatConfigValue(from) + " -> " + FormatConfigValue(to);
  std::string out;
  for (size_t i = 0; i < std::max(a->size(), b->size()); ++i) {
    const std::string before = i < a->size() ? (*a)[i] : "(none)";
    const std::string after = i < b->size() ? (*b)[i] : "(none)";
    if (before == after) continue;
    out += (out.empty() ? "" : "; ") + key + " #" + std::to_string(i + 1) + ": " + before + " -> " +
           after;
  }
  return out;
}

std::string Config::ToToml() const {
  std::string out;
  std::string current_section;
  for (const auto& spec : Schema()) {
    std::string section = spec.key.substr(0, spec.key.find('.'));
    if (section != current_section) {
      out += (out.empty() ? "[" : "\n[") + section + "]\n";
      current_section = section;
    }
    std::string value = FormatConfigValue(Value(spec.key));
    if (spec.type == ConfigType::kTableList) {  // the tables themselves, not strings holding them
      value = "[";
      for (const std::string& table : StringList(spec.key))
        value += (value.size() > 1 ? ", " : "") + table;
      value += "]";
    }
    out += spec.key.substr(section.size() + 1) + " = " + value + "\n";
  }
  return out;
}

std::vector<std::string> Config::Diff(const Config& other) const {
  std::vector<std::string> keys;
  for (const auto& spec : Schema())
    if (Value(spec.key) != other.Value(spec.key)) keys.push_back(spec.key);
  return keys;
}

}  // namespace crucible
