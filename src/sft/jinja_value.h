// The values a chat template computes with, and the Python semantics Jinja gives them: str() and
// repr() of each type, truthiness, == and <, json.dumps (the `tojson` filter Hugging Face installs)
// and Python's whitespace and float repr. jinja.h parses and runs templates over these.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace crucible::jinja {

// How a template failed. kSyntax: not a valid template. kUnsupported: a construct this interpreter
// does not implement (the message names it; Jinja might accept it). kRuntime: an error Jinja
// raises too (an attribute of an undefined variable, 'a' + 1). kRaised: the template called
// raise_exception(message). kLimit: the template ran past a resource cap (steps, output size).
class Error : public std::runtime_error {
 public:
  enum Kind { kSyntax, kUnsupported, kRuntime, kRaised, kLimit };
  Error(Kind kind, int line, const std::string& message)
      : std::runtime_error(message), kind_(kind), line_(line) {}
  Kind kind() const { return kind_; }
  int line() const { return line_; }  // 1-based line of the template; 0 when unknown

 private:
  Kind kind_;
  int line_;
};

class Value;

struct ListData {
  std::vector<Value> items;
  bool tuple = false;  // a Python tuple: prints as (1, 2)
};

// A dict (or a namespace's attributes): string keys in insertion order, as Python keeps them.
struct DictData {
  std::vector<std::pair<std::string, Value>> items;
  const Value* Find(std::string_view key) const;
  void Set(const std::string& key, Value value);
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
};
using Function = std::function<Value(CallArgs& args)>;

class Value {
 public:
  enum class Type {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kCallable
  };

  Value() = default;  // undefined
  static Value Undefined(std::string name);
  static Value None();
  explicit Value(bool value) : type_(Type::kBool), int_(value) {}
  Value(int64_t value) : type_(Type::kInt), int_(value) {}
  Value(int value) : type_(Type::kInt), int_(value) {}
  Value(double value) : type_(Type::kFloat), float_(value) {}
  Value(std::string value) : type_(Type::kString), string_(std::move(value)) {}
  Value(const char* value) : type_(Type::kString), string_(value) {}
  static Value List(std::vector<Value> items, bool tuple = false);
  static Value Dict(DictData dict);
  static Value Namespace(DictData attributes);
  // A function the template can call (a global, a bound method, a macro); `name` is for messages.
  static Value Callable(std::string name, Function function);

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == Type::kUndefined; }
  bool is_none() const { return type_ == Type::kNone; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_number() const {
    return type_ == Type::kBool || type_ == Type::kInt || type_ == Type::kFloat;
  }
  bool boolean() const { return int_ != 0; }
  int64_t integer() const { return int_; }  // kBool and kInt (Python's bool is an int)
  double number() const { return type_ == Type::kFloat ? float_ : static_cast<double>(int_); }
  const std::string& string() const { return string_; }
  const std::string& undefined_name() const { return string_; }
  // Lists, dicts and namespaces are shared, as Python objects are: a copy names the same one.
  ListData& list() const { return *list_; }
  DictData& dict() const { return *dict_; }  // kDict and kNamespace
  const std::string& callable_name() const { return callable_->name; }
  Value Call(CallArgs& args) const { return callable_->function(args); }
  // The shared object a list, dict, namespace or callable names (null for the other types).
  const void* identity() const {
    return list_   ? static_cast<const void*>(list_.get())
           : dict_ ? static_cast<const void*>(dict_.get())
                   : static_cast<const void*>(callable_.get());
  }

 private:
  Type type_ = Type::kUndefined;
  int64_t int_ = 0;
  double float_ = 0;
  std::string string_;  // the string, or the undefined variable's name
  std::shared_ptr<ListData> list_;
  std::shared_ptr<DictData> dict_;
  struct CallableData {
    std::string name;
    Function function;
  };
  std::shared_ptr<CallableData> callable_;
};

// Python's name of the value's type, for messages ('str', 'int', 'list', 'dict', ...).
std::string TypeName(const Value& value);
bool Truthy(const Value& value);
std::string ToString(const Value& value);  // str(value); '' for undefined
// repr(value). Strings are quoted and escaped as Python does for ASCII and for its whitespace;
// other non-ASCII characters are taken as printable (Python escapes a few, e.g. U+200B).
std::string Repr(const Value& value);
bool Equal(const Value& a, const Value& b);
// a < b as Python orders numbers, strings (by code point) and lists; a kRuntime Error otherwise.
int Compare(const Value& a, const Value& b, int line);

Value FromJson(const nlohmann::ordered_json& json);

// json.dumps(value, ensure_ascii, indent, separators, sort_keys); indent < 0 is None.
struct JsonOptions {
  int indent = -1;
  std::string item_separator = ", ", key_separator = ": ";
  bool sort_keys = false, ensure_ascii = false;
};
std::string ToJson(const Value& value, const JsonOptions& options, int line);

// repr(float) as Python writes it: shortest round trip, '1.0', '1e+16', '1.5e-05', 'inf', 'nan'.
std::string PythonFloatRepr(double value);

// str.isspace() of one code point (ASCII whitespace, \x1c-\x1f, \x85, \xa0, the Unicode spaces).
bool IsPythonSpace(uint32_t codepoint);
// str.strip/lstrip/rstrip: of Python whitespace, or of the code points in `chars` when given.
std::string PythonStrip(std::string_view text, const std::string* chars, bool left, bool right);
// The code points of valid UTF-8 text, and the UTF-8 of code points.
std::vector<uint32_t> Codepoints(std::string_view text);
std::string FromCodepoints(const std::vector<uint32_t>& codepoints, size_t begin, size_t end);

}  // namespace crucible::jinja
