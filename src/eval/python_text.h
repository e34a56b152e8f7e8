// Python's str operations that lm-eval applies to text, on UTF-8: whitespace as re's \s,
// str.isspace() and str.strip() see it, word counts as len(re.split(r"\s+", text)), and
// str.capitalize() with Python's full case mappings and its final-sigma rule. The Unicode data
// is src/eval/python_text.inc, measured from Python 3.11 by scripts/gen-python-text.py (the
// Python of the lm-eval the tests compare with); tests/unit/eval/python_text_test.cc checks every
// code point against the python3 on the PATH.
//
// Text that is not valid UTF-8 is read as Python's bytes.decode("utf-8", "replace") reads it:
// each invalid sequence is one U+FFFD, which is neither whitespace nor cased.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace crucible {

// str.isspace() of one code point: ASCII \t..\r, U+001C..U+001F and space, U+0085, U+00A0,
// U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000.
bool IsPythonSpace(char32_t code_point);

// text.strip() and text.rstrip(): without leading and/or trailing whitespace.
std::string PythonStrip(std::string_view text);
std::string PythonRstrip(std::string_view text);

// len(re.split(r"\s+", text)): the whitespace runs + 1 (lm-eval's word count).
int64_t PythonWordCount(std::string_view text);

// text.capitalize(): the first character title-cased, the rest lower-cased, each by its full
// mapping (one to three code points: "ß" -> "Ss", "ﬃ" -> "Ffi", "İ" -> "i̇"); a capital sigma
// becomes final sigma "ς" after a cased character with no cased character after it (characters
// that are case-ignorable skipped on both sides), else "σ".
std::string PythonCapitalize(std::string_view text);

// The Unicode version of the tables (Python's unicodedata.unidata_version where they were made).
std::string_view PythonTextUnicodeVersion();

}  // namespace crucible
