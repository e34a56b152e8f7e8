#!/usr/bin/env python3
"""Data-parallel scaling on one machine: 2 MPI ranks x 1 thread vs 1 rank x 2 threads, same model,
global batch and micro-batch, in one run. Prints tokens/s of each, the scaling efficiency
(2x1 rate / 1x2 rate), the bytes each rank sends per step against the theoretical minimum of an
fp32 ring all-reduce, and the share of the gradient reduction hidden behind the backward pass:
1 - (time waited for reductions after the backward pass with overlap) / (the same without
overlap, when the whole reduction runs after the backward pass). ZeRO-3 runs as well. Each
exact reduction format given (--formats, [parallelism] exact_reduction) runs the whole set.

    .venv/bin/python bench/dp_scaling.py [--flavor small] [--seq-len 512] [--steps 4]
        [--formats block48,block32,fixed128] [--repeats 1]

With --repeats R > 1 the two runs the ZeRO-1 efficiency compares (1 rank x 2 threads, 2 ranks x 1
thread with overlap) run R times as adjacent pairs; the efficiency printed is the median of the
pairs' ratios (each pair close in time, so a drift of the machine's speed cancels), with their
range. Single runs on a shared 2-core VM move by +-5%.
"""
import statistics
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def run(binary, ranks, threads, args, zero_stage=None, overlap=True, exact="block48"):
    with tempfile.TemporaryDirectory() as run_dir:
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), **MPI_ENV)
        cmd = ["mpirun", "-np", str(ranks), "--bind-to", "core" if ranks > 1 else "none"]
        for key in list(MPI_ENV) + ["OMP_NUM_THREADS"]:
            cmd += ["-x", key]
        cmd += [binary, "train", "--set", f"model.flavor={args.flavor}", "--set", f"training.seq_len={args.seq_len}",
                "--set", f"training.local_batch_size={args.micro_batch}",
                "--set", f"training.global_batch_size={args.global_batch}", "--set", f"training.steps={args.steps}",
                "--set", f"job.dump_folder={run_dir}", "--set", "checkpoint.enable=false",
                "--set", f"parallelism.zero_stage={args.zero_stage if zero_stage is None else zero_stage}",
                "--set", f"parallelism.overlap_grad_reduce={'true' if overlap else 'false'}",
                "--set", f"parallelism.exact_reduction={exact}"]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr}")
        records = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
        timed = [r["step_seconds"] for r in records[1:]]
        rate = args.global_batch * args.seq_len * len(timed) / sum(timed)
        wait = sum(r["reduce_wait_s"] for r in records[1:]) / len(timed)
        memory = re.search(r"^phase=memory .*$", proc.stdout, re.M).group(0)
        digest = re.search(r"weights_xxh3=(\w+)", proc.stdout).group(1)
        wide = re.search(r"wide_reductions=(\d+)", proc.stdout).group(1)
        return rate, memory + f" wide_reductions={wide}", digest, wait


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flavor", default="small")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--zero-stage", type=int, default=1)
    parser.add_argument("--crucible", default=os.environ.get("CRUCIBLE", "build/crucible"))
    parser.add_argument("--formats", default="block48,block32,fixed128",
                        help="comma-separated [parallelism] exact_reduction formats")
    parser.add_argument("--repeats", type=int, default=1,
                        help="adjacent pairs of the 1x2 and 2x1 ZeRO-1 runs (the median ratio is printed)")
    args = parser.parse_args()
    params = int(subprocess.run([args.crucible, "model", "info", "--set", f"model.flavor={args.flavor}"],
                                capture_output=True, text=True, check=True).stdout.split("total_params=")[1].split()[0])
    minimum = 2 * (2 - 1) / 2 * 4 * params
    for exact in args.formats.split(","):
        print(f"== exact_reduction={exact}")
        pairs = []
        for _ in range(args.repeats):
            one, _, digest_one, _ = run(args.crucible, 1, 2, args, exact=exact)
            two, memory_two, digest_two, wait_two = run(args.crucible, 2, 1, args, exact=exact)
            pairs.append((one, two))
        blocking, _, digest_blocking, wait_blocking = run(args.crucible, 2, 1, args, overlap=False, exact=exact)
        zero3, memory_zero3, digest_zero3, wait_zero3 = run(args.crucible, 2, 1, args, zero_stage=3, exact=exact)
        zero0, memory_zero0, digest_zero0, _ = run(args.crucible, 2, 1, args, zero_stage=0, exact=exact)
        print(f"1 rank x 2 threads:                 tok/s={one:.1f}")
        print(f"2 ranks x 1 thread, no overlap:     tok/s={blocking:.1f}  reduce_wait_s={wait_blocking:.3f}")
        print(f"2 ranks x 1 thread, overlap:        tok/s={two:.1f}  reduce_wait_s={wait_two:.3f}")
        print(f"2 ranks x 1 thread, ZeRO-3 overlap: tok/s={zero3:.1f}  reduce_wait_s={wait_zero3:.3f}")
        print(f"2 ranks x 1 thread, ZeRO-0 overlap: tok/s={zero0:.1f}")
        for stage, memory in ((0, memory_zero0), (args.zero_stage, memory_two), (3, memory_zero3)):
            sent = re.search(r"communicated_per_step=(\S+ \S+)", memory).group(1)
            ratio = re.search(r"vs_fp32_ring=(\S+)", memory).group(1)
            wide = re.search(r"wide_reductions=(\d+)", memory).group(1)
            print(f"  zero_stage={stage}: bytes per rank per step {sent} = {ratio}x the fp32 ring all-reduce "
                  f"minimum {minimum / 2**20:.1f} MiB (wide reductions: {wide})")
        if args.repeats > 1:
            ratios = sorted(t / o for o, t in pairs)
            print(f"pairs (1x2 tok/s, 2x1 tok/s): " + ", ".join(f"({o:.0f}, {t:.0f})" for o, t in pairs))
            print(f"scaling efficiency (2x1 / 1x2), zero_stage={args.zero_stage}, with overlap: median "
                  f"{statistics.median(ratios):.3f} of {len(ratios)} adjacent pairs (range {ratios[0]:.3f}-{ratios[-1]:.3f})")
            one = statistics.median(o for o, _ in pairs)
        print(f"scaling efficiency (2x1 / 1x2), zero_stage={args.zero_stage}: {two / one:.3f} with overlap, "
              f"{blocking / one:.3f} without; ZeRO-3: {zero3 / one:.3f}; ZeRO-0: {zero0 / one:.3f}"
              + (" (against the median 1x2 rate)" if args.repeats > 1 else ""))
        hidden = 1 - wait_two / wait_blocking if wait_blocking > 0 else float("nan")
        print(f"gradient reduction hidden behind the backward pass: {100 * hidden:.1f}% "
              f"(waited {wait_two:.3f} s per step with overlap vs {wait_blocking:.3f} s without)")
        digests = [digest_one, digest_blocking, digest_two, digest_zero3, digest_zero0]
        print(f"identical final weights: {len(set(digests)) == 1} ({' '.join(digests)})")


if __name__ == "__main__":
    main()
