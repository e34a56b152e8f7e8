#include "tokenizer/pre_tokenizer.h"

#include "common/error.h"
#include "tokenizer/describe_steps.h"
#include "tokenizer/oniguruma.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace crucible {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

// Hugging Face's SplitDelimiterBehavior.
enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Span {
  size_t start, end;
  bool is_match;
};

// Applies a behaviour to the matches/gaps of one piece, as NormalizedString::split does, and
// appends the resulting non-empty pieces.
void EmitSplits(std::string_view piece, std::vector<Span>& spans, Behavior behavior,
                std::vector<std::string_view>* out) {
  std::vector<Span> merged;
  merged.reserve(spans.size());
  bool previous_match = false;
  switch (behavior) {
    case Behavior::kIsolated:
      merged = spans;
      break;
    case Behavior::kRemoved:
      for (const Span& s : spans)
        if (!s.is_match) merged.push_back(s);
      break;
    case Behavior::kContiguous:
      for (const Span& s : spans) {
        if (s.is_match == previous_match && !merged.empty())
          merged.back().end = s.end;
        else
          merged.push_back(s);
        previous_match = s.is_match;
      }
      break;
    case Behavior::kMergedWithPrevious:
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !merged.empty())
          merged.back().end = s.end;
        else
          merged.push_back(s);
        previous_match = s.is_match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (size_t k = spans.size(); k-- > 0;) {
        const Span& s = spans[k];
        if (s.is_match && !previous_match && !merged.empty())
          merged.back().start = s.start;
        else
          merged.push_back(s);
        previous_match = s.is_match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
  }
  for (const Span& s : merged)
    if (s.end > s.start) out->push_back(piece.substr(s.start, s.end - s.start));
}

std::string EscapeRegex(const std::string& literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}-#&~ \t\n").find(c) != std::string_view::npos) {
      if (c == '\t')
        out += "\\t";
      else if (c == '\n')
        out += "\\n";
      else {
        out += '\\';
        out += c;
      }
    } else {
      out += c;
    }
  }
  return out;
}

bool Bool(const nlohmann::json& value, const char* key, bool fallback, const std::string& where) {
  auto it = value.find(key);
  if (it == value.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) throw DataError(where + ": \"" + key + "\" must be true or false");
  return it->get<bool>();
}

}  // namespace

struct PreTokenizer::Step {
  virtual ~Step() = default;
  // Splits each of `in` and appends the results to `out`.
  virtual void Apply(const std::vector<std::string_view>& in, PreTokenizerScratch& scratch,
                     std::vector<std::string_view>* out) const = 0;
  virtual std::string Describe() const = 0;
  virtual bool is_byte_level() const { return false; }
  virtual bool is_metaspace_first() const { return false; }
  // Writes its pieces anew (into the arena) rather than cutting the ones it is given.
  virtual bool rewrites() const { return false; }
};

namespace {

// Split (and Digits, which is a Split on the characters Rust's char::is_numeric accepts, a PCRE2
// pattern of ours: translate=false).
struct RegexSplitStep : PreTokenizer::Step {
  RegexSplitStep(const std::string& pattern, Behavior b, bool inv, std::string name,
                 const std::string& where, bool translate = true)
      : regex(pattern, where, /*allow_fast=*/true, translate),
        behavior(b),
        invert(inv),
        description(std::move(name)) {}
  void Apply(const std::vector<std::string_view>& in, PreTokenizerScratch& scratch,
             std::vector<std::string_view>* out) const override {
    std::vector<Span> spans;
    for (std::string_view piece : in) {
      spans.clear();
      size_t previous = 0;
      regex.ForEachMatch(piece, scratch.regex, [&](size_t start, size_t end) {
        if (start > previous) spans.push_back({previous, start, invert});
        spans.push_back({start, end, !invert});
        previous = end;
      });
      if (previous < piece.size()) spans.push_back({previous, piece.size(), invert});
      if (behavior == Behavior::kIsolated) {  // the common case, without the copy
        for (const Span& s : spans)
          if (s.end > s.start) out->push_back(piece.substr(s.start, s.end - s.start));
      } else {
        EmitSplits(piece, spans, behavior, out);
      }
    }
  }
  std::string Describe() const override { return description; }
  Regex regex;
  Behavior behavior;
  bool invert;
  std::string description;
};

struct ByteLevelStep : PreTokenizer::Step {
  ByteLevelStep(bool prefix, bool use_regex, const std::string& where)
      : add_prefix_space(prefix), regex(use_regex ? new Regex(kGpt2Pattern, where) : nullptr) {}
  void Apply(const std::vector<std::string_view>& in, PreTokenizerScratch& scratch,
             std::vector<std::string_view>* out) const override {
    for (std::string_view piece : in) {
      if (add_prefix_space && (piece.empty() || piece[0] != ' ')) {
        scratch.arena.emplace_back(" ");
        scratch.arena.back().append(piece);
        piece = scratch.arena.back();
      }
      if (!regex) {
        out->push_back(piece);
        continue;
      }
      size_t previous = 0;
      regex->ForEachMatch(piece, scratch.regex, [&](size_t start, size_t end) {
        if (start > previous) out->push_back(piece.substr(previous, start - previous));
        if (end > start) out->push_back(piece.substr(start, end - start));
        previous = end;
      });
      if (previous < piece.size()) out->push_back(piece.substr(previous));
    }
  }
  bool is_byte_level() const override { return true; }
  std::string Describe() const override {
    return std::string("ByteLevel(") + (regex ? "gpt2-regex" : "no-regex") +
           (add_prefix_space ? ",prefix-space)" : ")");
  }
  bool add_prefix_space;
  std::unique_ptr<Regex> regex;
};

// Metaspace: spaces become the replacement character, which is prepended to a piece that does
// not start with it (prepend_scheme "always", or "first" for the piece that starts the original
// text), and with `split` each piece is cut before every replacement character
// (MergedWithNext).
struct MetaspaceStep : PreTokenizer::Step {
  enum class Scheme { kAlways, kFirst, kNever };
  MetaspaceStep(std::string rep, Scheme s, bool sp)
      : replacement(std::move(rep)), scheme(s), split(sp) {}
  void Apply(const std::vector<std::string_view>& in, PreTokenizerScratch& scratch,
             std::vector<std::string_view>* out) const override {
    for (size_t i = 0; i < in.size(); ++i) {
      std::string_view piece = in[i];
      std::string rewritten;
      rewritten.reserve(piece.size() + replacement.size());
      const bool prepend = scheme == Scheme::kAlways ||
                           (scheme == Scheme::kFirst && i == 0 && scratch.first_at_origin);
      const bool starts =
          piece.substr(0, 1) == " " || piece.substr(0, replacement.size()) == replacement;
      if (prepend && !starts) rewritten += replacement;
      for (char c : piece) {
        if (c == ' ')
          rewritten += replacement;
        else
          rewritten += c;
      }
      scratch.arena.push_back(std::move(rewritten));
      std::string_view text = scratch.arena.back();
      if (!split) {
        out->push_back(text);
        continue;
      }
      size_t start = 0;
      for (size_t at = text.find(replacement, 1); at != std::string_view::npos;
           at = text.find(replacement, at + replacement.size())) {
        out->push_back(text.substr(start, at - start));
        start = at;
      }
      out->push_back(text.substr(start));
    }
  }
  bool is_metaspace_first() const override { return scheme == Scheme::kFirst; }
  bool rewrites() const override { return true; }
  std::string Describe() const override {
    return std::string("Metaspace(") +
           (scheme == Scheme::kAlways  ? "always"
            : scheme == Scheme::kFirst ? "first"
                                       : "never") +
           (split ? ",split)" : ")");
  }
  std::string replacement;
  Scheme scheme;
  bool split;
};

Behavior ParseBehavior(const nlohmann::json& value, const std::string& where) {
  static const std::pair<const char*, Behavior> kNames[] = {
      {"Removed", Behavior::kRemoved},
      {"Isolated", Behavior::kIsolated},
      {"MergedWithPrevious", Behavior::kMergedWithPrevious},
      {"MergedWithNext", Behavior::kMergedWithNext},
      {"Contiguous", Behavior::kContiguous}};
  if (value.is_string())
    for (const auto& [name, behavior] : kNames)
      if (value.get<std::string>() == name) return behavior;
  throw DataError(where + ": unsupported Split behavior " + value.dump());
}

void AddSteps(const nlohmann::json& value, const std::string& where,
              std::vector<std::unique_ptr<PreTokenizer::Step>>* steps) {
  if (value.is_null()) return;
  if (!value.is_object() || !value.contains("type") || !value["type"].is_string())
    throw DataError(where + ": pre_tokenizer must be an object with a \"type\"");
  const std::string type = value["type"].get<std::string>();
  if (type == "Sequence") {
    if (!value.contains("pretokenizers") || !value["pretokenizers"].is_array())
      throw DataError(where + ": Sequence pre_tokenizer without a \"pretokenizers\" list");
    for (const auto& item : value["pretokenizers"]) AddSteps(item, where, steps);
  } else if (type == "ByteLevel") {
    steps->push_back(std::make_unique<ByteLevelStep>(Bool(value, "add_prefix_space", true, where),
                                                     Bool(value, "use_regex", true, where), where));
  } else if (type == "Split") {
    if (!value.contains("pattern") || !value["pattern"].is_object())
      throw DataError(where + ": Split pre_tokenizer without a \"pattern\" object");
    const auto& pattern = value["pattern"];
    std::string regex, kind;
    if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      regex = pattern["Regex"].get<std::string>();
      kind = "Regex";
    } else if (pattern.contains("String") && pattern["String"].is_string()) {
      regex = EscapeRegex(pattern["String"].get<std::string>());
      kind = "String";
    } else {
      throw DataError(where + ": Split pattern must be {\"Regex\": ...} or {\"String\": ...}");
    }
    if (!value.contains("behavior"))
      throw DataError(where + ": Split pre_tokenizer without a \"behavior\"");
    Behavior behavior = ParseBehavior(value["behavior"], where);
    bool invert = Bool(value, "invert", false, where);
    std::string name =
        "Split(" + kind + "," + value["behavior"].get<std::string>() + (invert ? ",invert)" : ")");
    steps->push_back(std::make_unique<RegexSplitStep>(regex, behavior, invert, name, where));
  } else if (type == "Digits") {
    bool individual = Bool(value, "individual_digits", false, where);
    steps->push_back(std::make_unique<RegexSplitStep>(
        Pcre2NumericClass(), individual ? Behavior::kIsolated : Behavior::kContiguous, false,
        individual ? "Digits(individual)" : "Digits", where, /*translate=*/false));
  } else if (type == "Metaspace") {
    if (!value.contains("replacement") || !value["replacement"].is_string())
      throw DataError(where + ": Metaspace pre_tokenizer needs a \"replacement\" character");
    const std::string replacement = value["replacement"].get<std::string>();
    size_t end = 0;
    if (replacement.empty() || !IsValidUtf8(replacement) ||
        (NextCodepoint(replacement, &end), end != replacement.size()))
      throw DataError(where + ": Metaspace \"replacement\" must be one character, got " +
                      value["replacement"].dump());
    std::string scheme = value.contains("prepend_scheme") && value["prepend_scheme"].is_string()
                             ? value["prepend_scheme"].get<std::string>()
                             : "always";
    if (value.contains("add_prefix_space") && value["add_prefix_space"] == false) {
      if (scheme != "never" && value.contains("prepend_scheme"))
        throw DataError(where + ": Metaspace: add_prefix_space does not match prepend_scheme");
      scheme = "never";
    }
    MetaspaceStep::Scheme parsed;
    if (scheme == "always")
      parsed = MetaspaceStep::Scheme::kAlways;
    else if (scheme == "first")
      parsed = MetaspaceStep::Scheme::kFirst;
    else if (scheme == "never")
      parsed = MetaspaceStep::Scheme::kNever;
    else
      throw DataError(where + ": Metaspace: unknown prepend_scheme \"" + scheme + "\"");
    steps->push_back(
        std::make_unique<MetaspaceStep>(replacement, parsed, Bool(value, "split", true, where)));
  } else {
    throw DataError(where + ": unsupported pre_tokenizer type \"" + type +
                    "\" (supported: ByteLevel, Split, Digits, Metaspace, Sequence)");
  }
}

}  // namespace

PreTokenizer::~PreTokenizer() = default;

std::unique_ptr<PreTokenizer> PreTokenizer::FromJson(const nlohmann::json& value,
                                                     const std::string& where) {
  std::unique_ptr<PreTokenizer> result(new PreTokenizer());
  AddSteps(value, where, &result->steps_);
  return result;
}

void PreTokenizer::Split(std::string_view text, PreTokenizerScratch& scratch,
                         bool at_origin) const {
  scratch.arena.clear();
  scratch.pieces.clear();
  if (text.empty()) return;
  scratch.pieces.push_back(text);
  scratch.first_at_origin = at_origin;
  for (const auto& step : steps_) {
    scratch.next.clear();
    const char* first = scratch.pieces.empty() ? nullptr : scratch.pieces.front().data();
    step->Apply(scratch.pieces, scratch, &scratch.next);
    // A step that keeps the first piece's start (or rewrites it in place: Metaspace) keeps it
    // at the origin; one that removed what began it does not.
    if (scratch.next.empty() || (scratch.next.front().data() != first && !step->rewrites()))
      scratch.first_at_origin = false;
    scratch.pieces.swap(scratch.next);
  }
}

bool PreTokenizer::has_byte_level() const {
  for (const auto& step : steps_)
    if (step->is_byte_level()) return true;
  return false;
}

bool PreTokenizer::metaspace_first_after_other_step() const {
  for (size_t i = 1; i < steps_.size(); ++i)
    if (steps_[i]->is_metaspace_first()) return true;
  return false;
}

bool PreTokenizer::byte_level_last() const {
  if (steps_.empty() || !steps_.back()->is_byte_level()) return false;
  for (size_t i = 0; i + 1 < steps_.size(); ++i)
    if (steps_[i]->is_byte_level()) return false;
  return true;
}

std::string PreTokenizer::Describe() const {
  return DescribeSteps(steps_);
}

}  // namespace crucible
