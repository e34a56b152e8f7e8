// Python semantics of template values: see jinja_value.h.
#include "sft/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "tokenizer/utf8.h"

namespace crucible::jinja {

const Value* DictData::Find(std::string_view key) const {
  for (const auto& [name, value] : items)
    if (name == key) return &value;
  return nullptr;
}

void DictData::Set(const std::string& key, Value value) {
  for (auto& [name, existing] : items) {
    if (name == key) {
      existing = std::move(value);
      return;
    }
  }
  items.emplace_back(key, std::move(value));
}

Value Value::Undefined(std::string name) {
  Value value;
  value.string_ = std::move(name);
  return value;
}

Value Value::None() {
  Value value;
  value.type_ = Type::kNone;
  return value;
}

Value Value::List(std::vector<Value> items, bool tuple) {
  Value value;
  value.type_ = Type::kList;
  value.list_ = std::make_shared<ListData>(ListData{std::move(items), tuple});
  return value;
}

Value Value::Dict(DictData dict) {
  Value value;
  value.type_ = Type::kDict;
  value.dict_ = std::make_shared<DictData>(std::move(dict));
  return value;
}

Value Value::Namespace(DictData attributes) {
  Value value = Dict(std::move(attributes));
  value.type_ = Type::kNamespace;
  return value;
}

Value Value::Callable(std::string name, Function function) {
  Value value;
  value.type_ = Type::kCallable;
  value.callable_ =
      std::make_shared<CallableData>(CallableData{std::move(name), std::move(function)});
  return value;
}

std::string TypeName(const Value& value) {
  switch (value.type()) {
    case Value::Type::kUndefined:
      return "Undefined";
    case Value::Type::kNone:
      return "NoneType";
    case Value::Type::kBool:
      return "bool";
    case Value::Type::kInt:
      return "int";
    case Value::Type::kFloat:
      return "float";
    case Value::Type::kString:
      return "str";
    case Value::Type::kList:
      return value.list().tuple ? "tuple" : "list";
    case Value::Type::kDict:
      return "dict";
    case Value::Type::kNamespace:
      return "Namespace";
    case Value::Type::kCallable:
      return "function";
  }
  return "?";
}

bool Truthy(const Value& value) {
  switch (value.type()) {
    case Value::Type::kUndefined:
    case Value::Type::kNone:
      return false;
    case Value::Type::kBool:
    case Value::Type::kInt:
      return value.integer() != 0;
    case Value::Type::kFloat:
      return value.number() != 0.0;
    case Value::Type::kString:
      return !value.string().empty();
    case Value::Type::kList:
      return !value.list().items.empty();
    case Value::Type::kDict:
      return !value.dict().items.empty();
    case Value::Type::kNamespace:
    case Value::Type::kCallable:
      return true;
  }
  return false;
}

std::string PythonFloatRepr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  // The shortest digits that read back, then Python's layout: fixed point for decimal
  // exponents -4 <= e < 16, else d.ddde+XX.
  char buffer[64];
  auto result =
      std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific);
  std::string text(buffer, result.ptr);
  bool negative = text[0] == '-';
  if (negative) text.erase(0, 1);
  size_t e = text.find('e');
  int exponent = std::stoi(text.substr(e + 1));
  std::string digits = text.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else if (static_cast<size_t>(exponent) + 1 >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(exponent) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(exponent) + 1) + "." +
             digits.substr(static_cast<size_t>(exponent) + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp[16];
  std::snprintf(exp, sizeof(exp), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exp;
}

bool IsPythonSpace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

std::vector<uint32_t> Codepoints(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) out.push_back(NextCodepoint(text, &pos));
  return out;
}

std::string FromCodepoints(const std::vector<uint32_t>& codepoints, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) AppendUtf8(codepoints[i], &out);
  return out;
}

std::string PythonStrip(std::string_view text, const std::string* chars, bool left, bool right) {
  std::vector<uint32_t> strip_set;
  if (chars) strip_set = Codepoints(*chars);
  auto strips = [&](uint32_t c) {
    return chars ? std::find(strip_set.begin(), strip_set.end(), c) != strip_set.end()
                 : IsPythonSpace(c);
  };
  std::vector<uint32_t> cps = Codepoints(text);
  size_t begin = 0, end = cps.size();
  while (left && begin < end && strips(cps[begin])) ++begin;
  while (right && end > begin && strips(cps[end - 1])) --end;
  return FromCodepoints(cps, begin, end);
}

namespace {

std::string ReprString(const std::string& text) {
  bool single = text.find('\'') != std::string::npos, dbl = text.find('"') != std::string::npos;
  char quote = single && !dbl ? '"' : '\'';
  std::string out(1, quote);
  for (size_t pos = 0; pos < text.size();) {
    uint32_t c = NextCodepoint(text, &pos);
    char buffer[16];
    if (c == static_cast<uint32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f || (c >= 0x80 && c < 0xa1) || (c != ' ' && IsPythonSpace(c))) {
      std::snprintf(buffer, sizeof(buffer), c < 0x100 ? "\\x%02x" : "\\u%04x", c);
      out += buffer;
    } else {
      AppendUtf8(c, &out);
    }
  }
  out += quote;
  return out;
}

// str() of a container past this size is an Error (kLimit) rather than minutes of work.
constexpr size_t kMaxReprBytes = size_t{64} << 20;

void CheckReprSize(const std::string& out) {
  if (out.size() > kMaxReprBytes) throw Error(Error::kLimit, 0, "str() of a value over 64 MiB");
}

std::string ReprOrStr(const Value& value, bool repr) {
  switch (value.type()) {
    case Value::Type::kUndefined:
      return "";
    case Value::Type::kNone:
      return "None";
    case Value::Type::kBool:
      return value.boolean() ? "True" : "False";
    case Value::Type::kInt:
      return std::to_string(value.integer());
    case Value::Type::kFloat:
      return PythonFloatRepr(value.number());
    case Value::Type::kString:
      return repr ? ReprString(value.string()) : value.string();
    case Value::Type::kList: {
      const ListData& list = value.list();
      std::string out = list.tuple ? "(" : "[";
      for (size_t i = 0; i < list.items.size(); ++i) {
        if (i) out += ", ";
        out += ReprOrStr(list.items[i], true);
        CheckReprSize(out);
      }
      if (list.tuple && list.items.size() == 1) out += ",";
      return out + (list.tuple ? ")" : "]");
    }
    case Value::Type::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, item] : value.dict().items) {
        if (!first) out += ", ";
        first = false;
        out += ReprString(key) + ": " + ReprOrStr(item, true);
        CheckReprSize(out);
      }
      return out + "}";
    }
    case Value::Type::kNamespace: {
      std::string out = "<Namespace {";
      bool first = true;
      for (const auto& [key, item] : value.dict().items) {
        if (!first) out += ", ";
        first = false;
        out += ReprString(key) + ": " + ReprOrStr(item, true);
      }
      return out + "}>";
    }
    case Value::Type::kCallable:
      return "<function " + value.callable_name() + ">";
  }
  return "";
}

}  // namespace

std::string ToString(const Value& value) {
  return ReprOrStr(value, false);
}
std::string Repr(const Value& value) {
  return ReprOrStr(value, true);
}

bool Equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.type() != Value::Type::kFloat && b.type() != Value::Type::kFloat)
      return a.integer() == b.integer();
    return a.number() == b.number();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Value::Type::kUndefined:
    case Value::Type::kNone:
      return true;
    case Value::Type::kString:
      return a.string() == b.string();
    case Value::Type::kList: {
      const auto &x = a.list().items, &y = b.list().items;
      if (a.list().tuple != b.list().tuple || x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!Equal(x[i], y[i])) return false;
      return true;
    }
    case Value::Type::kDict: {
      const auto &x = a.dict().items, &y = b.dict().items;
      if (x.size() != y.size()) return false;
      for (const auto& [key, item] : x) {
        const Value* other = b.dict().Find(key);
        if (!other || !Equal(item, *other)) return false;
      }
      return true;
    }
    default:
      return a.identity() == b.identity();  // namespaces and callables: identity
  }
}

int Compare(const Value& a, const Value& b, int line) {
  if (a.is_number() && b.is_number()) {
    if (a.type() != Value::Type::kFloat && b.type() != Value::Type::kFloat)
      return a.integer() < b.integer() ? -1 : a.integer() > b.integer() ? 1 : 0;
    return a.number() < b.number() ? -1 : a.number() > b.number() ? 1 : 0;
  }
  if (a.is_string() && b.is_string())
    return a.string().compare(b.string()) < 0 ? -1 : a.string() == b.string() ? 0 : 1;
  if (a.type() == Value::Type::kList && b.type() == Value::Type::kList &&
      a.list().tuple == b.list().tuple) {
    const auto &x = a.list().items, &y = b.list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equal(x[i], y[i])) continue;
      return Compare(x[i], y[i], line);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  throw Error(
      Error::kRuntime, line,
      "'<' not supported between instances of '" + TypeName(a) + "' and '" + TypeName(b) + "'");
}

Value FromJson(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t v = json.get<uint64_t>();
      if (v > static_cast<uint64_t>(INT64_MAX))
        throw Error(Error::kUnsupported, 0, "an integer above 2^63-1 in the template's input");
      return Value(static_cast<int64_t>(v));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      for (const auto& item : json) items.push_back(FromJson(item));
      return Value::List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      DictData dict;
      for (const auto& [key, item] : json.items()) dict.items.emplace_back(key, FromJson(item));
      return Value::Dict(std::move(dict));
    }
    default:
      throw Error(Error::kUnsupported, 0, "a binary value in the template's input");
  }
}

namespace {

void JsonString(const std::string& text, bool ensure_ascii, std::string* out) {
  *out += '"';
  for (size_t pos = 0; pos < text.size();) {
    uint32_t c = NextCodepoint(text, &pos);
    char buffer[16];
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20 || (ensure_ascii && c >= 0x7f)) {
          if (c >= 0x10000) {  // a surrogate pair, as json.dumps writes it
            uint32_t v = c - 0x10000;
            std::snprintf(buffer, sizeof(buffer), "\\u%04x\\u%04x", 0xd800 + (v >> 10),
                          0xdc00 + (v & 0x3ff));
          } else {
            std::snprintf(buffer, sizeof(buffer), "\\u%04x", c);
          }
          *out += buffer;
        } else {
          AppendUtf8(c, out);
        }
    }
  }
  *out += '"';
}

void JsonValue(const Value& value, const JsonOptions& options, int depth, int line,
               std::string* out) {
  if (depth > 200) throw Error(Error::kLimit, line, "tojson: the value nests more than 200 deep");
  auto newline = [&](int level) {
    if (options.indent < 0) return;
    *out += '\n';
    out->append(static_cast<size_t>(options.indent) * static_cast<size_t>(level), ' ');
  };
  switch (value.type()) {
    case Value::Type::kNone:
      *out += "null";
      return;
    case Value::Type::kBool:
      *out += value.boolean() ? "true" : "false";
      return;
    case Value::Type::kInt:
      *out += std::to_string(value.integer());
      return;
    case Value::Type::kFloat: {
      double v = value.number();
      *out += std::isnan(v)   ? "NaN"
              : std::isinf(v) ? (v < 0 ? "-Infinity" : "Infinity")
                              : PythonFloatRepr(v);
      return;
    }
    case Value::Type::kString:
      JsonString(value.string(), options.ensure_ascii, out);
      return;
    case Value::Type::kList: {
      const auto& items = value.list().items;
      if (items.empty()) {
        *out += "[]";
        return;
      }
      *out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) *out += options.item_separator;
        newline(depth + 1);
        JsonValue(items[i], options, depth + 1, line, out);
      }
      newline(depth);
      *out += ']';
      return;
    }
    case Value::Type::kDict: {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : value.dict().items) items.push_back(&item);
      if (items.empty()) {
        *out += "{}";
        return;
      }
      if (options.sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      *out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) *out += options.item_separator;
        newline(depth + 1);
        JsonString(items[i]->first, options.ensure_ascii, out);
        *out += options.key_separator;
        JsonValue(items[i]->second, options, depth + 1, line, out);
      }
      newline(depth);
      *out += '}';
      return;
    }
    default:
      throw Error(Error::kRuntime, line,
                  "Object of type " + TypeName(value) + " is not JSON serializable");
  }
}

}  // namespace

std::string ToJson(const Value& value, const JsonOptions& options, int line) {
  std::string out;
  JsonValue(value, options, 0, line, &out);
  return out;
}

}  // namespace crucible::jinja
