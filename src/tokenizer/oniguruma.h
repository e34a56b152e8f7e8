// Oniguruma -> PCRE2: a tokenizer.json regex is written for the Oniguruma inside Hugging Face
// `tokenizers`; crucible runs it in Debian's PCRE2. The two engines agree on most syntax but not
// on the Unicode version of their classes, nor on a few constructs. TranslateOnigurumaPattern
// rewrites a pattern so PCRE2 (UTF + UCP) matches exactly what Oniguruma matches:
//
// - Character classes: \p{X} \P{X} \p{^X} \P{^X} for every Unicode general category (and LC),
//   \d \D \s \S, inside and outside brackets, get the code points the two Unicode versions assign
//   differently (src/tokenizer/unicode_classes.inc, measured code point by code point by
//   scripts/gen-unicode-classes.py) added or taken away. PCRE2's own property lookup stays in the
//   pattern, so the class is as fast as before plus a few dozen ranges.
// - Isolated options: Oniguruma's `a(?i)b|c` means `a(?i:b|c)`; its (?m) is PCRE2's (?s); ^ and $
//   are line anchors; `{,n}` is `{0,n}`; \v is U+000B; \uHHHH is a code point.
// - Refused (DataError naming `where` and the construct, exit 65), never matched at another
//   Unicode version or with another meaning: properties other than the general categories
//   (scripts such as \p{Han}, binary properties, long names), \w \W \b \B \h \H and the other
//   escapes the engines define differently, nested classes and && inside brackets, `{n,m}+`,
//   conditionals, absent groups and option letters other than i, m, x.
#pragma once

#include <string>

namespace crucible {

std::string TranslateOnigurumaPattern(const std::string& pattern,
                                      const std::string& where = "regex");

// What `tokenizers` takes from Rust rather than from Oniguruma, as PCRE2 classes ("[...]", for a
// Regex compiled without translation), at the Unicode version of that build (measured by the
// same script): the characters of the Digits pre-tokenizer (char::is_numeric), and the word
// characters that keep a single_word added token from matching (the regex crate's \w).
std::string Pcre2NumericClass();
std::string Pcre2WordClass();

}  // namespace crucible
