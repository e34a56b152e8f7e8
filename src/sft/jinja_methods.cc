// The methods of str and dict that chat templates call, with Python's semantics (whitespace is
// str.isspace()'s, indices count code points): see jinja_builtins.h.
//
// str: capitalize count endswith find isalnum isalpha isdigit islower isspace isupper join lower
// lstrip replace rfind rsplit rstrip split splitlines startswith strip title upper.
// dict: get items keys values. Case mapping is ASCII only: upper() of non-ASCII text is
// Error::kUnsupported rather than a guess; so are the methods listed as known but not implemented.
#include <algorithm>

#include "sft/jinja_builtins.h"
#include "tokenizer/utf8.h"

namespace crucible::jinja {
namespace {

bool IsAscii(std::string_view text) {
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

std::string AsciiCase(const std::string& text, const char* what, int line, int (*map)(int)) {
  if (!IsAscii(text)) Unsupported(line, std::string(what) + " of non-ASCII text");
  std::string out = text;
  for (char& c : out) c = static_cast<char>(map(static_cast<unsigned char>(c)));
  return out;
}
std::string Upper(const std::string& s, int line) {
  return AsciiCase(s, "upper()", line, ::toupper);
}
std::string Lower(const std::string& s, int line) {
  return AsciiCase(s, "lower()", line, ::tolower);
}

// str.capitalize(): the first character upper case, the rest lower.
std::string Capitalize(const std::string& s, int line) {
  std::string out = Lower(s, line);
  if (!out.empty()) out[0] = static_cast<char>(::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

// Python's str.title(): a letter after a non-letter is upper case, other letters lower.
std::string PythonTitle(const std::string& s, int line) {
  std::string out = Lower(s, line);
  bool previous_letter = false;
  for (char& c : out) {
    bool letter = std::isalpha(static_cast<unsigned char>(c));
    if (letter && !previous_letter) c = static_cast<char>(::toupper(static_cast<unsigned char>(c)));
    previous_letter = letter;
  }
  return out;
}

// The code point index of `needle` in `haystack` from the left or right; -1 when absent.
int64_t FindCodepoints(const std::string& haystack, const std::string& needle, bool reverse) {
  size_t byte = reverse ? haystack.rfind(needle) : haystack.find(needle);
  if (byte == std::string::npos) return -1;
  return static_cast<int64_t>(Codepoints(std::string_view(haystack).substr(0, byte)).size());
}

std::vector<Value> SplitWhitespace(const std::string& text, int64_t max_split, bool from_right) {
  std::vector<uint32_t> cps = Codepoints(text);
  std::vector<std::pair<size_t, size_t>> words;
  if (!from_right) {
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && IsPythonSpace(cps[i])) ++i;
      if (i == cps.size()) break;
      if (max_split >= 0 && static_cast<int64_t>(words.size()) == max_split) {
        words.emplace_back(i, cps.size());  // the rest keeps its trailing whitespace, as in Python
        break;
      }
      size_t start = i;
      while (i < cps.size() && !IsPythonSpace(cps[i])) ++i;
      words.emplace_back(start, i);
    }
  } else {
    size_t i = cps.size();
    while (i > 0) {
      while (i > 0 && IsPythonSpace(cps[i - 1])) --i;
      if (i == 0) break;
      if (max_split >= 0 && static_cast<int64_t>(words.size()) == max_split) {
        words.emplace_back(0, i);  // the rest keeps its leading whitespace
        break;
      }
      size_t end = i;
      while (i > 0 && !IsPythonSpace(cps[i - 1])) --i;
      words.emplace_back(i, end);
    }
    std::reverse(words.begin(), words.end());
  }
  std::vector<Value> out;
  for (auto [begin, end] : words) out.emplace_back(FromCodepoints(cps, begin, end));
  return out;
}

std::vector<Value> SplitBy(const std::string& text, const std::string& sep, int64_t max_split,
                           bool from_right, int line) {
  if (sep.empty()) RuntimeError(line, "empty separator");
  std::vector<std::string> parts;
  if (!from_right) {
    size_t start = 0;
    while (true) {
      size_t at = text.find(sep, start);
      if (at == std::string::npos ||
          (max_split >= 0 && static_cast<int64_t>(parts.size()) == max_split))
        break;
      parts.push_back(text.substr(start, at - start));
      start = at + sep.size();
    }
    parts.push_back(text.substr(start));
  } else {
    size_t end = text.size();
    while (true) {
      size_t at = end >= sep.size() ? text.rfind(sep, end - sep.size()) : std::string::npos;
      if (at == std::string::npos ||
          (max_split >= 0 && static_cast<int64_t>(parts.size()) == max_split))
        break;
      parts.push_back(text.substr(at + sep.size(), end - at - sep.size()));
      end = at;
    }
    parts.push_back(text.substr(0, end));
    std::reverse(parts.begin(), parts.end());
  }
  std::vector<Value> out;
  for (auto& part : parts) out.emplace_back(std::move(part));
  return out;
}

bool IsLineBoundary(uint32_t c) {
  return c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e ||
         c == 0x85 || c == 0x2028 || c == 0x2029;
}

std::vector<std::string> SplitLines(const std::string& text) {  // str.splitlines()
  std::vector<uint32_t> cps = Codepoints(text);
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (!IsLineBoundary(cps[i])) continue;
    lines.push_back(FromCodepoints(cps, start, i));
    if (cps[i] == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    start = i + 1;
  }
  if (start < cps.size()) lines.push_back(FromCodepoints(cps, start, cps.size()));
  return lines;
}

std::string Replace(const std::string& text, const std::string& old, const std::string& replacement,
                    int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts the replacement around every code point
    std::vector<uint32_t> cps = Codepoints(text);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += replacement;
        ++done;
      }
      if (i < cps.size()) AppendUtf8(cps[i], &out);
    }
    return out;
  }
  size_t start = 0;
  for (int64_t done = 0; count < 0 || done < count; ++done) {
    size_t at = text.find(old, start);
    if (at == std::string::npos) break;
    out += text.substr(start, at - start) + replacement;
    start = at + old.size();
    if (out.size() > kMaxValueBytes)
      throw Error(Error::kLimit, 0, "replace() built a string over 64 MiB");
  }
  return out + text.substr(start);
}

Value Bound(const std::string& name, Function function) {
  return Value::Callable(name, std::move(function));
}

}  // namespace

Value StringMethod(const std::string& text, const std::string& name, int line) {
  const std::string label = "str." + name + "()";
  auto strip = [text, label, line](bool left, bool right) {
    return [text, label, line, left, right](CallArgs& call) -> Value {
      BoundArgs args(call, label, {"chars"}, line);
      const Value* chars = args.Get(0);
      if (chars && !chars->is_none())
        return PythonStrip(text, &ExpectString(*chars, label, line), left, right);
      return PythonStrip(text, nullptr, left, right);
    };
  };
  if (name == "strip") return Bound(label, strip(true, true));
  if (name == "lstrip") return Bound(label, strip(true, false));
  if (name == "rstrip") return Bound(label, strip(false, true));
  if (name == "startswith" || name == "endswith") {
    bool starts = name == "startswith";
    return Bound(label, [text, label, line, starts](CallArgs& call) -> Value {
      BoundArgs args(call, label, {"prefix"}, line);
      if (!args.Get(0)) RuntimeError(line, label + " takes at least 1 argument");
      std::vector<Value> options = args.Get(0)->type() == Value::Type::kList
                                       ? args.Get(0)->list().items
                                       : std::vector<Value>{*args.Get(0)};
      for (const Value& option : options) {
        const std::string& affix = ExpectString(option, label, line);
        bool match = affix.size() <= text.size() &&
                     (starts ? text.compare(0, affix.size(), affix) == 0
                             : text.compare(text.size() - affix.size(), affix.size(), affix) == 0);
        if (match) return Value(true);
      }
      return Value(false);
    });
  }
  if (name == "split" || name == "rsplit") {
    bool right = name == "rsplit";
    return Bound(label, [text, label, line, right](CallArgs& call) -> Value {
      BoundArgs args(call, label, {"sep", "maxsplit"}, line);
      int64_t max_split = args.Get(1) ? ExpectInt(*args.Get(1), label, line) : -1;
      if (!args.Get(0) || args.Get(0)->is_none())
        return Value::List(SplitWhitespace(text, max_split, right));
      return Value::List(
          SplitBy(text, ExpectString(*args.Get(0), label, line), max_split, right, line));
    });
  }
  if (name == "splitlines") {
    return Bound(label, [text, label, line](CallArgs& call) -> Value {
      BoundArgs args(call, label, {"keepends"}, line);
      if (args.Get(0) && Truthy(*args.Get(0))) Unsupported(line, "str.splitlines(keepends=True)");
      std::vector<Value> out;
      for (auto& l : SplitLines(text)) out.emplace_back(std::move(l));
      return Value::List(std::move(out));
    });
  }
  using Transform = std::string (*)(const std::string&, int);
  Transform transform = name == "upper"        ? Upper
                        : name == "lower"      ? Lower
                        : name == "title"      ? PythonTitle
                        : name == "capitalize" ? Capitalize
                                               : nullptr;
  if (transform) {
    return Bound(label, [text, label, line, transform](CallArgs& call) -> Value {
      BoundArgs args(call, label, {}, line);
      return transform(text, line);
    });
  }
  if (name == "replace") {
    return Bound(label, [text, label, line](CallArgs& call) -> Value {
      BoundArgs args(call, label, {"old", "new", "count"}, line);
      if (!args.Get(0) || !args.Get(1)) RuntimeError(line, label + " takes at least 2 arguments");
      int64_t count = args.Get(2) ? ExpectInt(*args.Get(2), label, line) : -1;
      return Replace(text, ExpectString(*args.Get(0), label, line),
                     ExpectString(*args.Get(1), label, line), count);
    });
  }
  if (name == "find" || name == "rfind" || name == "count") {
    return Bound(label, [text, label, line, name](CallArgs& call) -> Value {
      BoundArgs args(call, label, {"sub"}, line);
      if (!args.Get(0)) RuntimeError(line, label + " takes at least 1 argument");
      const std::string& sub = ExpectString(*args.Get(0), label, line);
      if (name != "count") return Value(FindCodepoints(text, sub, name == "rfind"));
      if (sub.empty()) return Value(static_cast<int64_t>(Codepoints(text).size()) + 1);
      int64_t n = 0;
      for (size_t at = text.find(sub); at != std::string::npos;
           at = text.find(sub, at + sub.size()))
        ++n;
      return Value(n);
    });
  }
  if (name == "join") {
    return Bound(label, [text, label, line](CallArgs& call) -> Value {
      BoundArgs args(call, label, {"iterable"}, line);
      if (!args.Get(0)) RuntimeError(line, label + " takes exactly one argument");
      std::string out;
      bool first = true;
      for (const Value& item : Iterate(*args.Get(0), line)) {
        if (!first) out += text;
        first = false;
        out += ExpectString(item, label, line);
        if (out.size() > kMaxValueBytes)
          throw Error(Error::kLimit, line, "join() built a string over 64 MiB");
      }
      return out;
    });
  }
  if (name == "isspace" || name == "isdigit" || name == "isalpha" || name == "isalnum" ||
      name == "isupper" || name == "islower") {
    return Bound(label, [text, label, line, name](CallArgs& call) -> Value {
      BoundArgs args(call, label, {}, line);
      if (name == "isspace") {
        std::vector<uint32_t> cps = Codepoints(text);
        return Value(!cps.empty() && std::all_of(cps.begin(), cps.end(), IsPythonSpace));
      }
      if (!IsAscii(text)) Unsupported(line, label + " of non-ASCII text");
      if (name == "isupper" || name == "islower") {
        bool cased = false;
        for (char c : text) {
          if (!std::isalpha(static_cast<unsigned char>(c))) continue;
          cased = true;
          if ((name == "isupper") != static_cast<bool>(std::isupper(static_cast<unsigned char>(c))))
            return Value(false);
        }
        return Value(cased);
      }
      int (*test)(int) = name == "isdigit" ? ::isdigit : name == "isalpha" ? ::isalpha : ::isalnum;
      return Value(!text.empty() && std::all_of(text.begin(), text.end(), [test](char c) {
        return test(static_cast<unsigned char>(c));
      }));
    });
  }
  static const char* kKnown[] = {
      "format",    "format_map",   "center",      "ljust",        "rjust",        "zfill",
      "index",     "rindex",       "partition",   "rpartition",   "expandtabs",   "encode",
      "casefold",  "swapcase",     "translate",   "removeprefix", "removesuffix", "isnumeric",
      "isdecimal", "isidentifier", "isprintable", "istitle",      "isascii"};
  for (const char* known : kKnown)
    if (name == known) Unsupported(line, "method " + label);
  return Value::Undefined(name);
}

Value DictMethod(const Value& dict, const std::string& name, int line) {
  const std::string label = "dict." + name + "()";
  if (name == "items" || name == "keys" || name == "values") {
    return Bound(label, [dict, label, line, name](CallArgs& call) -> Value {
      BoundArgs args(call, label, {}, line);
      std::vector<Value> out;
      for (const auto& [key, value] : dict.dict().items) {
        if (name == "items")
          out.push_back(Value::List({Value(key), value}, true));
        else
          out.push_back(name == "keys" ? Value(key) : value);
      }
      return Value::List(std::move(out));
    });
  }
  if (name == "get") {
    return Bound(label, [dict, label, line](CallArgs& call) -> Value {
      BoundArgs args(call, label, {"key", "default"}, line);
      if (!args.Get(0)) RuntimeError(line, label + " takes at least 1 argument");
      const Value* found =
          args.Get(0)->is_string() ? dict.dict().Find(args.Get(0)->string()) : nullptr;
      return found ? *found : args.Or(1, Value::None());
    });
  }
  static const char* kKnown[] = {"update", "pop",  "popitem", "setdefault",
                                 "clear",  "copy", "fromkeys"};
  for (const char* known : kKnown)
    if (name == known) Unsupported(line, "method " + label);
  return Value::Undefined(name);
}

}  // namespace crucible::jinja
