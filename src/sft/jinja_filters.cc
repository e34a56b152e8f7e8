// The filters, tests and global functions of chat templates (jinja_builtins.h): Jinja 3.1's
// built-ins (jinja2/filters.py, jinja2/tests.py) and the globals transformers adds. `tojson` is
// transformers' (json.dumps, ensure_ascii off, keys in insertion order), not Jinja's.
//
// Filters: abs capitalize count d default e escape first float indent int items join last length
// list lower map max min reject rejectattr replace reverse round safe select selectattr sort
// string sum title tojson trim unique upper. Tests: boolean callable defined divisibleby eq
// equalto escaped even false float ge greaterthan gt in integer iterable le lessthan lower lt
// mapping ne none number odd sameas sequence string true undefined upper == != < <= > >=.
// Globals: range (at most 100000 items, as jinja2's sandbox), dict, namespace, raise_exception;
// strftime_now, lipsum, cycler and joiner are Error::kUnsupported (a rendering must not depend on
// the clock). Any other filter or test is Error::kUnsupported naming it.
#include <algorithm>
#include <cmath>

#include "sft/jinja_builtins.h"

namespace crucible::jinja {
namespace {

int64_t Length(const Value& value, int line) {
  switch (value.type()) {
    case Value::Type::kUndefined:
      return 0;
    case Value::Type::kString:
      return static_cast<int64_t>(Codepoints(value.string()).size());
    case Value::Type::kList:
      return static_cast<int64_t>(value.list().items.size());
    case Value::Type::kDict:
      return static_cast<int64_t>(value.dict().items.size());
    default:
      RuntimeError(line, "object of type '" + TypeName(value) + "' has no len()");
  }
}

// Jinja's make_attrgetter: "a.b.0" looked up part by part (digits as indices).
Value AttributePath(const Value& item, const std::string& path, int line) {
  Value value = item;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    value = digits ? GetItem(value, Value(static_cast<int64_t>(std::stoll(part))), line)
                   : GetItem(value, Value(part), line);
    if (dot == std::string::npos) return value;
    start = dot + 1;
  }
}

std::string HtmlEscape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

bool IsLineBreak(uint32_t c) {
  return c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e ||
         c == 0x85 || c == 0x2028 || c == 0x2029;
}

// Jinja's |indent: text + "\n" split into lines (str.splitlines), joined with "\n" + indention.
std::string Indent(const std::string& text, const std::string& indention, bool first, bool blank) {
  std::vector<uint32_t> cps = Codepoints(text + "\n");
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (!IsLineBreak(cps[i])) continue;
    lines.push_back(FromCodepoints(cps, start, i));
    if (cps[i] == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    start = i + 1;
  }
  if (start < cps.size()) lines.push_back(FromCodepoints(cps, start, cps.size()));
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) out += "\n";
    if (i && (blank || !lines[i].empty())) out += indention;
    out += lines[i];
  }
  return first ? indention + out : out;
}

// The sort key of sort/unique/min/max: the attribute, lower-cased unless case-sensitive.
Value SortKey(const Value& item, const Value* attribute, bool case_sensitive, int line) {
  Value key =
      attribute && !attribute->is_none() ? AttributePath(item, ToString(*attribute), line) : item;
  if (!case_sensitive && key.is_string()) {
    CallArgs none;
    return GetAttribute(key, "lower", line).Call(none);
  }
  return key;
}

Value SelectOrReject(const Value& input, CallArgs& call, bool select, bool by_attribute, int line) {
  std::vector<Value> args = call.positional;
  if (!call.keywords.empty()) Unsupported(line, "keyword arguments to select/reject");
  std::string attribute;
  if (by_attribute) {
    if (args.empty()) RuntimeError(line, "selectattr/rejectattr need an attribute");
    attribute = ToString(args[0]);
    args.erase(args.begin());
  }
  std::string test;
  if (!args.empty()) {
    test = ToString(args[0]);
    args.erase(args.begin());
  }
  std::vector<Value> out;
  for (const Value& item : Iterate(input, line)) {
    Value subject = by_attribute ? AttributePath(item, attribute, line) : item;
    bool passed;
    if (test.empty()) {
      passed = Truthy(subject);
    } else {
      CallArgs test_args;
      test_args.positional = args;
      passed = ApplyTest(test, subject, test_args, line);
    }
    if (passed == select) out.push_back(item);
  }
  return Value::List(std::move(out));
}

Value ToJsonFilter(const Value& input, CallArgs& call, int line) {
  BoundArgs args(call, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"}, line);
  JsonOptions options;
  options.ensure_ascii = args.Get(0) && Truthy(*args.Get(0));
  if (const Value* indent = args.Get(1); indent && !indent->is_none()) {
    if (indent->type() != Value::Type::kInt)
      Unsupported(line, "tojson(indent=) other than an integer");
    options.indent = static_cast<int>(std::clamp<int64_t>(indent->integer(), 0, 64));
    options.item_separator = ",";
  }
  if (const Value* separators = args.Get(2); separators && !separators->is_none()) {
    std::vector<Value> parts = Iterate(*separators, line);
    if (parts.size() != 2 || !parts[0].is_string() || !parts[1].is_string())
      RuntimeError(line, "tojson(separators=) must be two strings");
    options.item_separator = parts[0].string();
    options.key_separator = parts[1].string();
  }
  options.sort_keys = args.Get(3) && Truthy(*args.Get(3));
  return ToJson(input, options, line);
}

Value Round(const Value& input, CallArgs& call, int line) {
  BoundArgs args(call, "round", {"precision", "method"}, line);
  int64_t precision = args.Get(0) ? args.Get(0)->integer() : 0;
  std::string method = args.Get(1) ? ToString(*args.Get(1)) : "common";
  if (precision != 0) Unsupported(line, "round() with a precision other than 0");
  if (!input.is_number()) RuntimeError(line, "round() of '" + TypeName(input) + "'");
  if (method == "common") {
    if (input.type() != Value::Type::kFloat) return Value(input.integer());
    return Value(std::nearbyint(input.number()));  // round half to even, as Python
  }
  if (method == "floor") return Value(std::floor(input.number()));
  if (method == "ceil") return Value(std::ceil(input.number()));
  RuntimeError(line, "method must be common, ceil or floor");
}

Value ParseNumber(const Value& input, bool floating, const Value& fallback) {
  if (input.is_number()) {
    if (floating) return Value(input.number());
    return input.type() == Value::Type::kFloat
               ? Value(static_cast<int64_t>(std::trunc(input.number())))
               : Value(input.integer());
  }
  if (!input.is_string()) return fallback;
  std::string text = PythonStrip(input.string(), nullptr, true, true);
  text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
  if (text.empty()) return fallback;
  char* end = nullptr;
  if (!floating) {
    errno = 0;
    long long value = std::strtoll(text.c_str(), &end, 10);
    if (*end == 0 && errno == 0) return Value(static_cast<int64_t>(value));
  }
  double value = std::strtod(text.c_str(), &end);
  if (*end != 0) return fallback;
  if (floating) return Value(value);
  if (!std::isfinite(value) || std::fabs(value) > 9e18) return fallback;
  return Value(static_cast<int64_t>(std::trunc(value)));
}

}  // namespace

Value ApplyFilter(const std::string& name, const Value& input, CallArgs& call, int line) {
  const std::string label = "filter '" + name + "'";
  auto no_args = [&] { BoundArgs args(call, label, {}, line); };
  if (name == "length" || name == "count") {
    no_args();
    return Value(Length(input, line));
  }
  if (name == "trim") {
    BoundArgs args(call, label, {"chars"}, line);
    const Value* chars = args.Get(0);
    if (chars && !chars->is_none()) {
      std::string set = ToString(*chars);
      return PythonStrip(ToString(input), &set, true, true);
    }
    return PythonStrip(ToString(input), nullptr, true, true);
  }
  if (name == "tojson") return ToJsonFilter(input, call, line);
  if (name == "string" || name == "safe") {
    no_args();
    return ToString(input);
  }
  if (name == "e" || name == "escape") {
    no_args();
    return HtmlEscape(ToString(input));
  }
  if (name == "default" || name == "d") {
    BoundArgs args(call, label, {"default_value", "boolean"}, line);
    bool boolean = args.Get(1) && Truthy(*args.Get(1));
    if (input.is_undefined() || (boolean && !Truthy(input))) return args.Or(0, Value(""));
    return input;
  }
  if (name == "upper" || name == "lower" || name == "capitalize") {
    no_args();
    CallArgs none;
    return GetAttribute(Value(ToString(input)), name, line).Call(none);
  }
  if (name == "title") {
    no_args();
    std::string text = ToString(input);
    CallArgs none;
    std::string lower =
        GetAttribute(Value(text), "lower", line).Call(none).string();  // ASCII check
    bool start = true;
    for (char& c : lower) {
      if (start) c = static_cast<char>(::toupper(static_cast<unsigned char>(c)));
      start = std::isspace(static_cast<unsigned char>(c)) || c == '-' || c == '(' || c == '{' ||
              c == '[' || c == '<';
    }
    return lower;
  }
  if (name == "replace") {
    BoundArgs args(call, label, {"old", "new", "count"}, line);
    if (!args.Get(0) || !args.Get(1)) RuntimeError(line, label + " needs old and new");
    CallArgs method;
    method.positional = {*args.Get(0), *args.Get(1)};
    if (args.Get(2) && !args.Get(2)->is_none()) method.positional.push_back(*args.Get(2));
    return GetAttribute(Value(ToString(input)), "replace", line).Call(method);
  }
  if (name == "first" || name == "last") {
    no_args();
    if (input.type() == Value::Type::kDict && name == "last") {
      const auto& items = input.dict().items;
      return items.empty() ? Value::Undefined("last") : Value(items.back().first);
    }
    std::vector<Value> items = Iterate(input, line);
    if (items.empty()) return Value::Undefined(name);
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    no_args();
    return Value::List(Iterate(input, line));
  }
  if (name == "join") {
    BoundArgs args(call, label, {"d", "attribute"}, line);
    std::string separator = args.Get(0) ? ToString(*args.Get(0)) : "";
    std::string out;
    bool first = true;
    for (const Value& item : Iterate(input, line)) {
      if (!first) out += separator;
      first = false;
      out += ToString(args.Get(1) && !args.Get(1)->is_none()
                          ? AttributePath(item, ToString(*args.Get(1)), line)
                          : item);
      if (out.size() > (size_t{64} << 20))
        throw Error(Error::kLimit, line, "join built a string over 64 MiB");
    }
    return out;
  }
  if (name == "reverse") {
    no_args();
    if (input.is_string()) {
      std::vector<uint32_t> cps = Codepoints(input.string());
      std::reverse(cps.begin(), cps.end());
      return FromCodepoints(cps, 0, cps.size());
    }
    std::vector<Value> items = Iterate(input, line);
    std::reverse(items.begin(), items.end());
    return Value::List(std::move(items));
  }
  if (name == "items") {
    no_args();
    if (input.is_undefined()) return Value::List({});
    if (input.type() != Value::Type::kDict)
      RuntimeError(line, "Can only get item pairs from a mapping.");
    std::vector<Value> out;
    for (const auto& [key, value] : input.dict().items)
      out.push_back(Value::List({Value(key), value}, true));
    return Value::List(std::move(out));
  }
  if (name == "map") {
    std::vector<Value> out;
    const Value* attribute = nullptr;
    const Value* fallback = nullptr;
    for (const auto& [key, value] : call.keywords) {
      if (key == "attribute")
        attribute = &value;
      else if (key == "default")
        fallback = &value;
      else
        Unsupported(line, "map() with keyword '" + key + "'");
    }
    if (attribute) {
      for (const Value& item : Iterate(input, line)) {
        Value v = AttributePath(item, ToString(*attribute), line);
        out.push_back(v.is_undefined() && fallback ? *fallback : v);
      }
      return Value::List(std::move(out));
    }
    if (call.positional.empty()) RuntimeError(line, "map requires a filter argument");
    std::string filter = ToString(call.positional[0]);
    for (const Value& item : Iterate(input, line)) {
      CallArgs filter_args;
      filter_args.positional.assign(call.positional.begin() + 1, call.positional.end());
      out.push_back(ApplyFilter(filter, item, filter_args, line));
    }
    return Value::List(std::move(out));
  }
  if (name == "select" || name == "reject")
    return SelectOrReject(input, call, name == "select", false, line);
  if (name == "selectattr" || name == "rejectattr")
    return SelectOrReject(input, call, name == "selectattr", true, line);
  if (name == "sort" || name == "unique" || name == "min" || name == "max") {
    std::vector<std::string> names =
        name == "sort" ? std::vector<std::string>{"reverse", "case_sensitive", "attribute"}
                       : std::vector<std::string>{"case_sensitive", "attribute"};
    BoundArgs args(call, label, names, line);
    size_t offset = name == "sort" ? 1 : 0;
    bool reverse = name == "sort" && args.Get(0) && Truthy(*args.Get(0));
    bool case_sensitive = args.Get(offset) && Truthy(*args.Get(offset));
    const Value* attribute = args.Get(offset + 1);
    std::vector<Value> items = Iterate(input, line);
    std::vector<std::pair<Value, Value>> keyed;
    for (const Value& item : items)
      keyed.emplace_back(SortKey(item, attribute, case_sensitive, line), item);
    if (name == "unique") {
      std::vector<Value> out, seen;
      for (const auto& entry : keyed) {
        const Value& key = entry.first;
        if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return Equal(s, key); }))
          continue;
        seen.push_back(key);
        out.push_back(entry.second);
      }
      return Value::List(std::move(out));
    }
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
      return reverse ? Compare(b.first, a.first, line) < 0 : Compare(a.first, b.first, line) < 0;
    });
    if (name == "sort") {
      std::vector<Value> out;
      for (auto& [key, item] : keyed) out.push_back(item);
      return Value::List(std::move(out));
    }
    if (keyed.empty()) return Value::Undefined(name);
    return name == "min" ? keyed.front().second : keyed.back().second;
  }
  if (name == "sum") {
    BoundArgs args(call, label, {"attribute", "start"}, line);
    Value total = args.Or(1, Value(int64_t{0}));
    for (const Value& item : Iterate(input, line)) {
      Value v = args.Get(0) && !args.Get(0)->is_none()
                    ? AttributePath(item, ToString(*args.Get(0)), line)
                    : item;
      total = BinaryOperation("+", total, v, line);
    }
    return total;
  }
  if (name == "abs") {
    no_args();
    if (!input.is_number())
      RuntimeError(line, "bad operand type for abs(): '" + TypeName(input) + "'");
    if (input.type() == Value::Type::kFloat) return Value(std::fabs(input.number()));
    return input.integer() < 0 ? Negate(input, true, line) : Value(input.integer());
  }
  if (name == "int" || name == "float") {
    BoundArgs args(call, label, {"default", "base"}, line);
    if (args.Get(1)) Unsupported(line, "int(base=)");
    Value fallback = args.Or(0, name == "int" ? Value(int64_t{0}) : Value(0.0));
    return ParseNumber(input, name == "float", fallback);
  }
  if (name == "round") return Round(input, call, line);
  if (name == "indent") {
    BoundArgs args(call, label, {"width", "first", "blank"}, line);
    std::string indention = "    ";
    if (const Value* width = args.Get(0))
      indention =
          width->is_string()
              ? width->string()
              : std::string(static_cast<size_t>(std::clamp<int64_t>(width->integer(), 0, 1024)),
                            ' ');
    return Indent(ToString(input), indention, args.Get(1) && Truthy(*args.Get(1)),
                  args.Get(2) && Truthy(*args.Get(2)));
  }
  Unsupported(line, label);
}

bool ApplyTest(const std::string& name, const Value& input, CallArgs& call, int line) {
  const std::string label = "test '" + name + "'";
  auto arg = [&]() -> const Value& {
    BoundArgs args(call, label, {"other"}, line);
    if (!args.Get(0)) RuntimeError(line, label + " needs an argument");
    return *args.Get(0);
  };
  auto no_args = [&] { BoundArgs args(call, label, {}, line); };
  using T = Value::Type;
  if (name == "defined" || name == "undefined") {
    no_args();
    return input.is_undefined() == (name == "undefined");
  }
  if (name == "none") return no_args(), input.is_none();
  if (name == "string") return no_args(), input.is_string();
  if (name == "number") return no_args(), input.is_number();
  if (name == "integer") return no_args(), input.type() == T::kInt;
  if (name == "float") return no_args(), input.type() == T::kFloat;
  if (name == "boolean") return no_args(), input.type() == T::kBool;
  if (name == "true" || name == "false")
    return no_args(), input.type() == T::kBool && input.boolean() == (name == "true");
  if (name == "mapping") return no_args(), input.type() == T::kDict;
  if (name == "iterable")
    return no_args(), input.is_undefined() || input.is_string() || input.type() == T::kList ||
                          input.type() == T::kDict;
  if (name == "sequence")
    return no_args(), input.is_undefined() || input.is_string() || input.type() == T::kList ||
                          input.type() == T::kDict;
  if (name == "callable") return no_args(), input.type() == T::kCallable;
  if (name == "escaped") return no_args(), false;
  if (name == "odd" || name == "even") {
    no_args();
    if (input.type() != T::kInt && input.type() != T::kBool)
      RuntimeError(line, label + " of '" + TypeName(input) + "'");
    return (input.integer() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    const Value& other = arg();
    if (!input.is_number() || !other.is_number()) RuntimeError(line, label + " of non-numbers");
    if (other.number() == 0) RuntimeError(line, "integer division or modulo by zero");
    Value rest = BinaryOperation("%", input, other, line);
    return rest.number() == 0;
  }
  if (name == "lower" || name == "upper") {
    no_args();
    CallArgs none;
    return Truthy(
        GetAttribute(Value(ToString(input)), name == "lower" ? "islower" : "isupper", line)
            .Call(none));
  }
  if (name == "sameas") {
    const Value& other = arg();
    if (input.type() != other.type()) return false;
    if (input.type() == T::kList || input.type() == T::kDict || input.type() == T::kNamespace ||
        input.type() == T::kCallable)
      return input.identity() == other.identity();
    return Equal(input, other);
  }
  if (name == "in") return Contains(arg(), input, line);
  if (name == "eq" || name == "equalto" || name == "==") return Equal(input, arg());
  if (name == "ne" || name == "!=") return !Equal(input, arg());
  int order = 0;
  const bool ordered = name == "lt" || name == "lessthan" || name == "<" || name == "le" ||
                       name == "<=" || name == "gt" || name == "greaterthan" || name == ">" ||
                       name == "ge" || name == ">=";
  if (ordered) {
    const Value& other = arg();
    for (const Value* v : {&input, &other})
      if (v->is_undefined()) RuntimeError(line, "'" + v->undefined_name() + "' is undefined");
    order = Compare(input, other, line);
    if (name == "lt" || name == "lessthan" || name == "<") return order < 0;
    if (name == "le" || name == "<=") return order <= 0;
    if (name == "gt" || name == "greaterthan" || name == ">") return order > 0;
    return order >= 0;
  }
  Unsupported(line, label);
}

Value GlobalFunction(const std::string& name) {
  if (name == "range") {
    return Value::Callable("range", [](CallArgs& call) -> Value {
      if (!call.keywords.empty() || call.positional.empty() || call.positional.size() > 3)
        throw Error(Error::kRuntime, 0, "range() takes 1 to 3 positional arguments");
      std::vector<int64_t> a;
      for (const Value& v : call.positional) {
        if (v.type() != Value::Type::kInt && v.type() != Value::Type::kBool)
          throw Error(Error::kRuntime, 0,
                      "'" + TypeName(v) + "' object cannot be interpreted as an integer");
        a.push_back(v.integer());
      }
      int64_t start = a.size() > 1 ? a[0] : 0, stop = a.size() > 1 ? a[1] : a[0],
              step = a.size() > 2 ? a[2] : 1;
      if (step == 0) throw Error(Error::kRuntime, 0, "range() arg 3 must not be zero");
      double count = std::ceil((static_cast<double>(stop) - static_cast<double>(start)) /
                               static_cast<double>(step));
      if (count > 100000)
        throw Error(Error::kLimit, 0,
                    "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
      std::vector<Value> out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.emplace_back(i);
      return Value::List(std::move(out));
    });
  }
  if (name == "namespace" || name == "dict") {
    bool is_namespace = name == "namespace";
    return Value::Callable(name, [is_namespace](CallArgs& call) -> Value {
      DictData data;
      if (call.positional.size() > 1)
        throw Error(Error::kRuntime, 0, "namespace()/dict() take at most one positional argument");
      if (!call.positional.empty()) {
        const Value& source = call.positional[0];
        if (source.type() == Value::Type::kDict || source.type() == Value::Type::kNamespace) {
          for (const auto& [key, value] : source.dict().items) data.Set(key, value);
        } else {
          for (const Value& pair : Iterate(source, 0)) {
            std::vector<Value> kv = Iterate(pair, 0);
            if (kv.size() != 2 || !kv[0].is_string())
              throw Error(Error::kUnsupported, 0, "dict() from pairs without string keys");
            data.Set(kv[0].string(), kv[1]);
          }
        }
      }
      for (const auto& [key, value] : call.keywords) data.Set(key, value);
      return is_namespace ? Value::Namespace(std::move(data)) : Value::Dict(std::move(data));
    });
  }
  if (name == "raise_exception") {
    return Value::Callable(name, [](CallArgs& call) -> Value {
      std::string message = call.positional.empty() ? "" : ToString(call.positional[0]);
      throw Error(Error::kRaised, 0, message);
    });
  }
  if (name == "strftime_now" || name == "lipsum" || name == "cycler" || name == "joiner") {
    return Value::Callable(name, [name](CallArgs&) -> Value {
      throw Error(Error::kUnsupported, 0, "function '" + name + "()'");
    });
  }
  return Value::Undefined(name);
}

}  // namespace crucible::jinja
