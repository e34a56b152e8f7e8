#!/usr/bin/env python3
"""Tensor parallelism against data parallelism on one machine, in one run: each flavor at the same
global batch as 1 rank x 2 threads (the plain model, and its split dimensions in chunks: the cost
of exactness at TP = 1), DP = 2 (2 ranks x 1 thread, ZeRO-1 and ZeRO-0) and TP = 2
(2 ranks x 1 thread), every run with the default block48 exact reduction, without and with sequence parallelism. Prints tokens/s, the parameter state per rank (weights + gradients +
optimizer state, from phase=memory), the activations per rank, the peak resident memory per rank, the bytes each rank
moves per step (the DP reduction's, and what the TP exchanges received), where the step time goes
(the TP exchanges, the DP reduction waited for, the rest: compute), and which of issue 28's
targets hold: the TP=1 cost of exactness <= 5%, TP=2's parameter state <= 0.55x DP=2's, TP=2's
step time <= 1.25x DP=2's; and what sequence parallelism saves of TP=2's activations, at what
cost in step time.

    .venv/bin/python bench/tp_scaling.py [--flavors small,base] [--seq-len 256] [--steps 5] [--rounds 3]

With --rounds N every run is repeated N times, the runs interleaved round by round, and each
figure is the round with the median step time (a shared machine's noise moves single runs by
10-40%).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def human(text):
    value, unit = text.split(" ") if " " in text else (text[:-1], text[-1])
    return float(value) * UNITS[unit]


def run(args, flavor, ranks, threads, settings):
    with tempfile.TemporaryDirectory() as run_dir:
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), **MPI_ENV)
        cmd = ["mpirun", "-np", str(ranks), "--bind-to", "core" if ranks > 1 else "none"]
        for key in list(MPI_ENV) + ["OMP_NUM_THREADS"]:
            cmd += ["-x", key]
        cmd += [args.crucible, "train"]
        for item in [f"model.flavor={flavor}", f"training.seq_len={args.seq_len}",
                     f"training.local_batch_size={args.micro_batch}",
                     f"training.global_batch_size={args.global_batch}", f"training.steps={args.steps}",
                     f"job.dump_folder={run_dir}", "checkpoint.enable=false", "metrics.peak_gflops=100"] + settings:
            cmd += ["--set", item]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        records = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))][1:]  # step 1: warm-up
        step = sum(r["step_seconds"] for r in records) / len(records)
        memory = re.search(r"^phase=memory (.*)$", proc.stdout, re.M).group(1)
        fields = dict(item.split("=", 1) for item in re.findall(r"(\w+=[^=]+?)(?= \w+=|$)", memory))
        state = human(fields["weights"]) + human(fields["grads"]) + float(fields["optimizer_state_bytes"])
        peak = max(int(x) for x in re.search(r"rss_bytes_per_rank=([\d,]+)", proc.stdout).group(1).split(","))
        traffic = re.search(r"bytes_received_per_step=(\d+) exchange_s_per_step=([\d.]+)", proc.stdout)
        return {"step_s": step, "tok_s": args.global_batch * args.seq_len / step, "state": state, "peak": peak,
                "act": human(fields["activations"]),
                "dp_bytes": human(fields["communicated_per_step"]) if ranks > 1 else 0.0,
                "tp_bytes": float(traffic.group(1)) if traffic else 0.0,
                "tp_s": float(traffic.group(2)) if traffic else 0.0,
                "dp_wait_s": sum(r["reduce_wait_s"] for r in records) / len(records),
                "digest": re.search(r"weights_xxh3=(\w+)", proc.stdout).group(1)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flavors", default="small,base")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--chunks", type=int, default=2, help="parallelism.tensor_parallel_chunks of the TP runs")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved repetitions; the median round is kept")
    parser.add_argument("--crucible", default=os.environ.get("CRUCIBLE", "build/crucible"))
    args = parser.parse_args()
    # Every run with the default exact reduction (block48), the chunked and TP ones included.
    exact = [f"parallelism.tensor_parallel_chunks={args.chunks}"]
    for flavor in args.flavors.split(","):
        configs = {
            "1x2 plain": (1, 2, []),
            f"1x2 chunks={args.chunks}": (1, 2, exact),
            "DP=2": (2, 1, []),
            "DP=2 ZeRO-0": (2, 1, ["parallelism.zero_stage=0"]),
            "TP=2": (2, 1, exact + ["parallelism.tensor_parallel_degree=2"]),
            "TP=2 SP": (2, 1, exact + ["parallelism.tensor_parallel_degree=2", "parallelism.sequence_parallel=true"]),
        }
        rounds = {name: [] for name in configs}
        for _ in range(args.rounds):
            for name, (ranks, threads, settings) in configs.items():
                rounds[name].append(run(args, flavor, ranks, threads, settings))
        runs = {name: sorted(results, key=lambda r: r["step_s"])[len(results) // 2]
                for name, results in rounds.items()}
        print(f"== {flavor}: seq_len {args.seq_len}, global batch {args.global_batch}, micro-batch "
              f"{args.micro_batch}, {args.steps} steps (the first not timed), median of {args.rounds} round(s)")
        print(f"{'run':<22}{'tok/s':>9}{'step s':>9}{'state/rank':>12}{'act/rank':>10}{'peak rss':>10}{'DP bytes':>10}"
              f"{'TP bytes':>10}{'TP s':>8}{'DP wait':>9}{'compute':>9}")
        for name, r in runs.items():
            compute = r["step_s"] - r["tp_s"] - r["dp_wait_s"]
            print(f"{name:<22}{r['tok_s']:>9.0f}{r['step_s']:>9.3f}{r['state'] / 2**20:>10.1f}Mi"
                  f"{r['act'] / 2**20:>8.1f}Mi{r['peak'] / 2**20:>8.0f}Mi{r['dp_bytes'] / 2**20:>8.1f}Mi{r['tp_bytes'] / 2**20:>8.1f}Mi"
                  f"{r['tp_s']:>8.3f}{r['dp_wait_s']:>9.3f}{compute:>9.3f}")
        plain, chunked = runs["1x2 plain"], runs[f"1x2 chunks={args.chunks}"]
        dp, tp = runs["DP=2"], runs["TP=2"]
        cost = chunked["step_s"] / plain["step_s"] - 1
        memory = tp["state"] / dp["state"]
        time = tp["step_s"] / dp["step_s"]
        print(f"TP=1 cost of exactness: {100 * cost:+.1f}% of the plain step: "
              f"{'holds' if cost <= 0.05 else 'does not hold'} (<= 5%)")
        print(f"TP=2 parameter state / DP=2's (ZeRO-1): {memory:.3f}: "
              f"{'holds' if memory <= 0.55 else 'does not hold'} (<= 0.55); against DP=2 ZeRO-0's: "
              f"{tp['state'] / runs['DP=2 ZeRO-0']['state']:.3f}")
        print(f"TP=2 step time / DP=2's: {time:.3f}: {'holds' if time <= 1.25 else 'does not hold'} (<= 1.25)")
        same = tp["digest"] == chunked["digest"]
        print(f"TP=2 weights_xxh3 {'equals' if same else 'DIFFERS from'} the 1-rank chunked run's ({tp['digest']})")
        sp = runs["TP=2 SP"]
        print(f"TP=2 sequence parallelism: activations {sp['act'] / 2**20:.1f} MiB against {tp['act'] / 2**20:.1f} MiB "
              f"({sp['act'] / tp['act']:.3f}x), peak RSS {sp['peak'] / tp['peak']:.3f}x, step time "
              f"{sp['step_s'] / tp['step_s']:.3f}x, weights_xxh3 "
              f"{'equal' if sp['digest'] == tp['digest'] else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
