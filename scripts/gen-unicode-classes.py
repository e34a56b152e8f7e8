#!/usr/bin/env python3
"""Regenerates src/tokenizer/unicode_classes.inc: for every character class a pre-tokenizer
regex may use (the Unicode general categories, one- and two-letter, LC, \\d, \\s/\\S), the code
points where Debian's PCRE2 (what crucible runs) and the Oniguruma inside Hugging Face
`tokenizers` (what the tokenizer.json was written for) disagree; the same for the two classes
`tokenizers` takes from Rust (the Digits pre-tokenizer's char::is_numeric, measured through
Digits, and the regex crate's \\w that single_word checks, measured through an added token).
Both sides are measured code point by code point over all of U+0000..U+10FFFF (surrogates
excluded: no UTF-8 text holds them):

  PCRE2       the system libpcre2-8 through ctypes, UTF + UCP, find-all of `\\p{X}+` over the
              concatenation of every code point
  tokenizers  a Split(Regex(`\\p{X}+`), removed, invert=True) pre-tokenizer on the same string
              (its offsets are character offsets: the members of the class)

and, for case-insensitive matching, the code points c whose (?i)c matches a different set of
code points in the two engines (their case foldings come from different Unicode versions).

Usage: .venv/bin/python scripts/gen-unicode-classes.py [OUT]   (needs `tokenizers`)
It takes 2-4 minutes. Run it again after upgrading either side: the every-code-point tests in
tests/integration/test_tokenizer_hf.py fail until you do.
"""
import bisect
import ctypes
import ctypes.util
import os
import sys

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "src", "tokenizer", "unicode_classes.inc")

# The classes crucible accepts inside a pattern: the name as Oniguruma writes it, the PCRE2
# spelling of the class it is measured against.
CATEGORIES = ["L", "Lu", "Ll", "Lt", "Lm", "Lo", "LC", "M", "Mn", "Mc", "Me", "N", "Nd", "Nl",
              "No", "P", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "S", "Sm", "Sc", "Sk", "So",
              "Z", "Zs", "Zl", "Zp", "C", "Cc", "Cf", "Cs", "Co", "Cn"]
PCRE2_SPELLING = {"LC": r"\p{L&}"}
CLASSES = [(c, r"\p{%s}" % c, PCRE2_SPELLING.get(c, r"\p{%s}" % c)) for c in CATEGORIES] + [
    ("d", r"\d", r"\d"), ("s", r"\s", r"\s")]

# What `tokenizers` takes from Rust rather than from Oniguruma, measured the same way: the
# characters its Digits pre-tokenizer splits off (char::is_numeric) and the word characters that
# keep a single_word added token from matching (the regex crate's \w), each against a PCRE2 class.
RUST_CLASSES = [("Digits", r"\p{N}"),
                ("word", r"\p{L}\p{M}\p{Nd}\p{Nl}\p{Pc}\x{200C}\x{200D}")]

# C++ array names of the classes that are not general categories.
ARRAY_NAMES = {"d": "DigitEscape", "s": "SpaceEscape", "Digits": "RustNumeric",
               "word": "RustWord"}

CODE_POINTS = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]


def byte_offsets(code_points):
    """The byte offset of each code point in their UTF-8 concatenation."""
    out, offset = [], 0
    for c in code_points:
        out.append(offset)
        offset += 1 if c < 0x80 else 2 if c < 0x800 else 3 if c < 0x10000 else 4
    return out


class Pcre2:
    UTF, UCP, CONFIG_UNICODE_VERSION, CONFIG_VERSION = 0x00080000, 0x00020000, 10, 11

    def __init__(self):
        self.subject = None  # (code points, their UTF-8, byte offsets) of the last search
        self.lib = ctypes.CDLL(ctypes.util.find_library("pcre2-8") or "libpcre2-8.so.0")
        lib = self.lib
        lib.pcre2_compile_8.restype = ctypes.c_void_p
        lib.pcre2_compile_8.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint32,
                                        ctypes.POINTER(ctypes.c_int),
                                        ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p]
        lib.pcre2_match_data_create_8.restype = ctypes.c_void_p
        lib.pcre2_match_data_create_8.argtypes = [ctypes.c_uint32, ctypes.c_void_p]
        lib.pcre2_match_8.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                      ctypes.c_size_t, ctypes.c_uint32, ctypes.c_void_p,
                                      ctypes.c_void_p]
        lib.pcre2_get_ovector_pointer_8.restype = ctypes.POINTER(ctypes.c_size_t)
        lib.pcre2_get_ovector_pointer_8.argtypes = [ctypes.c_void_p]
        lib.pcre2_config_8.argtypes = [ctypes.c_uint32, ctypes.c_void_p]
        lib.pcre2_code_free_8.argtypes = [ctypes.c_void_p]
        lib.pcre2_match_data_free_8.argtypes = [ctypes.c_void_p]

    def config(self, what):
        buffer = ctypes.create_string_buffer(64)
        self.lib.pcre2_config_8(what, buffer)
        return buffer.value.decode()

    def members(self, pattern, code_points=None):
        """The code points (of all, or of `code_points`) that `pattern`+ matches."""
        code_points = CODE_POINTS if code_points is None else code_points
        if self.subject is None or self.subject[0] is not code_points:
            self.subject = (code_points, "".join(map(chr, code_points)).encode("utf-8"),
                            byte_offsets(code_points))
        _, utf8, offsets = self.subject
        error, offset = ctypes.c_int(), ctypes.c_size_t()
        source = (pattern + "+").encode()
        code = self.lib.pcre2_compile_8(source, len(source), self.UTF | self.UCP,
                                        ctypes.byref(error), ctypes.byref(offset), None)
        if not code:
            raise SystemExit(f"PCRE2 cannot compile {pattern}")
        data = self.lib.pcre2_match_data_create_8(1, None)
        out, start = set(), 0
        subject = ctypes.c_char_p(utf8)
        while self.lib.pcre2_match_8(code, subject, len(utf8), start, 0, data, None) >= 0:
            ovector = self.lib.pcre2_get_ovector_pointer_8(data)
            begin, end = ovector[0], ovector[1]
            first = bisect.bisect_left(offsets, begin)
            last = bisect.bisect_left(offsets, end)
            out.update(code_points[first:last])
            start = end
        self.lib.pcre2_code_free_8(ctypes.c_void_p(code))
        self.lib.pcre2_match_data_free_8(ctypes.c_void_p(data))
        return out


def oniguruma_members(pattern, code_points=None):
    code_points = CODE_POINTS if code_points is None else code_points
    split = pre_tokenizers.Split(Regex(pattern + "+"), behavior="removed", invert=True)
    out = set()
    for _, (begin, end) in split.pre_tokenize_str("".join(map(chr, code_points))):
        out.update(code_points[begin:end])
    return out


def rust_numeric():
    """Code points the Digits pre-tokenizer splits off: each stands between two 'a's, so a piece
    of one character other than 'a' is a member."""
    points = [c for c in CODE_POINTS if c != ord("a")]
    text = "a" + "a".join(map(chr, points)) + "a"
    pieces = pre_tokenizers.Digits(individual_digits=True).pre_tokenize_str(text)
    return {ord(p) for p, _ in pieces if len(p) == 1 and p != "a"}


def rust_word():
    """Word characters of single_word: the added token "qq" (single_word) after each code point c
    in "c" "qq" " " matches exactly when c is not a word character."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.add_tokens([AddedToken("qq", single_word=True, normalized=False)])
    qq = tokenizer.token_to_id("qq")
    points = [c for c in CODE_POINTS if c != ord("q")]
    out = set(points) | {ord("q")}  # q itself, an ASCII letter, is a word character
    for k in range(0, len(points), 20000):
        chunk = points[k:k + 20000]
        encoding = tokenizer.encode("".join(chr(c) + "qq " for c in chunk), add_special_tokens=False)
        for token, (start, _) in zip(encoding.ids, encoding.offsets):
            if token == qq:
                out.discard(chunk[start // 4])
    return out


def case_fold_differs(pcre2, entries):
    """Code points whose caseless match, (?i)c, holds other code points in the two engines.
    Measured over every code point with a case mapping or a cased letter category (Lu Ll Lt) in
    Python's Unicode, or new to a class with cased members (Lu Ll Lt LC So Nl Mn) in
    Oniguruma's: a new case pair always has its new member there."""
    import unicodedata
    candidates = {c for c in CODE_POINTS
                  if unicodedata.category(chr(c)) in ("Lu", "Ll", "Lt") or
                  any(f(chr(c)) != chr(c) for f in (str.lower, str.upper, str.casefold))}
    for name, _, added, removed in entries:
        if name in ("Lu", "Ll", "Lt", "LC", "So", "Nl", "Mn"):
            candidates |= added | removed
    candidates = sorted(c for c in candidates if c > 0x20)
    out = set()
    for c in candidates:
        pattern = "(?i)\\x{%X}" % c
        if oniguruma_members(pattern, candidates) != pcre2.members(pattern, candidates):
            out.add(c)
    return out, len(candidates)


# One code point first assigned in each Unicode version, to name the version Oniguruma knows.
VERSION_PROBES = [("14.0", 0x061D), ("15.0", 0x0CF3), ("15.1", 0x2FFC), ("16.0", 0x1C89),
                  ("17.0", 0x10940)]


def oniguruma_unicode_version():
    unassigned = oniguruma_members(r"\p{Cn}")
    known = [v for v, c in VERSION_PROBES if c not in unassigned]
    return known[-1] if known else "older than 14.0"


def ranges(code_points):
    out = []
    for c in sorted(code_points):
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return out


def c_array(name, code_points):
    """`constexpr CodePointRange name[] = {...};`, or "" for an empty set."""
    items = ["{0x%X, 0x%X}" % (a, b) for a, b in ranges(code_points)]
    if not items:
        return ""
    lines, line = [], ""
    for item in items:
        if len(line) + len(item) + 2 > 96:
            lines.append(line.rstrip())
            line = ""
        line += item + ", "
    lines.append(line.rstrip(", "))
    return f"constexpr CodePointRange {name}[] = {{\n" + "\n".join("    " + l for l in lines) + "};\n"


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else OUT
    pcre2 = Pcre2()
    pcre2_version, unicode_version = pcre2.config(Pcre2.CONFIG_VERSION), pcre2.config(
        Pcre2.CONFIG_UNICODE_VERSION)
    oniguruma_version = oniguruma_unicode_version()
    entries, whitespace = [], None
    for name, oniguruma, pcre in CLASSES:
        theirs, ours = oniguruma_members(oniguruma), pcre2.members("[" + pcre + "]")
        added, removed = theirs - ours, ours - theirs
        if name == "s":
            whitespace = theirs
        print(f"{oniguruma:8} oniguruma={len(theirs):7} pcre2={len(ours):7} added={len(added):5} "
              f"({len(ranges(added))} ranges) removed={len(removed):5} "
              f"({len(ranges(removed))} ranges)", file=sys.stderr)
        entries.append((name, pcre, added, removed))
    for (name, pcre), theirs in zip(RUST_CLASSES, (rust_numeric(), rust_word())):
        ours = pcre2.members("[" + pcre + "]")
        added, removed = theirs - ours, ours - theirs
        print(f"{name:8} rust={len(theirs):7} pcre2={len(ours):7} added={len(added):5} "
              f"({len(ranges(added))} ranges) removed={len(removed):5} "
              f"({len(ranges(removed))} ranges)", file=sys.stderr)
        entries.append((name, pcre, added, removed))
    case_folds, case_candidates = case_fold_differs(pcre2, entries)
    print(f"(?i)c      {case_candidates} cased code points, {len(case_folds)} fold differently: "
          + " ".join("U+%04X" % c for c in sorted(case_folds)), file=sys.stderr)
    arrays, rows = [], []
    for name, pcre, added, removed in entries:
        spans = []
        for kind, members in (("Added", added), ("Removed", removed)):
            array = f"k{kind}{ARRAY_NAMES.get(name, name)}"
            arrays.append(c_array(array, members))
            spans.append(f"{array}" if members else "{}")
        pcre_c = pcre.replace("\\", "\\\\")
        rows.append(f'    {{"{name}", "{pcre_c}", {spans[0]}, {spans[1]}}},\n')
    with open(out_path, "w", encoding="utf-8") as f:
        probes = ", ".join("U+%04X" % c for _, c in VERSION_PROBES)
        f.write(f"""// Generated by scripts/gen-unicode-classes.py; do not edit, rerun the script.
// PCRE2 {pcre2_version} (libpcre2-8, Unicode {unicode_version}) against Hugging Face tokenizers
// {tokenizers.__version__} (Oniguruma through the Rust crate onig, Unicode {oniguruma_version}: the newest
// version whose probe it assigns among {probes}),
// measured code point by code point over U+0000..U+10FFFF without the surrogates.
// kUnicodeClassDiffs, one row per class: its name as a pattern writes it (d and s are the
// escapes \\d and \\s; Digits and word are what tokenizers takes from Rust: the Digits
// pre-tokenizer's char::is_numeric and the regex crate's \\w around single_word added tokens),
// the PCRE2 class contents it is measured against, the code points the tokenizers side has and
// PCRE2 lacks (added) and those PCRE2 has and the tokenizers side lacks (removed), as
// inclusive ranges. kOnigurumaWhiteSpace: the members of Oniguruma's \\s. kCaseFoldDiffers:
// the code points c for which (?i)c matches other code points in the two engines (measured
// over every code point with a case mapping or a cased letter category).
// Included by src/tokenizer/oniguruma.cc.

""")
        f.write("".join(arrays))
        for name, members in (("kOnigurumaWhiteSpace", whitespace),
                              ("kCaseFoldDiffers", case_folds)):
            f.write(c_array(name + "Ranges", members))
            f.write(f"constexpr std::span<const CodePointRange> {name}"
                    f"{'(' + name + 'Ranges)' if members else ''};\n")
        f.write("constexpr UnicodeClassDiff kUnicodeClassDiffs[] = {\n" + "".join(rows) + "};\n")
    print(f"wrote {out_path}", file=sys.stderr)


if __name__ == "__main__":
    main()
