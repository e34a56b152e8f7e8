// Attribute and item access, slicing, iteration and the operators of template values, with
// Python's and Jinja's semantics (jinja2/environment.py getattr/getitem, jinja2/sandbox.py): see
// jinja_builtins.h. The methods of str and dict are in jinja_methods.cc, the filters, tests and
// globals in jinja_filters.cc.
#include "sft/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "tokenizer/utf8.h"

namespace crucible::jinja {

const std::string& ExpectString(const Value& value, const std::string& what, int line) {
  if (!value.is_string())
    RuntimeError(line, what + " expects a str, not '" + TypeName(value) + "'");
  return value.string();
}

int64_t ExpectInt(const Value& value, const std::string& what, int line) {
  if (value.type() != Value::Type::kInt && value.type() != Value::Type::kBool)
    RuntimeError(line, what + " expects an int, not '" + TypeName(value) + "'");
  return value.integer();
}

namespace {

constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE

[[noreturn]] void UndefinedError(int line, const Value& value) {
  RuntimeError(line, "'" + value.undefined_name() + "' is undefined");
}

// Python's index normalisation: negative counts from the end; false when out of range.
bool NormaliseIndex(int64_t* index, size_t size) {
  if (*index < 0) *index += static_cast<int64_t>(size);
  return *index >= 0 && *index < static_cast<int64_t>(size);
}

}  // namespace

BoundArgs::BoundArgs(CallArgs& call, const std::string& function,
                     const std::vector<std::string>& names, int line)
    : values_(names.size(), nullptr) {
  if (call.positional.size() > names.size())
    RuntimeError(line, function + " takes at most " + std::to_string(names.size()) +
                           " argument(s), " + std::to_string(call.positional.size()) + " given");
  for (size_t i = 0; i < call.positional.size(); ++i) values_[i] = &call.positional[i];
  for (const auto& [key, value] : call.keywords) {
    auto it = std::find(names.begin(), names.end(), key);
    if (it == names.end())
      RuntimeError(line, function + " got an unexpected keyword argument '" + key + "'");
    size_t index = static_cast<size_t>(it - names.begin());
    if (values_[index])
      RuntimeError(line, function + " got multiple values for argument '" + key + "'");
    values_[index] = &value;
  }
}

Value GetAttribute(const Value& object, const std::string& name, int line) {
  switch (object.type()) {
    case Value::Type::kUndefined:
      UndefinedError(line, object);
    case Value::Type::kString:
      return StringMethod(object.string(), name, line);
    case Value::Type::kDict: {
      Value method = DictMethod(object, name, line);
      if (!method.is_undefined()) return method;
      const Value* found = object.dict().Find(name);
      return found ? *found : Value::Undefined(name);
    }
    case Value::Type::kNamespace: {
      const Value* found = object.dict().Find(name);
      return found ? *found : Value::Undefined(name);
    }
    case Value::Type::kList: {
      static const char* kMethods[] = {"append", "extend",  "insert", "pop",   "remove", "clear",
                                       "sort",   "reverse", "index",  "count", "copy"};
      for (const char* method : kMethods)
        if (name == method) Unsupported(line, "method list." + name + "()");
      return Value::Undefined(name);
    }
    default:
      return Value::Undefined(name);
  }
}

Value GetItem(const Value& object, const Value& key, int line) {
  switch (object.type()) {
    case Value::Type::kUndefined:
      UndefinedError(line, object);
    case Value::Type::kDict:
    case Value::Type::kNamespace:
      if (key.is_string()) {
        if (object.type() == Value::Type::kDict) {
          if (const Value* found = object.dict().Find(key.string())) return *found;
          return GetAttribute(object, key.string(), line);
        }
        return GetAttribute(object, key.string(), line);
      }
      return Value::Undefined(ToString(key));
    case Value::Type::kList:
    case Value::Type::kString: {
      if (key.type() != Value::Type::kInt && key.type() != Value::Type::kBool) {
        if (key.is_string()) return GetAttribute(object, key.string(), line);
        return Value::Undefined(ToString(key));
      }
      int64_t index = key.integer();
      if (object.type() == Value::Type::kList) {
        const auto& items = object.list().items;
        return NormaliseIndex(&index, items.size()) ? items[static_cast<size_t>(index)]
                                                    : Value::Undefined(ToString(key));
      }
      std::vector<uint32_t> cps = Codepoints(object.string());
      if (!NormaliseIndex(&index, cps.size())) return Value::Undefined(ToString(key));
      return FromCodepoints(cps, static_cast<size_t>(index), static_cast<size_t>(index) + 1);
    }
    default:
      if (key.is_string()) return GetAttribute(object, key.string(), line);
      return Value::Undefined(ToString(key));
  }
}

Value SliceOf(const Value& object, const Value& start_value, const Value& stop_value,
              const Value& step_value, int line) {
  if (object.is_undefined()) UndefinedError(line, object);
  if (object.type() != Value::Type::kList && !object.is_string())
    RuntimeError(line, "'" + TypeName(object) + "' object is not subscriptable");
  auto bound = [&](const Value& v) -> std::optional<int64_t> {
    if (v.is_none()) return std::nullopt;
    return ExpectInt(v, "slice", line);
  };
  std::optional<int64_t> start = bound(start_value), stop = bound(stop_value),
                         step_opt = bound(step_value);
  int64_t step = step_opt.value_or(1);
  if (step == 0) RuntimeError(line, "slice step cannot be zero");
  std::vector<uint32_t> cps;
  size_t size =
      object.is_string() ? (cps = Codepoints(object.string())).size() : object.list().items.size();
  const int64_t n = static_cast<int64_t>(size);
  // Python's slice.indices().
  auto adjust = [&](std::optional<int64_t> v, int64_t fallback) {
    if (!v) return fallback;
    int64_t x = *v;
    if (x < 0)
      x = std::max<int64_t>(x + n, step < 0 ? -1 : 0);
    else
      x = std::min<int64_t>(x, step < 0 ? n - 1 : n);
    return x;
  };
  int64_t begin = adjust(start, step < 0 ? n - 1 : 0), end = adjust(stop, step < 0 ? -1 : n);
  std::vector<size_t> picks;
  for (int64_t i = begin; step > 0 ? i < end : i > end; i += step)
    picks.push_back(static_cast<size_t>(i));
  if (object.is_string()) {
    std::string out;
    for (size_t i : picks) AppendUtf8(cps[i], &out);
    return out;
  }
  std::vector<Value> items;
  for (size_t i : picks) items.push_back(object.list().items[i]);
  return Value::List(std::move(items), object.list().tuple);
}

std::vector<Value> Iterate(const Value& value, int line) {
  switch (value.type()) {
    case Value::Type::kUndefined:
      return {};
    case Value::Type::kList:
      return value.list().items;
    case Value::Type::kDict: {
      std::vector<Value> keys;
      for (const auto& item : value.dict().items) keys.emplace_back(item.first);
      return keys;
    }
    case Value::Type::kString: {
      std::vector<Value> chars;
      std::vector<uint32_t> cps = Codepoints(value.string());
      for (size_t i = 0; i < cps.size(); ++i) chars.emplace_back(FromCodepoints(cps, i, i + 1));
      return chars;
    }
    default:
      RuntimeError(line, "'" + TypeName(value) + "' object is not iterable");
  }
}

bool Contains(const Value& container, const Value& item, int line) {
  switch (container.type()) {
    case Value::Type::kUndefined:
      return false;
    case Value::Type::kString:
      if (!item.is_string())
        RuntimeError(line, "'in <string>' requires string as left operand, not " + TypeName(item));
      return container.string().find(item.string()) != std::string::npos;
    case Value::Type::kList:
      return std::any_of(container.list().items.begin(), container.list().items.end(),
                         [&](const Value& v) { return Equal(v, item); });
    case Value::Type::kDict:
      return item.is_string() && container.dict().Find(item.string()) != nullptr;
    default:
      RuntimeError(line, "argument of type '" + TypeName(container) + "' is not iterable");
  }
}

Value Negate(const Value& value, bool minus, int line) {
  if (value.is_undefined()) UndefinedError(line, value);
  if (!value.is_number())
    RuntimeError(line, std::string("bad operand type for unary ") + (minus ? "-" : "+") + ": '" +
                           TypeName(value) + "'");
  if (!minus)
    return value.type() == Value::Type::kFloat ? Value(value.number()) : Value(value.integer());
  if (value.type() == Value::Type::kFloat) return Value(-value.number());
  if (value.integer() == INT64_MIN) Unsupported(line, "integers beyond 64 bits");
  return Value(-value.integer());
}

namespace {

// x op y for 64-bit ints; Python's ints are unbounded, so past 64 bits the template is out of
// this interpreter's reach (kUnsupported).
int64_t CheckedInt(char op, int64_t x, int64_t y, int line) {
  int64_t result = 0;
  bool overflowed = op == '+'   ? __builtin_add_overflow(x, y, &result)
                    : op == '-' ? __builtin_sub_overflow(x, y, &result)
                                : __builtin_mul_overflow(x, y, &result);
  if (overflowed) Unsupported(line, "integers beyond 64 bits");
  return result;
}

Value Repeat(const Value& sequence, int64_t times, int line) {
  times = std::max<int64_t>(times, 0);
  if (sequence.is_string()) {
    if (static_cast<double>(sequence.string().size()) * static_cast<double>(times) > kMaxValueBytes)
      throw Error(Error::kLimit, line, "'*' built a string over 64 MiB");
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += sequence.string();
    return out;
  }
  if (static_cast<double>(sequence.list().items.size()) * static_cast<double>(times) > kMaxRange)
    throw Error(Error::kLimit, line, "'*' built a list over 100000 items");
  std::vector<Value> out;
  for (int64_t i = 0; i < times; ++i)
    out.insert(out.end(), sequence.list().items.begin(), sequence.list().items.end());
  return Value::List(std::move(out), sequence.list().tuple);
}

}  // namespace

Value BinaryOperation(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "~") {
    std::string out = ToString(a) + ToString(b);
    if (out.size() > kMaxValueBytes)
      throw Error(Error::kLimit, line, "'~' built a string over 64 MiB");
    return out;
  }
  if (a.is_undefined()) UndefinedError(line, a);
  if (b.is_undefined()) UndefinedError(line, b);
  auto type_error = [&]() {
    RuntimeError(line, "unsupported operand type(s) for " + op + ": '" + TypeName(a) + "' and '" +
                           TypeName(b) + "'");
  };
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      if (a.string().size() + b.string().size() > kMaxValueBytes)
        throw Error(Error::kLimit, line, "'+' built a string over 64 MiB");
      return a.string() + b.string();
    }
    if (a.type() == Value::Type::kList && b.type() == Value::Type::kList &&
        a.list().tuple == b.list().tuple) {
      std::vector<Value> items = a.list().items;
      items.insert(items.end(), b.list().items.begin(), b.list().items.end());
      return Value::List(std::move(items), a.list().tuple);
    }
  }
  if (op == "*") {
    bool a_int = a.type() == Value::Type::kInt || a.type() == Value::Type::kBool;
    bool b_int = b.type() == Value::Type::kInt || b.type() == Value::Type::kBool;
    if ((a.is_string() || a.type() == Value::Type::kList) && b_int)
      return Repeat(a, b.integer(), line);
    if ((b.is_string() || b.type() == Value::Type::kList) && a_int)
      return Repeat(b, a.integer(), line);
  }
  if (op == "%" && a.is_string()) Unsupported(line, "'%' string formatting");
  if (!a.is_number() || !b.is_number()) type_error();
  bool floats = a.type() == Value::Type::kFloat || b.type() == Value::Type::kFloat;
  if (op == "/") {
    if (b.number() == 0) RuntimeError(line, "division by zero");
    return Value(a.number() / b.number());
  }
  if (!floats) {
    int64_t x = a.integer(), y = b.integer();
    if (op == "+" || op == "-" || op == "*") return Value(CheckedInt(op[0], x, y, line));
    if (op == "//" || op == "%") {
      if (y == 0) RuntimeError(line, "integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) Unsupported(line, "integers beyond 64 bits");
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {  // Python floors
        --q;
        r += y;
      }
      return Value(op == "//" ? q : r);
    }
    if (op == "**") {
      if (y < 0) {
        if (x == 0) RuntimeError(line, "0.0 cannot be raised to a negative power");
        return Value(std::pow(static_cast<double>(x), static_cast<double>(y)));
      }
      if (x == 0 || x == 1) return Value(y == 0 ? int64_t{1} : x);
      if (x == -1) return Value(y % 2 ? int64_t{-1} : int64_t{1});
      int64_t result = 1;  // |x| >= 2: at most 63 steps before an overflow
      for (int64_t i = 0; i < y; ++i) result = CheckedInt('*', result, x, line);
      return Value(result);
    }
  } else {
    double x = a.number(), y = b.number();
    if (op == "+") return Value(x + y);
    if (op == "-") return Value(x - y);
    if (op == "*") return Value(x * y);
    if (op == "//" || op == "%") {  // CPython's float_divmod
      if (y == 0) RuntimeError(line, "float floor division or modulo by zero");
      double mod = std::fmod(x, y), div = (x - mod) / y;
      if (mod != 0) {
        if ((y < 0) != (mod < 0)) {
          mod += y;
          div -= 1.0;
        }
      } else {
        mod = std::copysign(0.0, y);
      }
      if (op == "%") return Value(mod);
      double floor_div = std::copysign(0.0, x / y);
      if (div != 0) {
        floor_div = std::floor(div);
        if (div - floor_div > 0.5) floor_div += 1.0;
      }
      return Value(floor_div);
    }
    if (op == "**") return Value(std::pow(x, y));
  }
  type_error();
  return Value();
}

}  // namespace crucible::jinja
