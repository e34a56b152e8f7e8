#include "tokenizer/decoder.h"

#include "common/error.h"
#include "tokenizer/regex.h"
#include "tokenizer/replace_pattern.h"
#include "tokenizer/utf8.h"

namespace crucible {

using json = nlohmann::json;

struct Decoder::Step {
  virtual ~Step() = default;
  virtual std::vector<std::string> Apply(std::vector<std::string> tokens) const = 0;
  virtual bool is_byte_level() const { return false; }
};

namespace {

std::string Type(const json& value) {
  return value.is_object() && value.contains("type") && value["type"].is_string()
             ? value["type"].get<std::string>()
             : std::string();
}

// A JSON string holding exactly one character (Rust's `char` fields), as its UTF-8.
std::string OneChar(const json& value, const char* key, const std::string& where,
                    const std::string& what) {
  if (!value.contains(key) || !value[key].is_string())
    throw DataError(where + ": " + what + " needs a \"" + key + "\" character");
  const std::string s = value[key].get<std::string>();
  size_t pos = 0;
  if (s.empty() || !IsValidUtf8(s) || (NextCodepoint(s, &pos), pos != s.size()))
    throw DataError(where + ": " + what + " \"" + key + "\" must be one character, got " +
                    value[key].dump());
  return s;
}

struct ByteLevelDecode : Decoder::Step {
  std::vector<std::string> Apply(std::vector<std::string> tokens) const override {
    std::string bytes, one;
    for (const std::string& t : tokens) {
      if (ByteLevelToBytes(t, &one))
        bytes += one;
      else
        bytes += t;
    }
    return {IsValidUtf8(bytes) ? bytes : RepairUtf8(bytes)};
  }
  bool is_byte_level() const override { return true; }
};

// Replace: each match of the pattern in each token becomes `content` (an empty token has no
// match, as in tokenizers' find_matches).
struct ReplaceDecode : Decoder::Step {
  explicit ReplaceDecode(ReplacePattern p) : pattern(std::move(p)) {}
  ReplacePattern pattern;
  std::vector<std::string> Apply(std::vector<std::string> tokens) const override {
    static thread_local RegexScratch scratch;
    for (std::string& t : tokens) {
      if (t.empty()) continue;
      std::string out;
      size_t previous = 0;
      pattern.ForEachMatch(t, scratch, [&](size_t start, size_t end) {
        out.append(t, previous, start - previous);
        out += pattern.content();
        previous = end;
      });
      out.append(t, previous, std::string::npos);
      t = std::move(out);
    }
    return tokens;
  }
};

// ByteFallback: a run of <0xNN> tokens becomes its bytes as one token when they are valid UTF-8,
// else one U+FFFD per byte. NN is read as Rust's u8::from_str_radix(_, 16) reads it (a leading
// '+' is accepted).
struct ByteFallbackDecode : Decoder::Step {
  static int ByteOf(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    int value = 0;
    size_t i = 3;
    if (t[i] == '+') ++i;
    if (i == 5) return -1;
    for (; i < 5; ++i) {
      const char c = t[i];
      const int digit = c >= '0' && c <= '9'   ? c - '0'
                        : c >= 'a' && c <= 'f' ? c - 'a' + 10
                        : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                               : -1;
      if (digit < 0) return -1;
      value = value * 16 + digit;
    }
    return value;
  }
  std::vector<std::string> Apply(std::vector<std::string> tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (IsValidUtf8(pending)) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
    };
    for (std::string& t : tokens) {
      const int byte = ByteOf(t);
      if (byte >= 0) {
        pending.push_back(static_cast<char>(byte));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    return out;
  }
};

struct FuseDecode : Decoder::Step {
  std::vector<std::string> Apply(std::vector<std::string> tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    return {all};
  }
};

// Strip: up to `start` leading and `stop` trailing copies of one character from each token.
struct StripDecode : Decoder::Step {
  std::string content;
  size_t start = 0, stop = 0;
  std::vector<std::string> Apply(std::vector<std::string> tokens) const override {
    for (std::string& t : tokens) {
      size_t begin = 0, end = t.size();
      for (size_t k = 0; k < start && t.compare(begin, content.size(), content) == 0 &&
                         begin + content.size() <= end;
           ++k)
        begin += content.size();
      for (size_t k = 0; k < stop && end >= begin + content.size() &&
                         t.compare(end - content.size(), content.size(), content) == 0;
           ++k)
        end -= content.size();
      t = t.substr(begin, end - begin);
    }
    return tokens;
  }
};

// Metaspace: the replacement character becomes a space; in the first token it is dropped
// (every occurrence, as tokenizers does) unless prepend_scheme is "never".
struct MetaspaceDecode : Decoder::Step {
  std::string replacement;
  bool drop_in_first = true;
  std::vector<std::string> Apply(std::vector<std::string> tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string& t = tokens[i];
      std::string out;
      size_t previous = 0;
      for (size_t at = t.find(replacement); at != std::string::npos;
           at = t.find(replacement, at + replacement.size())) {
        out.append(t, previous, at - previous);
        if (!(i == 0 && drop_in_first)) out += ' ';
        previous = at + replacement.size();
      }
      out.append(t, previous, std::string::npos);
      t = std::move(out);
    }
    return tokens;
  }
};

size_t Count(const json& value, const char* key, const std::string& where) {
  if (!value.contains(key) || !value[key].is_number_unsigned())
    throw DataError(where + ": Strip decoder needs a non-negative \"" + key + "\"");
  return value[key].get<size_t>();
}

void AddSteps(const json& value, const std::string& where,
              std::vector<std::unique_ptr<Decoder::Step>>* steps) {
  if (value.is_null()) return;
  const std::string type = Type(value);
  if (type == "Sequence") {
    if (!value.contains("decoders") || !value["decoders"].is_array())
      throw DataError(where + ": Sequence decoder without a \"decoders\" list");
    for (const auto& item : value["decoders"]) AddSteps(item, where, steps);
  } else if (type == "ByteLevel") {
    steps->push_back(std::make_unique<ByteLevelDecode>());
  } else if (type == "Replace") {
    steps->push_back(
        std::make_unique<ReplaceDecode>(ReplacePattern(value, where, "Replace decoder")));
  } else if (type == "ByteFallback") {
    steps->push_back(std::make_unique<ByteFallbackDecode>());
  } else if (type == "Fuse") {
    steps->push_back(std::make_unique<FuseDecode>());
  } else if (type == "Strip") {
    auto step = std::make_unique<StripDecode>();
    step->content = OneChar(value, "content", where, "Strip decoder");
    step->start = Count(value, "start", where);
    step->stop = Count(value, "stop", where);
    steps->push_back(std::move(step));
  } else if (type == "Metaspace") {
    auto step = std::make_unique<MetaspaceDecode>();
    step->replacement = OneChar(value, "replacement", where, "Metaspace decoder");
    std::string scheme = value.contains("prepend_scheme") && value["prepend_scheme"].is_string()
                             ? value["prepend_scheme"].get<std::string>()
                             : "always";
    if (value.contains("add_prefix_space") && value["add_prefix_space"] == false) {
      if (scheme != "never" && value.contains("prepend_scheme"))
        throw DataError(where +
                        ": Metaspace decoder: add_prefix_space does not match "
                        "prepend_scheme");
      scheme = "never";
    }
    if (scheme != "always" && scheme != "first" && scheme != "never")
      throw DataError(where + ": Metaspace decoder: unknown prepend_scheme \"" + scheme + "\"");
    step->drop_in_first = scheme != "never";
    steps->push_back(std::move(step));
  } else {
    throw DataError(where + ": unsupported decoder \"" + (type.empty() ? value.dump() : type) +
                    "\" (supported: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, "
                    "Sequence)");
  }
}

}  // namespace

Decoder::~Decoder() = default;

std::unique_ptr<Decoder> Decoder::FromJson(const json& value, const std::string& where) {
  std::unique_ptr<Decoder> decoder(new Decoder());
  AddSteps(value, where, &decoder->steps_);
  return decoder;
}

bool Decoder::byte_level_only() const {
  if (steps_.empty()) return false;
  for (const auto& step : steps_)
    if (!step->is_byte_level()) return false;
  return true;
}

std::string Decoder::Decode(std::vector<std::string> tokens) const {
  if (steps_.empty()) {  // no decoder: the tokens joined by spaces
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out += ' ';
      out += tokens[i];
    }
    return out;
  }
  for (const auto& step : steps_) tokens = step->Apply(std::move(tokens));
  std::string out;
  for (const std::string& t : tokens) out += t;
  return IsValidUtf8(out) ? out : RepairUtf8(out);
}

}  // namespace crucible
