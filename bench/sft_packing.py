#!/usr/bin/env python3
"""SFT with packing against without, on the demo conversation set, in one run (issue 32's benchmark).

    .venv/bin/python bench/sft_packing.py [--flavor tiny] [--seq-len 512] [--batch 8] [--steps 12]
        [--work ~/.cache/crucible/bench-sft]

Data: the demo corpora (scripts/fetch-demo-corpora.sh) made into conversations by
scripts/make-sft-conversations.py ("What does the Jargon File say about X?" -> the entry, and
dictionary definitions), rendered with ChatML by a 4096-id BPE trained on the corpora with the
ChatML markers as special tokens. Cached in --work.

The same model, seed and global batch (--batch samples of --seq-len) trained --steps steps with
[sft] packing = false and = true, one process, 2 threads. Printed per side: the share of padded
inputs over the whole dataset (the phase=sft line) and over the steps run (metrics.jsonl), tok/s
(every input, padding included) and content tok/s (inputs that are not padding), each the median
of the steps after the first two, and conversations a second (content tok/s over the mean
conversation length). The ratio packed / unpacked of content tok/s is the speed-up a user sees:
the same number of conversations trained in that much less time.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CRUCIBLE = os.environ.get("CRUCIBLE", str(ROOT / "build" / "crucible"))
CHATML = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def run(args, env=None):
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        sys.exit(f"sft_packing: {' '.join(map(str, args[:3]))} ... exited {proc.returncode}\n"
                 f"{proc.stderr[-2000:]}")
    return proc.stdout


def prepare(work):
    """(conversations.jsonl, tokenizer.json), built once."""
    conversations, tokenizer = work / "sft" / "sft-train.jsonl", work / "tokenizer.json"
    if conversations.exists() and tokenizer.exists():
        return conversations, tokenizer
    corpora = work / "corpora"
    run([ROOT / "scripts" / "fetch-demo-corpora.sh", corpora])
    print(run([sys.executable, ROOT / "scripts" / "make-sft-conversations.py", corpora, work / "sft"]).strip())
    names = ["kjv", "fortunes", "jargon", "gcide"]
    run([CRUCIBLE, "tokenizer", "train", "--vocab-size", "4096", "-o", tokenizer,
         *[a for s in CHATML for a in ("--special", s)], *[corpora / f"{n}.jsonl" for n in names]])
    return conversations, tokenizer


def side(args, conversations, tokenizer, packing):
    out = args.work / ("packed" if packing else "unpacked")
    stdout = run([CRUCIBLE, "train", "--config", ROOT / "configs" / f"{args.flavor}.toml",
                  "--set", "training.dataset=sft", "--set", f"training.dataset_path={conversations}",
                  "--set", "sft.chat_template=chatml", "--set", f"sft.packing={'true' if packing else 'false'}",
                  "--set", f"model.tokenizer_path={tokenizer}", "--set", "model.vocab_size=4096",
                  "--set", f"training.seq_len={args.seq_len}", "--set", f"training.local_batch_size={args.batch}",
                  "--set", f"training.global_batch_size={args.batch}", "--set", f"training.steps={args.steps}",
                  "--set", "checkpoint.enable=false", "--set", "validation.enable=false",
                  "--set", f"job.dump_folder={out}", "--resume", "none"], env={"OMP_NUM_THREADS": "2"})
    line = re.search(r"phase=sft conversations=(\d+) .* assistant_tokens=(\d+) .* samples=(\d+) padding=([0-9.]+)",
                     stdout)
    records = [json.loads(l) for l in open(out / "metrics.jsonl")]
    steady = records[2:] or records
    tok = statistics.median(r["tok_per_s"] for r in steady)
    content = statistics.median(r["content_tok_per_s"] for r in steady)
    padded = sum(r["padding_tokens"] for r in records) / (len(records) * args.batch * args.seq_len)
    return {"conversations": int(line.group(1)), "samples": int(line.group(3)),
            "padding_dataset": float(line.group(4)), "padding_steps": padded, "tok_per_s": tok,
            "content_tok_per_s": content, "final_loss": records[-1]["loss"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flavor", default="tiny")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--work", type=Path, default=Path.home() / ".cache" / "crucible" / "bench-sft")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    conversations, tokenizer = prepare(args.work)
    unpacked = side(args, conversations, tokenizer, False)
    packed = side(args, conversations, tokenizer, True)
    mean_tokens = (1 - unpacked["padding_dataset"]) * args.seq_len  # content tokens a conversation
    print(f"sft_packing: flavor={args.flavor} seq_len={args.seq_len} batch={args.batch} steps={args.steps} "
          f"conversations={unpacked['conversations']} mean_tokens={mean_tokens:.1f}")
    print("| side | samples | padding (dataset) | padding (steps) | tok/s | content tok/s | conversations/s |")
    print("|---|---|---|---|---|---|---|")
    for name, r in [("unpacked", unpacked), ("packed", packed)]:
        print(f"| {name} | {r['samples']} | {r['padding_dataset']:.3f} | {r['padding_steps']:.3f} | "
              f"{r['tok_per_s']:.0f} | {r['content_tok_per_s']:.0f} | {r['content_tok_per_s'] / mean_tokens:.1f} |")
    print(f"sft_packing: packed/unpacked content tok/s = "
          f"{packed['content_tok_per_s'] / unpacked['content_tok_per_s']:.2f}x")


if __name__ == "__main__":
    main()
