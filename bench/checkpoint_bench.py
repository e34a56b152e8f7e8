#!/usr/bin/env python3
"""Checkpoint benchmark: the training loop's stall per async save against the time to copy the
same state (weights + AdamW moments, fp32) in memory, and the time a resumed run needs to reach
its first step.

    CRUCIBLE=build/crucible .venv/bin/python bench/checkpoint_bench.py [--flavors small base]

Per flavor: trains `steps` steps with async saves every `interval` steps (the stall is what the
trainer reports per save: waiting for a previous save + copying into the host snapshot), then
restarts the run with one more step and times process start -> phase=resume -> first step= line.
Baseline: numpy copying a buffer of the state's size into a warm one (single thread, median of 7).
Target: median stall <= 1.5x the memory copy."""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

CRUCIBLE = os.environ.get("CRUCIBLE", "build/crucible")
# flavor: (steps, interval, seq_len). The interval is chosen so that a save's background write
# (about 0.4 s for small, 4.5 s for base here) ends before the next save starts, as in a real run
# (intervals of minutes); otherwise the stall would measure the disk, not the snapshot copy.
SETTINGS = {
    "tiny": (24, 3, 64),
    "small": (24, 3, 64),
    "base": (16, 4, 512),
}


def memcopy_seconds(nbytes, repeats=7):
    """Median time of copying nbytes into a warm buffer (the same statistic as the stall)."""
    source = np.ones(nbytes // 4, dtype=np.float32)
    destination = np.ones_like(source)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(destination, source)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def train(run_dir, flavor, steps, interval, seq_len):
    args = [CRUCIBLE, "train", "--set", f"model.flavor={flavor}", "--set", f"training.seq_len={seq_len}",
            "--set", "training.local_batch_size=1", "--set", f"training.steps={steps}",
            "--set", f"checkpoint.interval={interval}", "--set", "checkpoint.async=true",
            "--set", "checkpoint.keep_latest_k=2", "--set", "metrics.peak_gflops=100",
            "--set", "lr_scheduler.warmup_steps=2", "--set", f"job.dump_folder={run_dir}"]
    start = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first_step = resume_line = None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if resume_line is None and line.startswith("phase=resume from="):
            resume_line = time.perf_counter() - start
        if first_step is None and line.startswith("step="):
            first_step = time.perf_counter() - start
    err = proc.stderr.read()
    if proc.wait() != 0:
        sys.exit(f"crucible train failed ({proc.returncode}):\n{err}")
    return "".join(lines), first_step, resume_line


def bench(flavor, workdir):
    steps, interval, seq_len = SETTINGS[flavor]
    run_dir = os.path.join(workdir, flavor)
    out, fresh_first_step, _ = train(run_dir, flavor, steps, interval, seq_len)
    saves = [dict(kv.split("=", 1) for kv in line.split()) for line in out.splitlines()
             if re.match(r"phase=checkpoint step=\d+ mode=async", line)]
    writes = [dict(kv.split("=", 1) for kv in line.split()) for line in out.splitlines()
              if "status=complete" in line]
    state_bytes = int(saves[0]["state_bytes"])
    copy = memcopy_seconds(state_bytes)
    stalls = [float(s["stall_s"]) for s in saves]
    # Resume: one more step than the finished run, so it loads step-<steps> and trains once.
    _, resume_first_step, resume_line = train(run_dir, flavor, steps + 1, interval, seq_len)
    result = {
        "flavor": flavor,
        "state_bytes": state_bytes,
        "memcopy_s": copy,
        "stall_s": stalls,
        "copy_s": [float(s["copy_s"]) for s in saves],
        "wait_s": [float(s["wait_s"]) for s in saves],
        "write_s": [float(w["write_s"]) for w in writes],
        "median_stall_over_memcopy": float(np.median(stalls)) / copy,
        "fresh_start_to_first_step_s": fresh_first_step,
        "resume_start_to_resume_line_s": resume_line,
        "resume_start_to_first_step_s": resume_first_step,
    }
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flavors", nargs="+", default=["small", "base"], choices=sorted(SETTINGS))
    parser.add_argument("--workdir", default=None, help="where the runs go (default: a temp folder)")
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="crucible-ckpt-bench-")
    print(f"threads={os.environ.get('OMP_NUM_THREADS', os.cpu_count())} workdir={workdir}")
    for flavor in args.flavors:
        r = bench(flavor, workdir)
        print(json.dumps(r))
        print(f"{flavor}: state {r['state_bytes'] / 1e6:.1f} MB, memcopy {r['memcopy_s'] * 1e3:.1f} ms, "
              f"stall per save (ms) {[round(s * 1e3, 1) for s in r['stall_s']]}, "
              f"median stall / memcopy = {r['median_stall_over_memcopy']:.2f} (target <= 1.5), "
              f"background write {np.median(r['write_s']):.2f} s; "
              f"resume: start -> first step {r['resume_start_to_first_step_s']:.2f} s "
              f"(fresh start {r['fresh_start_to_first_step_s']:.2f} s)", flush=True)


if __name__ == "__main__":
    main()
