#!/usr/bin/env python3
"""Regenerates src/tokenizer/unicode_normalization.inc: the data crucible's NFC, NFD, NFKC, NFKD
and Lowercase normalizers need to give exactly what Hugging Face `tokenizers` gives.

- Normalization forms. `tokenizers` normalizes with the Rust crate
  unicode-normalization-alignments 0.1.12, whose tables are Unicode 9.0.0 (measured: Python's
  unicodedata at 9.0.0 agrees with it on every code point alone and in the contexts below, and
  every later version disagrees on the combining marks and decompositions added since). The
  canonical combining classes, the decompositions and the composition pairs come from the
  unicodedata of a Python whose unidata_version is 9.0.0 (Python 3.6: `--unicode-python`,
  default `python3.6` on PATH or under ~/.pyenv/versions/3.6*), run as a subprocess of this
  script. Hangul syllables are algorithmic and not in the tables.
- Lowercase is Rust's char::to_lowercase (full mappings, e.g. U+0130 -> "i\\u0307"), measured
  through tokenizers' Lowercase normalizer on every code point.

Before writing, the tables are checked against tokenizers itself: the full decomposition of
every code point must be its NFD and NFKD there.

Usage: .venv/bin/python scripts/gen-unicode-normalization.py [--unicode-python PY] [OUT]
(needs `tokenizers`; about a minute). Run it again after upgrading tokenizers: the every-code-
point tests in tests/integration/test_tokenizer_spm_hf.py fail until you do.
"""
import glob
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "src", "tokenizer", "unicode_normalization.inc")
UNICODE_VERSION = "9.0.0"
CODE_POINTS = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]
HANGUL_FIRST, HANGUL_LAST = 0xAC00, 0xD7A3


def dump_ucd():
    """Run under the Unicode 9.0 Python: prints the data as JSON."""
    import unicodedata
    ccc, canonical, compat, composable = {}, {}, {}, []
    for c in CODE_POINTS:
        ch = chr(c)
        if unicodedata.combining(ch):
            ccc[c] = unicodedata.combining(ch)
        if HANGUL_FIRST <= c <= HANGUL_LAST:
            continue
        nfd = unicodedata.normalize("NFD", ch)
        nfkd = unicodedata.normalize("NFKD", ch)
        if nfd != ch:
            canonical[c] = [ord(x) for x in nfd]
        if nfkd != nfd:
            compat[c] = [ord(x) for x in nfkd]
        mapping = unicodedata.decomposition(ch)
        if mapping and not mapping.startswith("<"):
            parts = [int(x, 16) for x in mapping.split()]
            # A primary composite: its one-step canonical mapping is a pair, and NFC gives it back.
            if len(parts) == 2 and unicodedata.normalize("NFC", nfd) == ch:
                composable.append([parts[0], parts[1], c])
    print(json.dumps({"version": unicodedata.unidata_version, "ccc": ccc, "canonical": canonical,
                      "compat": compat, "composition": composable}))


def find_unicode_python(given):
    candidates = [given] if given else []
    candidates += [shutil.which("python3.6") or ""]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.6*/bin/python3")))
    for py in candidates:
        if not py or not os.path.exists(py):
            continue
        version = subprocess.run([py, "-c", "import unicodedata; print(unicodedata.unidata_version)"],
                                 capture_output=True, text=True).stdout.strip()
        if version == UNICODE_VERSION:
            return py
    sys.exit(f"no Python with unicodedata {UNICODE_VERSION} found (give --unicode-python)")


def measure_lowercase():
    """Rust's char::to_lowercase of every code point, through tokenizers' Lowercase."""
    from tokenizers import normalizers
    lower = normalizers.Lowercase()
    out = {}
    chunk = 4096
    code_points = [c for c in CODE_POINTS if c != 0x0A]  # the separator, its own lowercase
    assert lower.normalize_str("\n") == "\n"
    for i in range(0, len(code_points), chunk):
        cps = code_points[i:i + chunk]
        # Each character in its own line: '\n' lowercases to itself, so the lines are the maps.
        lines = lower.normalize_str("\n".join(map(chr, cps))).split("\n")
        assert len(lines) == len(cps)
        for c, mapped in zip(cps, lines):
            if mapped != chr(c):
                out[c] = [ord(x) for x in mapped]
    return out


def check_against_tokenizers(data):
    from tokenizers import normalizers
    nfd, nfkd = normalizers.NFD(), normalizers.NFKD()
    canonical = {int(k): v for k, v in data["canonical"].items()}
    compat = {int(k): v for k, v in data["compat"].items()}
    bad = 0
    for c in CODE_POINTS:
        if HANGUL_FIRST <= c <= HANGUL_LAST:
            continue
        d = canonical.get(c, [c])
        k = compat.get(c, d)
        if nfd.normalize_str(chr(c)) != "".join(map(chr, d)) or \
                nfkd.normalize_str(chr(c)) != "".join(map(chr, k)):
            bad += 1
            if bad < 5:
                print(f"differs from tokenizers at U+{c:04X}", file=sys.stderr)
    if bad:
        sys.exit(f"{bad} code points decompose differently in tokenizers: wrong Unicode version?")


def ranges(mapping):
    """{cp: value} -> [(first, last, value)] over runs of consecutive code points."""
    out = []
    for c in sorted(mapping):
        if out and out[-1][1] == c - 1 and out[-1][2] == mapping[c]:
            out[-1][1] = c
        else:
            out.append([c, c, mapping[c]])
    return out


def wrap(items, indent="    ", width=98):
    lines, line = [], indent
    for item in items:
        piece = item + ","
        if len(line) + len(piece) + 1 > width:
            lines.append(line.rstrip())
            line = indent
        line += piece + " "
    if line.strip():
        lines.append(line.rstrip())
    return "\n".join(lines)


def mapping_table(name, mapping, data_name):
    """A sorted (code point, offset, length) index into one array of code points."""
    rows, data = [], []
    for c in sorted(mapping):
        rows.append("{0x%04X, %d, %d}" % (c, len(data), len(mapping[c])))
        data += mapping[c]
    return (f"constexpr CodePointMapping {name}[] = {{\n{wrap(rows)}}};\n"
            f"constexpr char32_t {data_name}[] = {{\n{wrap(['0x%04X' % x for x in data])}}};\n")


def main():
    args = sys.argv[1:]
    if args and args[0] == "--dump-ucd":
        dump_ucd()
        return
    given = None
    if args and args[0] == "--unicode-python":
        given, args = args[1], args[2:]
    out_path = args[0] if args else OUT
    import tokenizers
    py = find_unicode_python(given)
    data = json.loads(subprocess.run([py, os.path.abspath(__file__), "--dump-ucd"],
                                     capture_output=True, text=True, check=True).stdout)
    assert data["version"] == UNICODE_VERSION
    check_against_tokenizers(data)
    lowercase = measure_lowercase()
    ccc = {int(k): v for k, v in data["ccc"].items()}
    canonical = {int(k): v for k, v in data["canonical"].items()}
    compat = {int(k): v for k, v in data["compat"].items()}
    composition = sorted(tuple(x) for x in data["composition"])
    text = [
        "// Generated by scripts/gen-unicode-normalization.py; do not edit, rerun the script.",
        f"// Unicode {UNICODE_VERSION} (Python's unicodedata at that version: what the crate",
        "// unicode-normalization-alignments 0.1.12 inside Hugging Face tokenizers "
        f"{tokenizers.__version__} knows),",
        "// checked against tokenizers' NFD and NFKD of every code point; Lowercase measured through",
        "// tokenizers' Lowercase normalizer (Rust's char::to_lowercase) on every code point.",
        "// kCombiningClass: (first, last, canonical combining class) for the code points whose class",
        "// is not 0. kCanonical / kCompatibility: the full NFD, and the full NFKD where it differs",
        "// from the NFD, of each code point that changes (Hangul syllables excluded: algorithmic).",
        "// kComposition: (first, second, primary composite) sorted by pair. kLowercase: the",
        "// code points whose lowercase is not themselves. Included by",
        "// src/tokenizer/unicode_normalization.cc.",
        "",
        "constexpr CombiningClassRange kCombiningClass[] = {",
        wrap(["{0x%04X, 0x%04X, %d}" % tuple(r) for r in ranges(ccc)]) + "};",
        mapping_table("kCanonical", canonical, "kCanonicalData"),
        mapping_table("kCompatibility", compat, "kCompatibilityData"),
        "constexpr CompositionPair kComposition[] = {",
        wrap(["{0x%04X, 0x%04X, 0x%04X}" % p for p in composition]) + "};",
        mapping_table("kLowercase", lowercase, "kLowercaseData"),
    ]
    with open(out_path, "w") as f:
        f.write("\n".join(text))
    print(f"wrote {out_path}: {len(ccc)} combining, {len(canonical)} canonical, {len(compat)} "
          f"compatibility, {len(composition)} compositions, {len(lowercase)} lowercase",
          file=sys.stderr)


if __name__ == "__main__":
    main()
