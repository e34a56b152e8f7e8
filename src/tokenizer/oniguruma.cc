#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/oniguruma.h"

#include <pcre2.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <span>
#include <vector>

#include "common/error.h"
#include "common/strings.h"

namespace crucible {
namespace {

struct CodePointRange {
  char32_t first, last;  // inclusive
};

// One class as measured by scripts/gen-unicode-classes.py.
struct UnicodeClassDiff {
  // As a pattern writes it: "L", "Lu", ..., "LC"; "d" is \d and "s" is \s. "Digits" and "word"
  // are no pattern's: the classes `tokenizers` takes from Rust (see Pcre2NumericClass).
  const char* name;
  const char* pcre2;                      // the contents of the PCRE2 class it was measured against
  std::span<const CodePointRange> added;  // in Oniguruma's class, not in PCRE2's
  std::span<const CodePointRange> removed;  // in PCRE2's class, not in Oniguruma's
};

#include "tokenizer/unicode_classes.inc"

// A class item as PCRE2 writes it inside brackets, with the code points where the class it
// stands for differs.
struct ClassTerm {
  std::string pcre2;
  std::vector<CodePointRange> added, removed;
  bool differs() const { return !added.empty() || !removed.empty(); }
};

ClassTerm MakeTerm(const UnicodeClassDiff& diff, bool negated) {
  ClassTerm term;
  term.pcre2 = diff.pcre2;
  // \p{X} -> \P{X}, \d -> \D, \s -> \S; the complement swaps what is added and taken away.
  if (negated) term.pcre2[1] = static_cast<char>(std::toupper(term.pcre2[1]));
  auto added = negated ? diff.removed : diff.added;
  auto removed = negated ? diff.added : diff.removed;
  term.added.assign(added.begin(), added.end());
  term.removed.assign(removed.begin(), removed.end());
  return term;
}

const UnicodeClassDiff& Measured(const char* name) {
  for (const auto& diff : kUnicodeClassDiffs)
    if (std::string_view(diff.name) == name) return diff;
  throw Error(kExitFailure, std::string("unicode_classes.inc has no class ") + name);
}

// A general category by name, matched as Oniguruma matches names: case, spaces, underscores and
// hyphens ignored. Null for anything else (scripts, binary properties, long names).
const UnicodeClassDiff* FindCategory(const std::string& written) {
  std::string name;
  for (char c : written)
    if (c != ' ' && c != '_' && c != '-') name += static_cast<char>(std::tolower(c));
  for (const auto& diff : kUnicodeClassDiffs) {
    std::string candidate = diff.name;
    if (candidate == "d" || candidate == "s" || candidate == "Digits" || candidate == "word")
      continue;
    for (char& c : candidate) c = static_cast<char>(std::tolower(c));
    if (candidate == name) return &diff;
  }
  return nullptr;
}

std::string RangesText(std::span<const CodePointRange> ranges) {
  std::string out;
  for (const auto& r : ranges) {
    out += StrFormat("\\x{%X}", static_cast<unsigned>(r.first));
    if (r.last != r.first) out += StrFormat("-\\x{%X}", static_cast<unsigned>(r.last));
  }
  return out;
}

std::vector<CodePointRange> ToRanges(std::vector<char32_t> code_points) {
  std::sort(code_points.begin(), code_points.end());
  std::vector<CodePointRange> out;
  for (char32_t c : code_points) {
    if (!out.empty() && (out.back().last == c || out.back().last + 1 == c))
      out.back().last = c;
    else
      out.push_back({c, c});
  }
  return out;
}

bool Contains(const std::vector<CodePointRange>& ranges, char32_t c) {
  for (const auto& r : ranges)
    if (r.first <= c && c <= r.last) return true;
  return false;
}

std::string Utf8(char32_t c) {
  std::string out;
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
  return out;
}

// The pattern as a message shows it: on one line.
std::string OneLine(const std::string& pattern) {
  std::string out;
  for (char c : pattern) {
    if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else
      out += c;
  }
  return out;
}

struct Pcre2CodeFree {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
struct Pcre2DataFree {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

// Code points that some term's PCRE2 class holds but Oniguruma's does not, and that no other
// term of the same bracket holds in Oniguruma either: what the PCRE2 class must leave out.
std::vector<CodePointRange> WronglyHeld(const std::vector<ClassTerm>& terms) {
  std::vector<std::unique_ptr<pcre2_code, Pcre2CodeFree>> codes;
  for (const ClassTerm& term : terms) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    const std::string pattern = "[" + term.pcre2 + "]";
    codes.emplace_back(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &error, &offset,
                                     nullptr));
    if (!codes.back()) throw Error(kExitFailure, "PCRE2 cannot compile " + pattern);
  }
  std::unique_ptr<pcre2_match_data, Pcre2DataFree> data(pcre2_match_data_create(1, nullptr));
  std::vector<char32_t> out;
  for (const ClassTerm& term : terms)
    for (const CodePointRange& r : term.removed)
      for (char32_t c = r.first; c <= r.last; ++c) {
        const std::string text = Utf8(c);
        bool held = false;
        for (size_t j = 0; j < terms.size() && !held; ++j) {
          const bool pcre2 = pcre2_match(codes[j].get(), reinterpret_cast<PCRE2_SPTR>(text.data()),
                                         text.size(), 0, 0, data.get(), nullptr) >= 0;
          held = (pcre2 || Contains(terms[j].added, c)) && !Contains(terms[j].removed, c);
        }
        if (!held) out.push_back(c);
      }
  return ToRanges(std::move(out));
}

// The class [literals terms] (negated: [^literals terms]) as PCRE2 must see it. Additions go
// into the bracket as ranges; code points a term's PCRE2 class holds wrongly are cut out with a
// lookahead. Explicit code points would case-fold under (?i) where a property does not, so
// under (?i) the property part is matched with (?-i).
std::string EmitClass(bool negated, const std::string& literals,
                      const std::vector<ClassTerm>& terms, bool caseless) {
  const std::string caret = negated ? "^" : "";
  std::string properties;
  bool differs = false;
  std::vector<char32_t> added;
  for (const ClassTerm& term : terms) {
    properties += term.pcre2;
    differs = differs || term.differs();
    for (const auto& r : term.added)
      for (char32_t c = r.first; c <= r.last; ++c) added.push_back(c);
  }
  if (!differs) return "[" + caret + literals + properties + "]";
  properties += RangesText(ToRanges(std::move(added)));
  const std::string wrong = RangesText(WronglyHeld(terms));
  if (!caseless && wrong.empty()) return "[" + caret + literals + properties + "]";
  if (!negated) {
    const std::string held =
        "(?-i:" + (wrong.empty() ? "" : "(?![" + wrong + "])") + "[" + properties + "])";
    return literals.empty() ? held : "(?:[" + literals + "]|" + held + ")";
  }
  const std::string outside =
      wrong.empty() ? "[^" + properties + "]" : "(?:[^" + properties + "]|[" + wrong + "])";
  return "(?:" + (literals.empty() ? "" : "(?![" + literals + "])") + "(?-i:" + outside + "))";
}

size_t Utf8Length(unsigned char lead) {
  return lead < 0xC0 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

class Translator {
 public:
  Translator(const std::string& pattern, const std::string& where) : p_(pattern), where_(where) {}

  std::string Run() {
    groups_.push_back({false, 0});
    while (i_ < p_.size()) {
      const char c = p_[i_];
      if (c == '\\') {
        Escape e = ParseEscape(/*in_class=*/false);
        if (e.kind == Escape::kAtom) CheckCaseFolding(e.code_point, e.code_point);
        if (e.kind == Escape::kTerm)  // outside brackets neither engine case-folds a property
          out_ += e.term.differs() ? EmitClass(false, "", {e.term}, caseless_) : e.term.pcre2;
        else if (e.kind == Escape::kSet)
          out_ += "[" + e.text + "]";
        else
          out_ += e.text;
      } else if (c == '[') {
        out_ += ParseClass();
      } else if (c == '(') {
        OpenGroup();
      } else if (c == ')') {
        CloseGroup();
      } else if (c == '^' || c == '$') {  // Oniguruma's anchors are line anchors
        out_ += std::string("(?m:") + c + ")";
        ++i_;
      } else if (c == '{') {
        Interval();
      } else {
        const char32_t code_point = CopyCharacter(&out_);
        CheckCaseFolding(code_point, code_point);
      }
    }
    out_ += std::string(groups_.front().implicit, ')');
    return out_;
  }

 private:
  struct Escape {
    enum Kind {
      kAtom,   // one character: can end a range inside a class
      kSet,    // several characters as class contents (\s)
      kTerm,   // a class with Unicode differences (\p{..}, \d, \S inside a class)
      kOther,  // an anchor, a backreference, or a whole class (\S outside a class)
    } kind;
    std::string text;
    ClassTerm term;
    char32_t code_point = 0;  // kAtom: the character
  };
  struct Group {
    bool caseless_before;  // restored when the group closes
    int implicit;          // groups opened for isolated options, closed with this one
  };

  [[noreturn]] void Refuse(const std::string& what) const {
    throw DataError(where_ + ": unsupported pre-tokenizer regex '" + OneLine(p_) + "': " + what);
  }

  // Copies one (UTF-8) character of the pattern to *out; returns its code point.
  char32_t CopyCharacter(std::string* out) {
    const unsigned char lead = static_cast<unsigned char>(p_[i_]);
    const size_t length = std::min(Utf8Length(lead), p_.size() - i_);
    char32_t c = length == 1 ? lead : lead & (0x7F >> length);
    for (size_t k = 1; k < length; ++k)
      c = (c << 6) | (static_cast<unsigned char>(p_[i_ + k]) & 0x3F);
    out->append(p_, i_, length);
    i_ += length;
    return c;
  }

  // Under (?i) both engines match a character's case variants, each by its own Unicode version;
  // characters (or ranges) whose variants differ between the two are refused there.
  void CheckCaseFolding(char32_t first, char32_t last) const {
    if (!caseless_) return;
    for (const CodePointRange& r : kCaseFoldDiffers)
      if (r.first <= last && first <= r.last)
        Refuse(
            StrFormat("U+%04X under (?i) (its case variants differ between Oniguruma's "
                      "Unicode and PCRE2's)",
                      static_cast<unsigned>(std::max(first, r.first))));
  }

  static std::string WhiteSpace() { return RangesText(kOnigurumaWhiteSpace); }

  // At a backslash; moves past the escape.
  Escape ParseEscape(bool in_class) {
    const size_t start = i_++;
    if (i_ >= p_.size()) Refuse("it ends with a backslash");
    const unsigned char c = static_cast<unsigned char>(p_[i_]);
    auto written = [&] { return p_.substr(start, i_ - start); };
    auto atom = [](std::string text, char32_t code_point) {
      return Escape{Escape::kAtom, std::move(text), {}, code_point};
    };
    // The number written in `digits` (base 8 or 16), or Refuse.
    auto number = [&](const std::string& digits, int base) -> char32_t {
      char* end = nullptr;
      const unsigned long value = std::strtoul(digits.c_str(), &end, base);
      if (digits.empty() || *end != '\0' || value > 0x10FFFF)
        Refuse("the escape " + written() + " (not a code point)");
      return static_cast<char32_t>(value);
    };
    if (c >= 0x80 || !std::isalnum(c)) {  // an escaped symbol is itself
      std::string text = "\\";
      const char32_t code_point = CopyCharacter(&text);
      return atom(text, code_point);
    }
    ++i_;
    switch (c) {
      case 't':
        return atom(written(), '\t');
      case 'n':
        return atom(written(), '\n');
      case 'r':
        return atom(written(), '\r');
      case 'f':
        return atom(written(), '\f');
      case 'e':
        return atom(written(), 0x1B);
      case 'a':
        return atom(written(), 0x07);
      case 'v':  // Oniguruma: the vertical tab; PCRE2: any vertical space
        return atom("\\x{0B}", 0x0B);
      case 'x':
        if (i_ < p_.size() && p_[i_] == '{') {
          const size_t close = p_.find('}', i_);
          if (close == std::string::npos) Refuse("an unterminated \\x{");
          i_ = close + 1;
          return atom(written(), number(p_.substr(start + 3, i_ - start - 4), 16));
        }
        for (int k = 0; k < 2 && i_ < p_.size() && std::isxdigit(p_[i_]); ++k) ++i_;
        return atom(written(), number(p_.substr(start + 2, i_ - start - 2), 16));
      case 'u': {  // \uHHHH (Oniguruma), which PCRE2 spells \x{HHHH}
        if (i_ + 4 > p_.size() || !std::all_of(p_.begin() + i_, p_.begin() + i_ + 4, [](char h) {
              return std::isxdigit(static_cast<unsigned char>(h));
            }))
          Refuse("\\u without four hexadecimal digits");
        i_ += 4;
        return atom("\\x{" + p_.substr(i_ - 4, 4) + "}", number(p_.substr(i_ - 4, 4), 16));
      }
      case 'c':  // control character \cX
        if (i_ >= p_.size() || static_cast<unsigned char>(p_[i_]) >= 0x80)
          Refuse("\\c without an ASCII character");
        ++i_;
        return atom(written(), std::toupper(static_cast<unsigned char>(p_[i_ - 1])) ^ 0x40);
      case 'o':
        if (i_ >= p_.size() || p_[i_] != '{' || p_.find('}', i_) == std::string::npos)
          Refuse("\\o without {octal digits}");
        i_ = p_.find('}', i_) + 1;
        return atom(written(), number(p_.substr(start + 3, i_ - start - 4), 8));
      case 'p':
      case 'P':
        return Escape{Escape::kTerm, "", ParseProperty(start, c == 'P')};
      case 'd':
      case 'D':
        return Escape{Escape::kTerm, "", MakeTerm(Measured("d"), c == 'D')};
      case 's':
        return Escape{Escape::kSet, WhiteSpace(), {}};
      case 'S':
        if (in_class) return Escape{Escape::kTerm, "", MakeTerm(Measured("s"), true)};
        return Escape{Escape::kOther, "[^" + WhiteSpace() + "]", {}};
      case 'w':
      case 'W':
      case 'b':
      case 'B':
        Refuse(written() +
               " (Oniguruma's word characters hold the marks and connector punctuation that "
               "PCRE2's lack)");
      case 'h':
      case 'H':
        Refuse(written() + " (a hexadecimal digit in Oniguruma, horizontal space in PCRE2)");
      case 'A':
      case 'z':
      case 'Z':
        if (in_class) break;
        return Escape{Escape::kOther, written(), {}};
      case 'k':  // a named backreference \k<name>: the name follows as written
        if (in_class) break;
        return Escape{Escape::kOther, written(), {}};
      default:
        if (std::isdigit(c)) {  // octal (\0..) or a backreference (\1..)
          while (i_ < p_.size() && i_ < start + 4 && std::isdigit(p_[i_])) ++i_;
          if (c == '0') return atom(written(), number(p_.substr(start + 1, i_ - start - 1), 8));
          if (in_class) break;
          return Escape{Escape::kOther, written(), {}};
        }
        break;
    }
    Refuse("the escape " + written() + (in_class ? " inside a class" : ""));
  }

  // At the p/P of \p{Name}, \P{Name}, \p{^Name}; `start` is the backslash.
  ClassTerm ParseProperty(size_t start, bool negated) {
    if (i_ >= p_.size() || p_[i_] != '{')
      Refuse(p_.substr(start, std::min<size_t>(3, p_.size() - start)) +
             " without braces (write \\p{L})");
    const size_t close = p_.find('}', i_);
    if (close == std::string::npos) Refuse("an unterminated " + p_.substr(start, i_ + 1 - start));
    std::string name = p_.substr(i_ + 1, close - i_ - 1);
    i_ = close + 1;
    if (!name.empty() && name[0] == '^') {
      negated = !negated;
      name.erase(0, 1);
    }
    const UnicodeClassDiff* diff = FindCategory(name);
    if (!diff)
      Refuse("the property " + p_.substr(start, i_ - start) +
             " (supported: the Unicode general categories L M N P S Z C, their subcategories "
             "such as Lu Nd Po So, and LC; scripts and other properties are not)");
    return MakeTerm(*diff, negated);
  }

  // At '['; returns the class as PCRE2 must see it.
  std::string ParseClass() {
    ++i_;
    bool negated = false;
    if (i_ < p_.size() && p_[i_] == '^') {
      negated = true;
      ++i_;
    }
    std::string literals;
    std::vector<ClassTerm> terms;
    bool first = true, previous_atom = false, range = false;
    char32_t previous = 0;  // the last character, which may start a range
    // A character ends a range or stands alone: check its case variants (or the range's).
    auto character = [&](char32_t c) {
      CheckCaseFolding(range ? std::min(previous, c) : c, range ? std::max(previous, c) : c);
      previous = c;
      range = false;
      previous_atom = true;
    };
    while (true) {
      if (i_ >= p_.size()) Refuse("an unterminated [");
      const char c = p_[i_];
      if (c == ']' && !first) {
        ++i_;
        break;
      }
      first = false;
      if (c == '[')
        Refuse("[ inside a class (Oniguruma nests classes and POSIX brackets there; write \\[)");
      if (c == '&' && i_ + 1 < p_.size() && p_[i_ + 1] == '&')
        Refuse("&& inside a class (Oniguruma's class intersection)");
      if (c == '\\') {
        const size_t start = i_;
        Escape e = ParseEscape(/*in_class=*/true);
        if (e.kind == Escape::kTerm) {
          if (caseless_ && e.term.pcre2[1] != 'd' && e.term.pcre2[1] != 'D' &&
              e.term.pcre2[1] != 'S')
            Refuse(p_.substr(start, i_ - start) +
                   " inside brackets under (?i) (Oniguruma case-folds the property there, "
                   "PCRE2 does not)");
          terms.push_back(std::move(e.term));
          previous_atom = range = false;
        } else if (e.kind == Escape::kAtom) {
          literals += e.text;
          character(e.code_point);
        } else {
          literals += e.text;
          previous_atom = range = false;
        }
        continue;
      }
      if (c == '-') {
        // A range only between two characters; any other '-' is itself (the terms move to the
        // end of the class, so a bare '-' could otherwise start a range with them).
        range = previous_atom && i_ + 1 < p_.size() && p_[i_ + 1] != ']';
        literals += range ? "-" : "\\-";
        ++i_;
        previous_atom = false;
        continue;
      }
      if (c == ']' || c == '^') {  // a literal ']' first, or '^' not first: keep them literal
        literals += std::string("\\") + c;
        ++i_;
        character(static_cast<unsigned char>(c));
      } else {
        character(CopyCharacter(&literals));
      }
    }
    return EmitClass(negated, literals, terms, caseless_);
  }

  // At '('.
  void OpenGroup() {
    const size_t n = p_.size();
    auto push_copy = [&](size_t length) {
      groups_.push_back({caseless_, 0});
      out_.append(p_, i_, length);
      i_ += length;
    };
    if (i_ + 1 >= n || p_[i_ + 1] != '?') return push_copy(1);
    const char kind = i_ + 2 < n ? p_[i_ + 2] : '\0';
    if (kind == ':' || kind == '=' || kind == '!' || kind == '>') return push_copy(3);
    if (kind == '<' && i_ + 3 < n && (p_[i_ + 3] == '=' || p_[i_ + 3] == '!')) return push_copy(4);
    if (kind == '<' || kind == '\'') {  // a named group
      const size_t close = p_.find(kind == '<' ? '>' : '\'', i_ + 3);
      if (close == std::string::npos) Refuse("an unterminated group name");
      return push_copy(close + 1 - i_);
    }
    if (kind == '#') {  // a comment
      const size_t close = p_.find(')', i_);
      if (close == std::string::npos) Refuse("an unterminated (?#");
      out_.append(p_, i_, close + 1 - i_);
      i_ = close + 1;
      return;
    }
    // Options: i and x as in PCRE2; Oniguruma's m (dot matches newline) is PCRE2's s.
    size_t j = i_ + 2;
    bool on = true, caseless = caseless_;
    std::string flags;
    for (; j < n && std::string_view("imx-").find(p_[j]) != std::string_view::npos; ++j) {
      if (p_[j] == '-') on = false;
      if (p_[j] == 'i') caseless = on;
      flags += p_[j] == 'm' ? 's' : p_[j];
    }
    if (j > i_ + 2 && j < n && (p_[j] == ':' || p_[j] == ')')) {
      if (p_[j] == ':')
        groups_.push_back({caseless_, 0});
      else  // isolated: Oniguruma applies it to the rest of the enclosing group, as one group
        ++groups_.back().implicit;
      caseless_ = caseless;
      out_ += "(?" + flags + ":";
      i_ = j + 1;
      return;
    }
    Refuse("the group " + p_.substr(i_, std::min<size_t>(j + 1, n) - i_) +
           " (supported: ( (?: (?= (?! (?<= (?<! (?> (?<name> (?#..) and the options i, m, x)");
  }

  void CloseGroup() {
    ++i_;
    if (groups_.size() == 1) {  // unbalanced: PCRE2 reports it
      out_ += ')';
      return;
    }
    out_ += std::string(groups_.back().implicit + 1, ')');
    caseless_ = groups_.back().caseless_before;
    groups_.pop_back();
  }

  // At '{': an interval {n} {n,} {n,m} {,m} (Oniguruma: {0,m}), or a literal brace.
  void Interval() {
    size_t j = i_ + 1;
    auto digits = [&] {
      const size_t from = j;
      while (j < p_.size() && std::isdigit(static_cast<unsigned char>(p_[j]))) ++j;
      return p_.substr(from, j - from);
    };
    const std::string low = digits();
    const bool comma = j < p_.size() && p_[j] == ',';
    if (comma) ++j;
    const std::string high = comma ? digits() : "";
    if (j >= p_.size() || p_[j] != '}' || (low.empty() && high.empty())) {
      out_ += "\\{";
      ++i_;
      return;
    }
    const std::string interval = "{" + (low.empty() ? "0" : low) + (comma ? "," + high : "") + "}";
    i_ = j + 1;
    if (i_ < p_.size() && p_[i_] == '+')
      Refuse("the interval " + interval +
             "+ (Oniguruma repeats it again, PCRE2 makes it possessive; group it: (?:x" + interval +
             ")+)");
    out_ += interval;
  }

  const std::string& p_;
  const std::string& where_;
  size_t i_ = 0;
  std::string out_;
  std::vector<Group> groups_;
  bool caseless_ = false;
};

}  // namespace

std::string TranslateOnigurumaPattern(const std::string& pattern, const std::string& where) {
  return Translator(pattern, where).Run();
}

std::string Pcre2NumericClass() {
  return EmitClass(false, "", {MakeTerm(Measured("Digits"), false)}, false);
}

std::string Pcre2WordClass() {
  return EmitClass(false, "", {MakeTerm(Measured("word"), false)}, false);
}

}  // namespace crucible
