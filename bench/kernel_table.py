#!/usr/bin/env python3
"""Where the time of a training step goes: runs `crucible train` with metrics.profile on and
prints the per-kernel table of docs/performance.md (time per step, share, GFLOP per step,
achieved GFLOP/s and its share of the GEMM ceiling, the bandwidth lower bound), then the whole
step against the same ceiling.

    python3 bench/kernel_table.py [--flavor small] [--seq-len 512] [--batch 8] [--steps 6]
        [--warmup 1] [--threads 2] [--set KEY=VALUE ...]

The profile counts every step; --warmup steps are run first in a separate run that also measures
the GEMM ceiling again (metrics.remeasure_peak: the cache keeps the higher of the cached and the new
value, so a ceiling cached while the machine was slower does not make the table's shares read
high), so the table holds the --steps steps only.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def train(args, steps, profile, extra):
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = [args.crucible, "train", "--set", f"model.flavor={args.flavor}",
               "--set", f"training.seq_len={args.seq_len}", "--set", f"training.local_batch_size={args.batch}",
               "--set", f"training.steps={steps}", "--set", f"job.dump_folder={run_dir}",
               "--set", "checkpoint.enable=false", "--set", "validation.enable=false",
               "--set", f"metrics.profile={'true' if profile else 'false'}"]
        for s in extra:
            cmd += ["--set", s]
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
        if proc.returncode != 0:
            sys.exit(f"kernel_table: crucible train exited {proc.returncode}:\n{proc.stderr[-2000:]}")
        records = [json.loads(l) for l in open(Path(run_dir) / "metrics.jsonl")]
        return proc.stdout, records


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flavor", default="small")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--set", action="append", default=[], dest="extra")
    parser.add_argument("--crucible", default=os.environ.get("CRUCIBLE", str(ROOT / "build" / "crucible")))
    args = parser.parse_args()
    train(args, args.warmup, False, ["metrics.remeasure_peak=true", *args.extra])
    out, records = train(args, args.steps, True, args.extra)
    start = next(l for l in out.splitlines() if l.startswith("phase=start "))
    fields = dict(f.split("=", 1) for f in start.split() if "=" in f)
    ceiling = float(fields["peak_gflops"])
    rows = []
    for line in out.splitlines():
        if line.startswith("phase=profile "):
            rows.append(dict(f.split("=", 1) for f in line.split()[1:]))
    steps = args.steps
    print(f"{args.flavor} seq {args.seq_len} batch {args.batch}, {steps} steps, {args.threads} threads, "
          f"GEMM ceiling {ceiling:.1f} GFLOP/s ({fields['peak_source']}), load {os.getloadavg()[0]:.2f}\n")
    print("| kernel | ms/step | share | GFLOP/step | GFLOP/s | of ceiling | GB/s (at least) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        ms = 1000 * float(r["seconds"]) / steps
        gflop = f"{float(r['gflop']) / steps:.2f}" if "gflop" in r else "-"
        rate = r.get("gflops", "-")
        share = f"{r['of_ceiling']}%" if "of_ceiling" in r else "-"
        bw = r.get("gbytes_per_s", "-")
        print(f"| {r['kernel']} | {ms:.1f} | {r['share']}% | {gflop} | {rate} | {share} | {bw} |")
    step_s = sum(r["step_seconds"] for r in records) / len(records)
    mfus = [r["mfu"] for r in records if r.get("mfu") is not None]
    tok_s = args.batch * args.seq_len / step_s
    print(f"\nwhole step: {1000 * step_s:.1f} ms, {tok_s:.1f} tok/s, "
          + (f"MFU {sum(mfus) / len(mfus):.1f}% of the ceiling" if mfus else "MFU n/a"))


if __name__ == "__main__":
    sys.exit(main())
