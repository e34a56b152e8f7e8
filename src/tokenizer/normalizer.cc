#include "tokenizer/normalizer.h"

#include "common/error.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/describe_steps.h"
#include "tokenizer/replace_pattern.h"
#include "tokenizer/unicode_normalization.h"
#include "tokenizer/utf8.h"

namespace crucible {

using json = nlohmann::json;

struct Normalizer::Step {
  virtual ~Step() = default;
  // in -> *out; returns whether the first character keeps its place (see Normalize).
  virtual bool Apply(std::string_view in, std::string* out, RegexScratch& scratch) const = 0;
  virtual std::string Describe() const = 0;
};

namespace {

struct UnicodeStep : Normalizer::Step {
  explicit UnicodeStep(NormalizationForm f, std::string n) : form(f), name(std::move(n)) {}
  bool Apply(std::string_view in, std::string* out, RegexScratch&) const override {
    NormalizeUnicode(form, in, out);
    return true;
  }
  std::string Describe() const override { return name; }
  NormalizationForm form;
  std::string name;
};

struct LowercaseStep : Normalizer::Step {
  bool Apply(std::string_view in, std::string* out, RegexScratch&) const override {
    AppendLowercase(in, out);
    return true;
  }
  std::string Describe() const override { return "Lowercase"; }
};

// Replace: every match of the pattern (a literal string, or an Oniguruma regex) becomes
// `content`. A match at the start that is not one character (or that content deletes) moves
// the start, as tokenizers' alignments do.
struct ReplaceStep : Normalizer::Step {
  explicit ReplaceStep(ReplacePattern p) : pattern(std::move(p)) {}
  ReplacePattern pattern;
  bool Apply(std::string_view in, std::string* out, RegexScratch& scratch) const override {
    bool kept = true;
    size_t previous = 0;
    if (in.empty()) return true;
    pattern.ForEachMatch(in, scratch, [&](size_t start, size_t end) {
      if (start == 0 && end > 0) {
        size_t first_end = 0;
        NextCodepoint(in, &first_end);
        kept = !pattern.content().empty() && end == first_end;
      }
      out->append(in.substr(previous, start - previous));
      *out += pattern.content();
      previous = end;
    });
    out->append(in.substr(previous));
    return kept;
  }
  std::string Describe() const override {
    return pattern.is_regex() ? "Replace(Regex)" : "Replace(String)";
  }
};

struct PrependStep : Normalizer::Step {
  std::string prefix;
  bool Apply(std::string_view in, std::string* out, RegexScratch&) const override {
    if (!in.empty()) *out += prefix;
    out->append(in);
    return true;
  }
  std::string Describe() const override { return "Prepend"; }
};

// Strip: leading and/or trailing White_Space (Rust's char::is_whitespace).
struct StripStep : Normalizer::Step {
  bool left = false, right = false;
  bool Apply(std::string_view in, std::string* out, RegexScratch&) const override {
    size_t begin = 0, end = in.size();
    if (left) {
      while (begin < end) {
        size_t next = begin;
        if (!IsUnicodeWhitespace(NextCodepoint(in, &next))) break;
        begin = next;
      }
    }
    if (right) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(in[start]) & 0xC0) == 0x80) --start;
        size_t next = start;
        if (!IsUnicodeWhitespace(NextCodepoint(in, &next))) break;
        end = start;
      }
    }
    out->append(in.substr(begin, end - begin));
    return begin == 0;
  }
  std::string Describe() const override {
    return std::string("Strip(") + (left ? "left" : "") + (left && right ? "," : "") +
           (right ? "right" : "") + ")";
  }
};

bool Bool(const json& value, const char* key, const std::string& where) {
  if (!value.contains(key) || !value[key].is_boolean())
    throw DataError(where + ": normalizer " + value.value("type", "?") + " needs \"" + key +
                    "\": true or false");
  return value[key].get<bool>();
}

void AddSteps(const json& value, const std::string& where,
              std::vector<std::unique_ptr<Normalizer::Step>>* steps) {
  if (value.is_null()) return;
  if (!value.is_object() || !value.contains("type") || !value["type"].is_string())
    throw DataError(where + ": normalizer must be an object with a \"type\"");
  const std::string type = value["type"].get<std::string>();
  if (type == "Sequence") {
    if (!value.contains("normalizers") || !value["normalizers"].is_array())
      throw DataError(where + ": Sequence normalizer without a \"normalizers\" list");
    for (const auto& item : value["normalizers"]) AddSteps(item, where, steps);
  } else if (type == "NFC") {
    steps->push_back(std::make_unique<UnicodeStep>(NormalizationForm::kNfc, type));
  } else if (type == "NFD") {
    steps->push_back(std::make_unique<UnicodeStep>(NormalizationForm::kNfd, type));
  } else if (type == "NFKC") {
    steps->push_back(std::make_unique<UnicodeStep>(NormalizationForm::kNfkc, type));
  } else if (type == "NFKD") {
    steps->push_back(std::make_unique<UnicodeStep>(NormalizationForm::kNfkd, type));
  } else if (type == "Lowercase") {
    steps->push_back(std::make_unique<LowercaseStep>());
  } else if (type == "Replace") {
    steps->push_back(
        std::make_unique<ReplaceStep>(ReplacePattern(value, where, "Replace normalizer")));
  } else if (type == "Prepend") {
    auto step = std::make_unique<PrependStep>();
    if (!value.contains("prepend") || !value["prepend"].is_string())
      throw DataError(where + ": Prepend normalizer needs a \"prepend\" string");
    step->prefix = value["prepend"].get<std::string>();
    steps->push_back(std::move(step));
  } else if (type == "Strip") {
    auto step = std::make_unique<StripStep>();
    step->left = Bool(value, "strip_left", where);
    step->right = Bool(value, "strip_right", where);
    steps->push_back(std::move(step));
  } else {
    throw DataError(where + ": unsupported normalizer \"" + type +
                    "\" (supported: NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend, Strip, "
                    "Sequence)");
  }
}

}  // namespace

Normalizer::~Normalizer() = default;

std::unique_ptr<Normalizer> Normalizer::FromJson(const json& value, const std::string& where) {
  std::unique_ptr<Normalizer> normalizer(new Normalizer());
  AddSteps(value, where, &normalizer->steps_);
  return normalizer;
}

bool Normalizer::Normalize(std::string_view text, std::string* out, RegexScratch& scratch) const {
  out->clear();
  if (steps_.empty()) {
    out->append(text);
    return true;
  }
  bool kept = true;
  std::string buffer;
  std::string_view current = text;
  for (size_t i = 0; i < steps_.size(); ++i) {
    std::string next;
    next.reserve(current.size() + 8);
    kept = steps_[i]->Apply(current, &next, scratch) && kept;
    buffer = std::move(next);
    current = buffer;
  }
  *out = std::move(buffer);
  return kept;
}

std::string Normalizer::Describe() const {
  return DescribeSteps(steps_);
}

}  // namespace crucible
