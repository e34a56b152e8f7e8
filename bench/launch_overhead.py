#!/usr/bin/env python3
"""Launcher overhead: time from start to the first `step=` line, `crucible launch` against bare
`mpirun` on the same job, interleaved in one run (target: within 50 ms).

    CRUCIBLE=build/crucible python3 bench/launch_overhead.py [--repeats 15]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CRUCIBLE = os.environ.get("CRUCIBLE", str(ROOT / "build" / "crucible"))
FAKE = str(ROOT / "tests" / "integration" / "launch" / "fake_trainer.py")


def time_to_first_step(argv, env):
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    first = None
    for line in proc.stdout:
        if first is None and "step=" in line:
            first = time.perf_counter() - start
    proc.wait()
    if proc.returncode != 0 or first is None:
        raise SystemExit(f"{argv[0]} failed (exit {proc.returncode})")
    return first


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--np", type=int, default=1)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_", "CRUCIBLE_"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    job = [sys.executable, FAKE, "--steps", "1"]
    bare = ["mpirun", "--np", str(args.np), "--oversubscribe", "--bind-to", "none", *job]
    with tempfile.TemporaryDirectory() as run_dir:
        launched = [CRUCIBLE, "launch", "--mpi", "openmpi", "--np", str(args.np), "--run-dir", run_dir,
                    "--", *job]
        times = {"bare_mpirun": [], "crucible_launch": []}
        time_to_first_step(bare, env)  # warm the page cache for both
        time_to_first_step(launched, env)
        for _ in range(args.repeats):
            times["bare_mpirun"].append(time_to_first_step(bare, env))
            times["crucible_launch"].append(time_to_first_step(launched, env))
    median = {k: statistics.median(v) for k, v in times.items()}
    # Runs alternate, so each pair saw the same machine load: the median paired difference.
    overhead_ms = statistics.median(
        launched - bare for bare, launched in zip(times["bare_mpirun"], times["crucible_launch"])) * 1000
    for name, values in times.items():
        print(f"{name:16s} median {median[name] * 1000:7.1f} ms  min {min(values) * 1000:7.1f} ms  "
              f"max {max(values) * 1000:7.1f} ms  (n={len(values)})")
    print(f"overhead (median of paired differences): {overhead_ms:.1f} ms  target <= 50 ms: "
          f"{'met' if overhead_ms <= 50 else 'NOT met'}")
    print(json.dumps({"bench": "launch_overhead", "np": args.np, "repeats": args.repeats,
                      "bare_mpirun_ms": round(median["bare_mpirun"] * 1000, 1),
                      "crucible_launch_ms": round(median["crucible_launch"] * 1000, 1),
                      "overhead_ms": round(overhead_ms, 1)}))


if __name__ == "__main__":
    main()
