#!/usr/bin/env python3
"""Builds the small conversation set of the post-training demo (scripts/demo-post.sh,
docs/post-training.md "Worked path") from the demo corpora (scripts/fetch-demo-corpora.sh),
deterministically (no randomness; the split is a hash of the question):

  "What does the Jargon File say about X?"  ->  the first sentences of the entry for X
  "What does the dictionary say about W?"   ->  the first definition of W in GCIDE (--gcide N of them)

Written to OUT_DIR as `{"messages": [{"role": "user", ...}, {"role": "assistant", ...}]}` lines
(crucible's `[training] dataset = "sft"` format, docs/post-training.md "Supervised fine-tuning"):

  sft-train.jsonl     the training conversations
  sft-heldout.jsonl   every --heldout-every'th question (by CRC-32 of its text), never trained on

Usage: make-sft-conversations.py CORPORA_DIR OUT_DIR [--heldout-every K] [--gcide N]
       [--max-chars C] [--limit N]   (standard library only)
It prints one line: the counts and the paths.
"""
import argparse
import json
import os
import re
import zlib


def squash(text):
    return " ".join(text.split())


def first_sentences(text, max_chars):
    """The leading sentences of text that fit in max_chars (at least the first, cut at a word if it
    alone is longer)."""
    sentences = re.split(r"(?<=[.!?])\s+(?=[A-Z“\"(])", text)
    answer = ""
    for sentence in sentences:
        candidate = f"{answer} {sentence}".strip()
        if answer and len(candidate) > max_chars:
            break
        answer = candidate
    if len(answer) > max_chars:
        answer = answer[:max_chars].rsplit(" ", 1)[0] + " ..."
    return answer


def jargon_entries(path, max_chars):
    """(term, answer) per Jargon File entry: `:term: pronunciation, n.` then the definition. The
    answer drops cross-reference braces ({foo} -> foo), a leading `[usage note]` and sense number."""
    for line in open(path, encoding="utf-8"):
        text = json.loads(line)["text"]
        m = re.match(r"^:([^:\n]+):[^\n]*\n\s*\n(.*)$", text, re.S)
        if not m:
            continue
        term, body = m.group(1).strip(), m.group(2)
        body = squash(re.sub(r"[{}]", "", body))
        body = re.sub(r"^(\[[^\]]*\]\s*)+", "", body)
        body = re.sub(r"^(1\.\s*)?((n|v|vi|vt|adj|adv|interj)\.\s+)?", "", body)
        if len(body) < 20 or body.startswith("See "):  # a bare cross-reference answers nothing
            continue
        yield term, first_sentences(body, max_chars)


def gcide_entries(path, max_chars):
    """(word, definition) per GCIDE entry: `word \\word\\ pos. [etymology]` then the first sense
    (the text up to the first blank line), without bracketed notes, quotations and --Author cites."""
    for line in open(path, encoding="utf-8"):
        text = json.loads(line)["text"]
        m = re.match(r"^([A-Za-z][A-Za-z' -]*) \\[^\\\n]*\\(.*)$", text, re.S)
        if not m:
            continue
        word = m.group(1).strip()
        rest = re.sub(r"\[[^\]]*\]|\{|\}", "", m.group(2))  # etymology, usage tags, sources; braces
        body = squash(rest.split("\n", 1)[1].split("\n\n")[0]) if "\n" in rest else ""
        body = squash(re.sub(r"--\s*[A-Z][^.]*\.|\"[^\"]*\"", "", body))  # quotations, --Author.
        body = re.sub(r"^(\d+\.\s*)?(\([^)]*\)\s*)?", "", body).strip()
        if len(body) < 20 or body.startswith("See ") or not body[0].isalpha():
            continue
        yield word, first_sentences(body, max_chars)


def conversation(question, answer):
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpora", help="folder with jargon.jsonl (and gcide.jsonl for --gcide)")
    parser.add_argument("out", help="output folder")
    parser.add_argument("--heldout-every", type=int, default=25, help="hold out 1 question in K (default 25)")
    parser.add_argument("--gcide", type=int, default=600, help="dictionary questions to add (default 600; 0: none)")
    parser.add_argument("--max-chars", type=int, default=200, help="answer length cap in characters (default 200)")
    parser.add_argument("--limit", type=int, default=0, help="Jargon File questions at most (0: all)")
    args = parser.parse_args()

    rows = []
    for i, (term, answer) in enumerate(jargon_entries(os.path.join(args.corpora, "jargon.jsonl"), args.max_chars)):
        if args.limit and i >= args.limit:
            break
        rows.append((f"What does the Jargon File say about {term}?", answer))
    gcide = os.path.join(args.corpora, "gcide.jsonl")
    if args.gcide > 0 and os.path.exists(gcide):
        words = list(gcide_entries(gcide, args.max_chars))
        step = max(1, len(words) // args.gcide)  # spread over the alphabet, not the first letters
        for word, answer in words[::step][:args.gcide]:
            rows.append((f"What does the dictionary say about {word}?", answer))

    os.makedirs(args.out, exist_ok=True)
    train, heldout, seen = [], [], set()
    for question, answer in rows:
        if question in seen:  # a term with several entries: the first one
            continue
        seen.add(question)
        held = zlib.crc32(question.encode("utf-8")) % args.heldout_every == 0
        (heldout if held else train).append(conversation(question, answer))
    for name, items in [("sft-train.jsonl", train), ("sft-heldout.jsonl", heldout)]:
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(c, ensure_ascii=False) + "\n" for c in items)
    print(f"conversations train={len(train)} heldout={len(heldout)} "
          f"out={os.path.join(args.out, 'sft-train.jsonl')},{os.path.join(args.out, 'sft-heldout.jsonl')}")


if __name__ == "__main__":
    main()
