// Python's str as lm-eval uses it: whitespace, word counts, strip and capitalize, by example and
// against the python3 on the PATH for every code point.
#include "eval/python_text.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tokenizer/utf8.h"

namespace crucible {
namespace {

TEST(PythonText, WordCountsSplitOnUnicodeWhitespaceAsRe) {
  EXPECT_EQ(PythonWordCount("one two"), 2);
  // No-break space, ideographic space, thin space, NEL and line separator are \s in Python's re.
  EXPECT_EQ(PythonWordCount("a\u00a0b\u3000c\u2009d\u0085e\u2028f"), 6);
  EXPECT_EQ(PythonWordCount("\u00a0a \u00a0b\u00a0"), 4);  // ['', 'a', 'b', '']
  EXPECT_EQ(PythonWordCount("a\x1f"
                            "b"),
            2);
  // Not whitespace to Python: zero-width space, word joiner, the BOM, Mongolian vowel separator.
  EXPECT_EQ(PythonWordCount("a\u200bb\u2060c\ufeffd\u180ee"), 1);
  EXPECT_EQ(PythonWordCount(""), 1);
  EXPECT_EQ(PythonWordCount("a\xff\xa0"
                            "b"),
            1);  // invalid bytes are U+FFFD, not a space
}

TEST(PythonText, StripRemovesUnicodeWhitespaceAtTheEnds) {
  EXPECT_EQ(PythonStrip("\u3000\u00a0 a\u00a0b\u2009\n"), "a\u00a0b");
  EXPECT_EQ(PythonRstrip("\u00a0a\u2028\u0085"), "\u00a0a");
  EXPECT_EQ(PythonStrip("\u200ba\u200b"), "\u200ba\u200b");
}

TEST(PythonText, CapitalizeUsesFullTitleAndLowerMappings) {
  EXPECT_EQ(PythonCapitalize("then THE man"), "Then the man");
  EXPECT_EQ(PythonCapitalize("\u00e9cole"), "\u00c9cole");        // é -> É
  EXPECT_EQ(PythonCapitalize("la \u00c9COLE"), "La \u00e9cole");  // É -> é
  EXPECT_EQ(PythonCapitalize("\u00df"), "Ss");                    // ß title-cases to Ss
  EXPECT_EQ(PythonCapitalize("\ufb03x"), "Ffix");                 // ﬃ -> Ffi
  EXPECT_EQ(PythonCapitalize("\u01c6emal"), "\u01c5emal");        // ǆ -> ǅ, not Ǆ
  EXPECT_EQ(PythonCapitalize("x\u0130"), "Xi\u0307");             // İ -> i̇
  EXPECT_EQ(PythonCapitalize("\u0149"), "\u02bcN");               // ŉ -> ʼN
  EXPECT_EQ(PythonCapitalize(""), "");
}

TEST(PythonText, CapitalSigmaLowersToFinalSigmaAtTheEndOfAWord) {
  // ΟΔΟΣ ΚΑΙ ΣΟΦΙΑ: word-final ς, initial σ.
  EXPECT_EQ(PythonCapitalize("\u039f\u0394\u039f\u03a3 \u039a\u0391\u0399 \u03a3\u039f\u03a6"),
            "\u039f\u03b4\u03bf\u03c2 \u03ba\u03b1\u03b9 \u03c3\u03bf\u03c6");
  // The apostrophe is case-ignorable: ΟΣ'Α is not word-final, ΟΣ' is.
  EXPECT_EQ(PythonCapitalize("\u039f\u03a3'\u0391"), "\u039f\u03c3'\u03b1");
  EXPECT_EQ(PythonCapitalize("\u039f\u03a3'"), "\u039f\u03c2'");
  EXPECT_EQ(PythonCapitalize("\u03a3\u03a3"), "\u03a3\u03c2");  // the first is title-cased
}

// Reads all of a command's stdout.
std::string Output(const std::string& command, int* status) {
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  if (!pipe) return output;
  char buffer[1 << 16];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output.append(buffer, n);
  *status = pclose(pipe);
  return output;
}

// For every code point c: c.isspace(), the word count of "a" c "a", (c "a" c).strip(), and the
// capitalize() of c, "a" c, "A" c "Σ", c "Σ" and "AΣ" c (every title and lower mapping, and
// which side of the final-sigma rule c falls on). Fields end in 0xFF, records in 0xFE (neither is
// a byte of UTF-8); the first line is Python's Unicode version.
constexpr const char* kPythonDump = R"(
import re, sys, unicodedata
out = sys.stdout.buffer
out.write((unicodedata.unidata_version + "\n").encode())
S = "\u03a3"
for c in map(chr, range(0x110000)):
    if 0xD800 <= ord(c) < 0xE000:
        continue
    fields = ["1" if c.isspace() else "0", str(len(re.split(r"\s+", "a" + c + "a"))),
              (c + "a" + c).strip()] + [t.capitalize() for t in (c, "a" + c, "A" + c + S, c + S, "A" + S + c)]
    out.write(b"".join(f.encode() + b"\xff" for f in fields) + b"\xfe")
)";

std::string OursFor(char32_t code_point) {
  std::string c;
  AppendUtf8(code_point, &c);
  const std::string sigma = "\u03a3";
  std::vector<std::string> fields = {IsPythonSpace(code_point) ? "1" : "0",
                                     std::to_string(PythonWordCount("a" + c + "a")),
                                     PythonStrip(c + "a" + c)};
  for (const std::string& t : {c, "a" + c, "A" + c + sigma, c + sigma, "A" + sigma + c})
    fields.push_back(PythonCapitalize(t));
  std::string record;
  for (const auto& f : fields) record += f + "\xff";
  return record + "\xfe";
}

TEST(PythonText, EveryCodePointAgreesWithPython) {
  const std::string script = ::testing::TempDir() + "/python_text_dump.py";
  FILE* file = std::fopen(script.c_str(), "w");
  ASSERT_NE(file, nullptr);
  std::fputs(kPythonDump, file);
  std::fclose(file);
  int status = -1;
  const std::string dump = Output("python3 " + script, &status);
  ASSERT_EQ(status, 0) << "python3 " << script << " failed (python3 is needed for this test)";
  const size_t newline = dump.find('\n');
  ASSERT_NE(newline, std::string::npos);
  ASSERT_EQ(dump.substr(0, newline), PythonTextUnicodeVersion())
      << "python3 has another Unicode version than src/eval/python_text.inc: rerun "
         "scripts/gen-python-text.py with the Python that runs lm-eval";
  size_t pos = newline + 1, differences = 0, compared = 0;
  for (char32_t c = 0; c < 0x110000; ++c) {
    if (c >= 0xD800 && c < 0xE000) continue;
    const size_t end = dump.find('\xfe', pos);
    ASSERT_NE(end, std::string::npos) << "the dump ends before U+" << std::hex << static_cast<uint32_t>(c);
    const std::string theirs = dump.substr(pos, end + 1 - pos);
    pos = end + 1;
    ++compared;
    if (OursFor(c) == theirs) continue;
    if (++differences <= 10) ADD_FAILURE() << "U+" << std::hex << static_cast<uint32_t>(c);
  }
  EXPECT_EQ(differences, 0u) << "of " << compared << " code points";
  EXPECT_EQ(compared, 0x110000u - 0x800u);
  EXPECT_EQ(pos, dump.size());
}

}  // namespace
}  // namespace crucible
