#!/usr/bin/env python3
"""Builds the demo multiple-choice tasks (lm-eval JSONL shapes) from the demo corpora's Debian
sources (see scripts/fetch-demo-corpora.sh and docs/data.md), deterministically (fixed seed,
sorted inputs):

  kjv_next_verse.jsonl   generic   {context, choices, gold}: a King James verse; choose the verse
                                   that follows it among 3 other verses of the same book
  fortune_ending.jsonl   hellaswag {ctx, endings, label}: the first half of a fortune; choose its
                                   true second half among the second halves of 3 other fortunes
  jargon_term.jsonl      arc       {question, choices {text, label}, answerKey}: the first sentence
                                   of a Jargon File definition (headword masked); choose the term
  kjv_word_order.jsonl   generic   {context, choices, gold}: the first words of a King James verse;
                                   choose its true rest among 3 shuffles of the same words (the
                                   easiest task: a model that learns English word order passes it)

Usage: make-demo-tasks.py OUT_DIR [--items N] [--seed S]   (standard library only)
Written to configs/tasks/ by default; `crucible eval RUN --tasks configs/tasks/*.jsonl` scores them.
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_corpora  # noqa: E402  (the same sources and parsing as the demo corpora)

CHOICES = 4


def squash(text):
    return " ".join(text.split())


def distinct(texts, answer):
    """The first CHOICES - 1 distinct texts (in the seeded order given) that are not the answer."""
    picked = []
    for text in texts:
        if text != answer and text not in picked:
            picked.append(text)
            if len(picked) == CHOICES - 1:
                break
    return picked


def with_answer(rng, distractors, answer):
    """The choices with the answer at a seeded random position, and that position."""
    gold = rng.randrange(CHOICES)
    return distractors[:gold] + [answer] + distractors[gold:], gold


def kjv_verses():
    """(book, text) per verse, in canonical order, from the `bible` command (bible-kjv)."""
    out = subprocess.run(["bible", "-f", "gen1:1-rev22:21"], check=True, capture_output=True, text=True).stdout
    verses = []
    for line in out.splitlines():
        m = re.match(r"^(\S+?)(\d+):(\d+) (.*)$", line)
        if m:
            verses.append((m.group(1), squash(m.group(4))))
    return verses


def kjv_next_verse(rng, items):
    verses = kjv_verses()
    by_book = {}
    for i, (book, _) in enumerate(verses):
        by_book.setdefault(book, []).append(i)
    candidates = [i for i in range(len(verses) - 1) if verses[i][0] == verses[i + 1][0]]
    rows = []
    for i in sorted(rng.sample(candidates, items)):
        book, text = verses[i]
        true_next = verses[i + 1][1]
        pool = [j for j in by_book[book] if j not in (i, i + 1) and verses[j][1] not in (text, true_next)]
        distractors = distinct((verses[j][1] for j in rng.sample(pool, len(pool))), true_next)
        choices, gold = with_answer(rng, distractors, true_next)
        rows.append({"context": text, "choices": choices, "gold": gold})
    return rows


def fortune_ending(rng, items):
    fortunes = []
    for text in demo_corpora.fortunes():
        words = squash(text).split(" ")
        # Prose fortunes of 12 to 60 words (no ASCII art, no attribution-only lines).
        if 12 <= len(words) <= 60 and not re.search(r"[_|\\/]{3}", text) and "--" not in text:
            fortunes.append(words)
    fortunes = sorted(set(tuple(w) for w in fortunes))
    chosen = rng.sample(range(len(fortunes)), items)
    rows = []
    for k in chosen:
        words = fortunes[k]
        cut = len(words) // 2
        ctx, ending = " ".join(words[:cut]), " ".join(words[cut:])
        others = distinct((" ".join(fortunes[j][len(fortunes[j]) // 2:])
                           for j in rng.sample(range(len(fortunes)), 2 * CHOICES) if j != k), ending)
        endings, label = with_answer(rng, others, ending)
        rows.append({"ctx": ctx, "endings": endings, "label": label})
    return rows


def jargon_term(rng, items):
    entries = []
    for entry in demo_corpora.jargon():
        m = re.match(r"^:([^:\n]+):[^\n]*\n(.*)$", entry, re.S)
        if not m:
            continue
        term, body = m.group(1).strip(), squash(m.group(2))
        body = re.sub(r"^(\[[^\]]*\]\s*)+", "", body)  # leading [tags]
        body = re.sub(r"[{}]", "", body)  # cross-reference braces
        sentence = re.match(r"^(.{20,300}?[.!?])(\s|$)", body)
        if not sentence or len(term) > 30:
            continue
        question = re.sub(re.escape(term), "___", sentence.group(1), flags=re.I)
        entries.append((term, question))
    entries = sorted(set(entries))
    terms = sorted({t for t, _ in entries})
    rows = []
    for k in sorted(rng.sample(range(len(entries)), items)):
        term, question = entries[k]
        others = [t for t in rng.sample(terms, 2 * CHOICES) if t.lower() != term.lower()][: CHOICES - 1]
        texts, gold = with_answer(rng, others, term)
        labels = "ABCD"[:CHOICES]
        rows.append({"question": f"Which Jargon File term is this? {question}",
                     "choices": {"text": texts, "label": list(labels)}, "answerKey": labels[gold]})
    return rows


def kjv_word_order(rng, items):
    verses = [text for _, text in kjv_verses()]
    rows = []
    candidates = [i for i, text in enumerate(verses) if 12 <= len(text.split()) <= 30]
    for i in sorted(rng.sample(candidates, items)):
        words = verses[i].split()
        cut = 4
        context, rest = " ".join(words[:cut]), words[cut:]
        true_rest = " ".join(rest)
        choices = [true_rest]
        while len(choices) < CHOICES:
            shuffled = rest[:]
            rng.shuffle(shuffled)
            if " ".join(shuffled) not in choices:
                choices.append(" ".join(shuffled))
        order = list(range(CHOICES))
        rng.shuffle(order)
        rows.append({"context": context, "choices": [choices[k] for k in order], "gold": order.index(0)})
    return rows


def write(path, rows):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    print(f"task={os.path.basename(path)} items={len(rows)}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", default="configs/tasks")
    parser.add_argument("--items", type=int, default=300, help="items per task")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    # One generator per task, seeded from (seed, task), so tasks do not depend on each other.
    for name, build in [("kjv_next_verse", kjv_next_verse), ("fortune_ending", fortune_ending),
                        ("jargon_term", jargon_term), ("kjv_word_order", kjv_word_order)]:
        rng = random.Random(f"{args.seed}/{name}")
        write(os.path.join(args.out, name + ".jsonl"), build(rng, args.items))


if __name__ == "__main__":
    main()
