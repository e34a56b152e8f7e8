#include "tokenizer/unicode_normalization.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tokenizer/utf8.h"

namespace crucible {
namespace {

struct CombiningClassRange {
  char32_t first, last;
  uint8_t ccc;
};
struct CodePointMapping {
  char32_t code_point;
  uint32_t offset, length;
};
struct CompositionPair {
  char32_t first, second, composite;
};

#include "tokenizer/unicode_normalization.inc"

// Hangul syllables (Unicode 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

uint8_t CombiningClass(char32_t c) {
  if (c < 0x300) return 0;
  auto it = std::upper_bound(std::begin(kCombiningClass), std::end(kCombiningClass), c,
                             [](char32_t v, const CombiningClassRange& r) { return v < r.first; });
  if (it == std::begin(kCombiningClass)) return 0;
  --it;
  return c <= it->last ? it->ccc : 0;
}

template <size_t N>
const CodePointMapping* Find(const CodePointMapping (&table)[N], char32_t c) {
  auto it =
      std::lower_bound(std::begin(table), std::end(table), c,
                       [](const CodePointMapping& m, char32_t v) { return m.code_point < v; });
  return it != std::end(table) && it->code_point == c ? &*it : nullptr;
}

struct Char {
  char32_t c;
  uint8_t ccc;
};

// Appends c, keeping each run of non-starters in canonical order (a stable sort by class).
void Push(std::vector<Char>* seq, char32_t c) {
  const uint8_t ccc = CombiningClass(c);
  seq->push_back({c, ccc});
  if (ccc == 0) return;
  for (size_t i = seq->size() - 1; i > 0 && (*seq)[i - 1].ccc > ccc; --i)
    std::swap((*seq)[i - 1], (*seq)[i]);
}

void Decompose(char32_t c, bool compatibility, std::vector<Char>* seq) {
  if (c >= kSBase && c < kSBase + kSCount) {
    const char32_t s = c - kSBase;
    Push(seq, kLBase + s / kNCount);
    Push(seq, kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) Push(seq, kTBase + s % kTCount);
    return;
  }
  if (c >= 0xA0) {
    if (compatibility)
      if (const CodePointMapping* m = Find(kCompatibility, c)) {
        for (uint32_t i = 0; i < m->length; ++i) Push(seq, kCompatibilityData[m->offset + i]);
        return;
      }
    if (const CodePointMapping* m = Find(kCanonical, c)) {
      for (uint32_t i = 0; i < m->length; ++i) Push(seq, kCanonicalData[m->offset + i]);
      return;
    }
  }
  Push(seq, c);
}

// The primary composite of (a, b), or 0.
char32_t Compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  auto it =
      std::lower_bound(std::begin(kComposition), std::end(kComposition), CompositionPair{a, b, 0},
                       [](const CompositionPair& x, const CompositionPair& y) {
                         return x.first != y.first ? x.first < y.first : x.second < y.second;
                       });
  return it != std::end(kComposition) && it->first == a && it->second == b ? it->composite : 0;
}

// Canonical composition of a decomposed, canonically ordered sequence (in place).
void ComposeAll(std::vector<Char>* seq) {
  std::vector<Char>& s = *seq;
  size_t out = 0;
  int64_t starter = -1;
  int last_ccc = -1;  // class of the last character kept after the starter; -1: none yet
  for (size_t i = 0; i < s.size(); ++i) {
    const Char ch = s[i];
    if (starter >= 0 && (last_ccc == -1 || last_ccc < ch.ccc)) {
      if (const char32_t composite = Compose(s[starter].c, ch.c)) {
        s[starter].c = composite;
        continue;
      }
    }
    s[out++] = ch;
    if (ch.ccc == 0) {
      starter = static_cast<int64_t>(out - 1);
      last_ccc = -1;
    } else {
      last_ccc = ch.ccc;
    }
  }
  s.resize(out);
}

}  // namespace

void NormalizeUnicode(NormalizationForm form, std::string_view text, std::string* out) {
  if (std::all_of(text.begin(), text.end(), [](char c) { return (c & 0x80) == 0; })) {
    out->append(text);
    return;
  }
  const bool compatibility = form == NormalizationForm::kNfkc || form == NormalizationForm::kNfkd;
  const bool compose = form == NormalizationForm::kNfc || form == NormalizationForm::kNfkc;
  std::vector<Char> seq;
  seq.reserve(text.size());
  for (size_t pos = 0; pos < text.size();)
    Decompose(NextCodepoint(text, &pos), compatibility, &seq);
  if (compose) ComposeAll(&seq);
  for (const Char& ch : seq) AppendUtf8(ch.c, out);
}

void AppendLowercase(std::string_view text, std::string* out) {
  for (size_t pos = 0; pos < text.size();) {
    const unsigned char b = static_cast<unsigned char>(text[pos]);
    if (b < 0x80) {
      out->push_back(b >= 'A' && b <= 'Z' ? static_cast<char>(b + 32) : static_cast<char>(b));
      ++pos;
      continue;
    }
    const char32_t c = NextCodepoint(text, &pos);
    if (const CodePointMapping* m = Find(kLowercase, c)) {
      for (uint32_t i = 0; i < m->length; ++i) AppendUtf8(kLowercaseData[m->offset + i], out);
    } else {
      AppendUtf8(c, out);
    }
  }
}

}  // namespace crucible
