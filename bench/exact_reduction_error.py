#!/usr/bin/env python3
"""What the compact exact reduction formats cost in precision: `small` trained on the demo corpora
under each [parallelism] exact_reduction, and the gradient error distribution at fixed states.

    .venv/bin/python bench/exact_reduction_error.py [--steps 300] [--seq-len 128] [--batch 8]
        [--formats fixed128,block48,block32] [--probe-steps 0,100,200,300] [--work DIR]

On one rank `fixed128` is the fp32 gradient itself (each value on the grid 2^-64: exact from 2^-40
up), so it is the reference. Each format then rounds every block of 256 values to its grid
(docs/architecture.md, determinism) before the sum, on one rank as on many, so one rank measures
the rounding that every DP degree gets.

1. The loss curve: each format trains `small` for --steps steps (the data, tokenizer and blend of
   bench/optimizers.py, AdamW, warmup 10%, cosine); printed: the largest and the mean |loss -
   fixed128's loss| over the steps, and the final losses.
2. The gradient error: from fixed128's checkpoints at --probe-steps (0 = the initial weights),
   each format runs one more step with debug.dump_gradients_step, so every format's gradient is
   taken at the same weights and the same batch. Printed per format and state: the share of
   values that are bit-identical, percentiles of |g - g_ref| / |g_ref| over the nonzero g_ref, the
   largest |g - g_ref| relative to the largest |g_ref| of its block of 256, the relative L2 error
   |g - g_ref| / |g_ref| and the relative change of the gradient norm.
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from optimizers import CRUCIBLE, prepare_data, run  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BLOCK = 256


def train_args(opts, blend, tokenizer, fmt, run_dir, steps):
    return [CRUCIBLE, "train", "--config", ROOT / "configs" / "small.toml",
            "--set", f"model.tokenizer_path={tokenizer}", "--set", "training.dataset=blend",
            "--set", f"training.dataset_path={blend}", "--set", f"training.seq_len={opts.seq_len}",
            "--set", f"training.local_batch_size={opts.batch}", "--set", f"training.steps={steps}",
            "--set", f"lr_scheduler.warmup_steps={max(1, opts.steps // 10)}",
            "--set", "lr_scheduler.decay_type=cosine", "--set", f"job.dump_folder={run_dir}",
            "--set", f"parallelism.exact_reduction={fmt}"]


def losses(run_dir):
    path = next(Path(run_dir).rglob("metrics.jsonl"))
    return {r["step"]: r["loss"] for r in map(json.loads, path.read_text().splitlines()) if "loss" in r}


def gradient(run_dir, step):
    return np.fromfile(next(Path(run_dir).rglob(f"gradients-step-{step}.f32")), dtype=np.float32)


def error_row(g, ref):
    g64, r64 = g.astype(np.float64), ref.astype(np.float64)
    err = np.abs(g64 - r64)
    nonzero = r64 != 0
    rel = err[nonzero] / np.abs(r64[nonzero])
    pad = (-len(r64)) % BLOCK
    block_max = np.repeat(np.abs(np.pad(r64, (0, pad))).reshape(-1, BLOCK).max(axis=1), BLOCK)[:len(r64)]
    in_block = err[block_max > 0] / block_max[block_max > 0]
    p50, p90, p99 = np.percentile(rel, [50, 90, 99])
    return (f"{100 * np.mean(g64 == r64):.1f}% | {p50:.1e} | {p90:.1e} | {p99:.1e} | {rel.max():.1e} | "
            f"{in_block.max():.1e} | {np.linalg.norm(g64 - r64) / np.linalg.norm(r64):.1e} | "
            f"{np.linalg.norm(g64) / np.linalg.norm(r64) - 1:+.1e}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--formats", default="fixed128,block48,block32")
    parser.add_argument("--probe-steps", default="0,100,200,300")
    parser.add_argument("--work", default=os.path.expanduser("~/.cache/crucible/bench-optimizers"))
    opts = parser.parse_args()
    work = Path(opts.work)
    work.mkdir(parents=True, exist_ok=True)
    blend, _, tokenizer = prepare_data(work)
    formats = opts.formats.split(",")
    if formats[0] != "fixed128":
        sys.exit("exact_reduction_error: --formats must start with fixed128, the reference")
    probes = [int(p) for p in opts.probe_steps.split(",")]
    interval = [p for p in probes if p > 0]

    curves = {}
    for fmt in formats:
        run_dir = work / f"exact-{fmt}"
        subprocess.run(["rm", "-rf", str(run_dir)])
        extra = []
        if fmt == "fixed128" and interval:  # the states the gradients are probed at
            extra = ["--set", "checkpoint.enable=true", "--set", f"checkpoint.interval={min(interval)}",
                     "--set", "checkpoint.keep_latest_k=0"]
        print(f"phase=bench format={fmt} steps={opts.steps}", flush=True)
        run(train_args(opts, blend, tokenizer, fmt, run_dir, opts.steps) + extra + ["--resume", "none"],
            log=work / f"exact-{fmt}.log")
        curves[fmt] = losses(run_dir)

    print(f"\nsmall on the demo corpora, seq_len {opts.seq_len}, batch {opts.batch}, {opts.steps} steps, one rank\n")
    print("| format | largest |loss - fixed128| | mean | final loss |")
    print("|---|---|---|---|")
    ref = curves["fixed128"]
    for fmt in formats:
        diffs = [abs(curves[fmt][s] - ref[s]) for s in ref]
        print(f"| {fmt} | {max(diffs):.2e} | {np.mean(diffs):.2e} | {curves[fmt][opts.steps]:.6f} |")

    rows = []
    checkpoints = work / "exact-fixed128"
    for probe in probes:
        grads = {}
        for fmt in formats:
            run_dir = work / f"probe-{fmt}-{probe}"
            subprocess.run(["rm", "-rf", str(run_dir)])
            if probe == 0:
                resume = ["--resume", "none"]
            else:
                found = sorted(checkpoints.rglob(f"step-{probe}"))  # the trainer's checkpoint folder name
                if not found:
                    sys.exit(f"exact_reduction_error: no checkpoint of step {probe} under {checkpoints}")
                resume = ["--resume", str(found[0])]
            run(train_args(opts, blend, tokenizer, fmt, run_dir, probe + 1) +
                ["--set", f"debug.dump_gradients_step={probe + 1}", "--set", "checkpoint.enable=false"] + resume,
                log=work / f"probe-{fmt}-{probe}.log")
            grads[fmt] = gradient(run_dir, probe + 1)
        for fmt in formats[1:]:
            rows.append(f"| {fmt} | {probe} | {error_row(grads[fmt], grads['fixed128'])} |")
    print("\nGradient error against fixed128 (the fp32 gradient), one step from fixed128's weights\n")
    print("| format | from step | bit-identical | rel. error p50 | p90 | p99 | max | max / block max | "
          "rel. L2 | norm change |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
