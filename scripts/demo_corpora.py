#!/usr/bin/env python3
"""Converts the demo corpora from Debian packages into jsonl documents ({"text": ...} per line).

  kjv       bible-kjv: the King James Bible from the `bible` command, one chapter per document
  fortunes  fortunes, fortunes-min: /usr/share/games/fortunes/*, one fortune per document
  jargon    jargon-text: the Jargon File, one entry (":headword: ...") per document
  gcide     dict-gcide: the GNU Collaborative International Dictionary of English, read from the
            dictzip'ed /usr/share/dictd/gcide.dict.dz through its index, one entry per document
            (every k-th entry, so the dictionary is sampled across the alphabet up to --gcide-mb)

Usage: demo_corpora.py OUT_DIR [--gcide-mb MB]   (standard library only: runs on Debian's python3)
"""
import argparse
import gzip
import json
import os
import re
import subprocess
import sys

FORTUNES = "/usr/share/games/fortunes"
JARGON = "/usr/share/doc/jargon-text/jargon.txt.gz"
GCIDE_DICT = "/usr/share/dictd/gcide.dict.dz"
GCIDE_INDEX = "/usr/share/dictd/gcide.index"
B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def write(path, docs):
    tmp = path + ".tmp"
    count = size = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for d in docs:
            d = d.strip()
            if d:
                f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
                count += 1
                size += len(d.encode())
    os.replace(tmp, path)
    print(f"corpus={os.path.basename(path)} documents={count} mb={size / 1e6:.2f}", flush=True)


def kjv():
    # -f turns pretty-printing off: one verse per line, "Ge1:1 In the beginning ..."
    out = subprocess.run(["bible", "-f", "gen1:1-rev22:21"], check=True, capture_output=True, text=True).stdout
    chapter, verses = None, []
    for line in out.splitlines():
        m = re.match(r"^(\S+?)(\d+):(\d+) (.*)$", line)
        if not m:
            continue
        key = (m.group(1), m.group(2))
        if key != chapter and verses:
            yield " ".join(verses)
            verses = []
        chapter = key
        verses.append(m.group(4))
    if verses:
        yield " ".join(verses)


def fortunes():
    for name in sorted(os.listdir(FORTUNES)):
        path = os.path.join(FORTUNES, name)
        if not os.path.isfile(path) or "." in name:  # skip .dat indexes and .u8 links
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            yield from f.read().split("\n%\n")


def jargon():
    with gzip.open(JARGON, "rt", encoding="utf-8", errors="replace") as f:
        text = f.read()
    entries = re.split(r"\n(?=   :[^:\n]+:)", text)
    for e in entries[1:]:  # the first chunk is the front matter
        yield "\n".join(line.strip() for line in e.splitlines())


def b64(s):
    n = 0
    for c in s:
        n = n * 64 + B64.index(c)
    return n


def gcide(max_mb):
    with gzip.open(GCIDE_DICT, "rb") as f:  # dictzip is gzip with a random-access table
        data = f.read()
    index = []
    with open(GCIDE_INDEX, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) >= 3 and not parts[0].startswith("00-database"):
                index.append((b64(parts[1]), b64(parts[2])))
    index = sorted(set(index))
    total = sum(length for _, length in index)
    step = max(1, int(total / (max_mb * 1e6)))
    for offset, length in index[::step]:
        yield data[offset:offset + length].decode("utf-8", errors="replace")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--gcide-mb", type=float, default=3.0)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    write(os.path.join(args.out, "kjv.jsonl"), kjv())
    write(os.path.join(args.out, "fortunes.jsonl"), fortunes())
    write(os.path.join(args.out, "jargon.jsonl"), jargon())
    write(os.path.join(args.out, "gcide.jsonl"), gcide(args.gcide_mb))


if __name__ == "__main__":
    sys.exit(main())
