#include "eval/python_text.h"

#include <algorithm>
#include <span>
#include <vector>

#include "tokenizer/utf8.h"

namespace crucible {
namespace {

struct CodePointRange {
  char32_t first, last;  // inclusive
};

// A full case mapping: `code_point` becomes mapped[0, length).
struct CaseMapping {
  char32_t code_point;
  uint8_t length;
  char32_t mapped[3];
};

#include "eval/python_text.inc"

constexpr char32_t kCapitalSigma = 0x3A3, kSmallSigma = 0x3C3, kFinalSigma = 0x3C2;

bool InRanges(std::span<const CodePointRange> ranges, char32_t c) {
  auto after = std::upper_bound(ranges.begin(), ranges.end(), c,
                                [](char32_t v, const CodePointRange& r) { return v < r.first; });
  return after != ranges.begin() && c <= std::prev(after)->last;
}

void AppendMapped(std::span<const CaseMapping> table, char32_t c, std::string* out) {
  auto it = std::lower_bound(table.begin(), table.end(), c,
                             [](const CaseMapping& m, char32_t v) { return m.code_point < v; });
  if (it == table.end() || it->code_point != c) return AppendUtf8(c, out);
  for (int k = 0; k < it->length; ++k) AppendUtf8(it->mapped[k], out);
}

// The code points of `text`, invalid sequences as U+FFFD (RepairUtf8).
std::vector<char32_t> Decode(std::string_view text) {
  std::string repaired;
  if (!IsValidUtf8(text)) {
    repaired = RepairUtf8(text);
    text = repaired;
  }
  std::vector<char32_t> out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) out.push_back(NextCodepoint(text, &pos));
  return out;
}

std::string Encode(const char32_t* begin, const char32_t* end) {
  std::string out;
  for (const char32_t* c = begin; c != end; ++c) AppendUtf8(*c, &out);
  return out;
}

// CPython's handle_capital_sigma: whether the capital sigma at text[i] is word-final.
bool IsFinalSigma(const std::vector<char32_t>& text, size_t i) {
  size_t j = i;
  while (j > 0 && InRanges(kCaseIgnorable, text[j - 1])) --j;
  if (j == 0 || !InRanges(kCased, text[j - 1])) return false;
  j = i + 1;
  while (j < text.size() && InRanges(kCaseIgnorable, text[j])) ++j;
  return j == text.size() || !InRanges(kCased, text[j]);
}

}  // namespace

bool IsPythonSpace(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
  return InRanges(kPythonSpace, c);
}

std::string PythonStrip(std::string_view text) {
  const std::vector<char32_t> c = Decode(text);
  size_t begin = 0, end = c.size();
  while (begin < end && IsPythonSpace(c[begin])) ++begin;
  while (end > begin && IsPythonSpace(c[end - 1])) --end;
  return Encode(c.data() + begin, c.data() + end);
}

std::string PythonRstrip(std::string_view text) {
  const std::vector<char32_t> c = Decode(text);
  size_t end = c.size();
  while (end > 0 && IsPythonSpace(c[end - 1])) --end;
  return Encode(c.data(), c.data() + end);
}

int64_t PythonWordCount(std::string_view text) {
  int64_t runs = 0;
  bool in_space = false;
  for (char32_t c : Decode(text)) {
    const bool space = IsPythonSpace(c);
    if (space && !in_space) ++runs;
    in_space = space;
  }
  return runs + 1;
}

std::string PythonCapitalize(std::string_view text) {
  const std::vector<char32_t> c = Decode(text);
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < c.size(); ++i) {
    if (i == 0)
      AppendMapped(kTitleMappings, c[i], &out);
    else if (c[i] == kCapitalSigma)
      AppendUtf8(IsFinalSigma(c, i) ? kFinalSigma : kSmallSigma, &out);
    else
      AppendMapped(kLowerMappings, c[i], &out);
  }
  return out;
}

std::string_view PythonTextUnicodeVersion() {
  return kUnicodeVersion;
}

}  // namespace crucible
