// Run configuration: TOML files with torchtitan-style sections, command-line overrides
// ("--set section.key=value", the value in TOML syntax, a bare word taken as a string), and a
// schema that every key must be in. Unknown keys are rejected with the closest valid one; type
// errors name the file, line, key and expected type. The fully resolved config (every key, its
// value) is what a run writes to its run directory and what a resume compares against.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace crucible {

using ConfigValue = std::variant<bool, int64_t, double, std::string, std::vector<std::string>>;

// kBoolOrString holds a string: a TOML boolean is read as its spelling, "true" or "false" (a key
// whose words include true and false, like model.tie_embeddings's true, false or flavor).
// kTableList is an array of tables of strings, integers, floats and booleans (`[[data.stages]]`,
// or `stages = [{...}, ...]`): it holds one string per table, the table as a canonical inline
// TOML table (`{ key = value, ... }`, keys sorted), which its module parses; Origin(key + "#<i>")
// says where table i (from 0) was given. It is written back as an array of inline tables.
enum class ConfigType {
  kBool,
  kInt,
  kFloat,
  kString,
  kStringList,
  kIntOrString,
  kBoolOrString,
  kTableList
};

// The values a numeric key accepts: from `min` to `max`, either end open or closed (an infinite
// end is no limit). A float key must also be finite. Keys of other types have no range.
struct ConfigRange {
  double min = -HUGE_VAL, max = HUGE_VAL;
  bool min_open = false, max_open = false;
  bool Contains(double value) const;
  // "a finite number > 0", "an integer >= 1", "a number in [0, 1)".
  std::string Describe(ConfigType type) const;
};

struct ConfigKeySpec {
  std::string key;  // "section.name"
  ConfigType type;
  ConfigValue default_value;
  std::string help;
  // How a change of this key between a checkpoint and a resumed run is treated.
  bool resume_sensitive = false;
  ConfigRange range = {};  // kInt, kFloat and the integer of kIntOrString
};

class Config {
 public:
  // Every key at its default.
  static Config Defaults();
  // Reads `path` (must exist) and applies `overrides` in order.
  static Config Load(const std::string& path, const std::vector<std::string>& overrides);
  // Parses TOML text; `source` names it in error messages.
  static Config Parse(std::string_view toml_text, const std::string& source,
                      const std::vector<std::string>& overrides = {});

  // True when the key was given in the file or an override (not just defaulted).
  bool IsSet(const std::string& key) const;
  // Where a key was given: "file.toml:12" or "--set key=value"; "" for a default.
  std::string Origin(const std::string& key) const;
  // Throws UsageError for the first key (in schema order) whose value is outside its range,
  // naming where it was given, the key, the value and the valid range. Called by the commands
  // that act on a config (train, model), not when a run's recorded config is read back.
  void Validate() const;
  bool Bool(const std::string& key) const;
  int64_t Int(const std::string& key) const;
  double Float(const std::string& key) const;
  const std::string& String(const std::string& key) const;
  const std::vector<std::string>& StringList(const std::string& key) const;
  // For kIntOrString keys: whether the value is currently a string (e.g. "auto").
  bool HoldsString(const std::string& key) const;
  const ConfigValue& Value(const std::string& key) const;

  // Records a value (e.g. a resolved default); the type must match the schema.
  void Set(const std::string& key, ConfigValue value);
  // Applies one "section.key=value" override; throws UsageError on bad syntax or key.
  void ApplyOverride(const std::string& assignment);

  // The whole config as TOML, every key of the schema, in schema order.
  std::string ToToml() const;
  // Keys whose values differ between two configs, in schema order.
  std::vector<std::string> Diff(const Config& other) const;

  static const std::vector<ConfigKeySpec>& Schema();
  static const ConfigKeySpec* FindSpec(const std::string& key);
  // "did you mean ...": the schema key closest to `key`, or "" if none is close.
  static std::string Suggest(const std::string& key);

 private:
  std::map<std::string, ConfigValue> values_;
  std::map<std::string, bool> set_;
  std::map<std::string, std::string> origin_;
};

std::string FormatConfigValue(const ConfigValue& value);
// "key: old -> new"; for a kTableList key, each table that differs: "key #2: {...} -> {...}"
// (a table only one side has: "(none)" on the other), joined by "; ".
std::string FormatConfigChange(const std::string& key, const ConfigValue& from,
                               const ConfigValue& to);
const char* ConfigTypeName(ConfigType type);

}  // namespace crucible
