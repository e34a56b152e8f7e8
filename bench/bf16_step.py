#!/usr/bin/env python3
"""The whole training step in fp32, bf16 emulated and bf16 native side by side: runs
`crucible train` once per mode per round, the modes interleaved (the order rotates each round, so
a burst of load on the shared machine falls on all of them), and prints each mode's median tokens/s
and best tokens/s over the rounds (steps 2.. of each run: step 1 touches the memory first) with
their ratios to fp32, and the load average before each run. On a shared machine the best run is
the least disturbed one; --threads 1 is less sensitive to a busy second core.

    python3 bench/bf16_step.py [--flavor small] [--seq-len 512] [--batch 8] [--steps 4]
        [--rounds 3] [--threads 2] [--modes fp32,emulated,native]

`native` is the fastest native kernel the CPU has (amx, else avx512_bf16); `avx512_bf16` and `amx`
name one. A CPU without AVX-512 BF16 refuses `native`: pass --modes fp32,emulated there; one
without AMX refuses `amx`.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MODES = {
    "fp32": [],
    "emulated": ["training.mixed_precision_param=bfloat16", "debug.bf16_path=emulated"],
    "native": ["training.mixed_precision_param=bfloat16", "debug.bf16_path=native"],
    "avx512_bf16": ["training.mixed_precision_param=bfloat16", "debug.bf16_path=avx512_bf16"],
    "amx": ["training.mixed_precision_param=bfloat16", "debug.bf16_path=amx"],
}


def load():
    return os.getloadavg()[0]


def tokens_per_second(args, mode):
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = [args.crucible, "train", "--set", f"model.flavor={args.flavor}",
               "--set", f"training.seq_len={args.seq_len}",
               "--set", f"training.local_batch_size={args.batch}",
               "--set", f"training.steps={args.steps}", "--set", f"job.dump_folder={run_dir}",
               "--set", "checkpoint.enable=false", "--set", "validation.enable=false"]
        for s in MODES[mode]:
            cmd += ["--set", s]
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
        if proc.returncode != 0:
            sys.exit(f"bf16_step: {mode}: crucible train exited {proc.returncode}:\n"
                     f"{proc.stderr[-2000:]}")
        records = [json.loads(l) for l in open(Path(run_dir) / "metrics.jsonl")]
        timed = [r for r in records if "step_seconds" in r and r["step"] >= 2]
        return (sum(r["tokens"] - p["tokens"] for p, r in zip(records, records[1:]) if r in timed)
                / sum(r["step_seconds"] for r in timed))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crucible", default=str(ROOT / "build" / "crucible"))
    parser.add_argument("--flavor", default="small")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--modes", default="fp32,emulated,native")
    args = parser.parse_args()
    if args.steps < 2:
        sys.exit("bf16_step: --steps must be at least 2 (step 1 is not timed)")
    modes = args.modes.split(",")
    for mode in modes:
        if mode not in MODES:
            sys.exit(f"bf16_step: unknown mode {mode!r}; modes: {', '.join(MODES)}")
    print(f"{args.flavor} seq {args.seq_len} batch {args.batch}, {args.steps} steps (timed 2..), "
          f"{args.threads} threads, {args.rounds} rounds; load {load():.2f} at start")
    rates = {mode: [] for mode in modes}
    for r in range(args.rounds):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for mode in order:
            before = load()
            rates[mode].append(tokens_per_second(args, mode))
            print(f"  round {r + 1} {mode:9s} {rates[mode][-1]:7.1f} tok/s  (load {before:.2f})",
                  flush=True)
    base = statistics.median(rates[modes[0]])
    best_base = max(rates[modes[0]])
    print(f"| mode | median tok/s | vs {modes[0]} | best tok/s | vs {modes[0]} | runs |")
    print("|---|---|---|---|---|---|")
    for mode in modes:
        median, best = statistics.median(rates[mode]), max(rates[mode])
        runs = ", ".join(f"{x:.0f}" for x in rates[mode])
        print(f"| {mode} | {median:.1f} | {median / base:.2f}x | {best:.1f} | "
              f"{best / best_base:.2f}x | {runs} |")
    print(f"load {load():.2f} at end")


if __name__ == "__main__":
    main()
