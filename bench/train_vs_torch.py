#!/usr/bin/env python3
"""Training throughput on the CPU: Crucible against today's PyTorch from pip, same model, data
shape, optimizer and thread count, each run in its own process, interleaved, repeated.

    python3 bench/train_vs_torch.py [--configs small:512:8,tiny:256:8] [--all] [--repeats 3]
        [--steps 6] [--warmup 2] [--threads 2] [--variants eager,eager+sdpa,compile,compile+sdpa]
        [--precision fp32|bf16] [--peer-python PATH] [--json OUT.json]

The peer is PyPI's current torch (the "current" environment of scripts/setup-current.sh, a venv
under ~/.cache/crucible built once per machine; pip's default wheel bundles the CUDA libraries, a
3.2 GB download that takes minutes the first time, unused here) running bench/torch_peer.py in
four variants: eager with the textbook masked softmax (`eager`), eager with
F.scaled_dot_product_attention(is_causal=True) (`eager+sdpa`), and both under torch.compile
(`compile`, `compile+sdpa`; inductor's cache in ~/.cache/crucible/bench-inductor, so a repeat runs
warm). Crucible runs `crucible train` on synthetic data with checkpoints off. Each side skips
--warmup steps (torch.compile compiles there) and times --steps steps; a run's tokens/s is its
timed tokens over its timed seconds. Crucible's first run of each config measures the GEMM
ceiling again before its steps (metrics.remeasure_peak; the cache keeps the higher value), so its
MFU is not read against a ceiling cached while the machine was slower.

Every (config, side) runs --repeats times; the sides take turns within a repeat, their order
rotated from repeat to repeat, so slow drift in the machine's load falls on every side alike. The
1-minute load average before each run and each run's peak RSS (wait4's ru_maxrss) are recorded.
Printed per config: median tokens/s with min-max, peak RSS, load; then Crucible's median over the
best peer's median, with the range of the per-repeat ratios.

--configs: FLAVOR:SEQ_LEN:BATCH,... (default small:512:8,tiny:256:8); --all adds small:2048:2
and base:1024:4 (base takes minutes per run on 2 cores).

--precision bf16: mixed precision on both sides, as each side's user would run it: Crucible with
training.mixed_precision_param = "bfloat16" (fp32 master weights; bf16 operands, on AVX-512 BF16
CPUs the native vdpbf16ps products), the peer under torch.autocast("cpu", torch.bfloat16).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import tomllib

from llama_flavors import FLAVORS
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEER = ROOT / "bench" / "torch_peer.py"
VARIANTS = {  # name -> torch_peer.py flags
    "eager": ["--attention", "naive", "--no-compile"],
    "eager+sdpa": ["--attention", "sdpa", "--no-compile"],
    "compile": ["--attention", "naive", "--compile"],
    "compile+sdpa": ["--attention", "sdpa", "--compile"],
}
EXTRA_CONFIGS = ["small:2048:2", "base:1024:4"]


def run_measured(cmd, env):
    """Runs cmd to completion; returns (returncode, stdout, stderr, peak RSS bytes of that child)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([str(c) for c in cmd], env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return proc.returncode, out.read(), err.read(), usage.ru_maxrss * 1024


def crucible_run(args, flavor, seq_len, batch, remeasure_peak=False):
    with tempfile.TemporaryDirectory() as run_dir:
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
        cmd = [args.crucible, "train", "--set", f"model.flavor={flavor}",
               "--set", f"training.seq_len={seq_len}", "--set", f"training.local_batch_size={batch}",
               "--set", f"training.steps={args.warmup + args.steps}", "--set", f"job.dump_folder={run_dir}",
               "--set", "checkpoint.enable=false", "--set", "validation.enable=false"]
        if remeasure_peak:  # before the steps: the cache keeps the higher of the cached and the new
            cmd += ["--set", "metrics.remeasure_peak=true"]
        if args.precision == "bf16":
            cmd += ["--set", "training.mixed_precision_param=bfloat16"]
        code, out, err, rss = run_measured(cmd, env)
        if code != 0:
            sys.exit(f"train_vs_torch: crucible train exited {code}:\n{err[-2000:]}")
        check_same_model(run_dir, flavor)
        records = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
        timed = [r["step_seconds"] for r in records[args.warmup:]]
        mfu = records[-1].get("mfu")
        start = next(l for l in out.splitlines() if l.startswith("phase=start "))
        peak = dict(f.split("=", 1) for f in start.split() if f.startswith(("peak_gflops=", "peak_source=")))
        return {"tokens_per_second": batch * seq_len * len(timed) / sum(timed), "peak_rss_bytes": rss,
                "final_loss": records[-1]["loss"], "mfu": mfu, **peak}


def peer_run(args, variant, flavor, seq_len, batch):
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(args.inductor_cache), OMP_NUM_THREADS=str(args.threads))
    cmd = [args.peer_python, PEER, "--flavor", flavor, "--seq-len", seq_len, "--batch", batch,
           "--steps", args.steps, "--warmup", args.warmup, "--threads", args.threads, *VARIANTS[variant],
           "--autocast", "bf16" if args.precision == "bf16" else "none"]
    code, out, err, rss = run_measured(cmd, env)
    if code != 0:
        sys.exit(f"train_vs_torch: torch_peer.py {variant} exited {code}:\n{err[-3000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    result["peak_rss_bytes"] = rss
    return result


def check_same_model(run_dir, flavor):
    """The peer's model must be the one Crucible trained: compares with the run's config.toml."""
    model = tomllib.loads(Path(run_dir, "config.toml").read_text())["model"]
    f = FLAVORS[flavor]
    for key, value in [("dim", f["dim"]), ("n_layers", f["layers"]), ("n_heads", f["heads"]),
                       ("n_kv_heads", f["kv"]), ("vocab_size", f["vocab"]), ("ffn_hidden_dim", f["ffn"]),
                       ("tie_embeddings", str(f["tie"]).lower())]:
        if str(model[key]) != str(value):
            sys.exit(f"train_vs_torch: bench/llama_flavors.py's {flavor} has {key} = {value}, crucible's "
                     f"{model[key]} (src/model/llama_config.cc): make them agree")


def mib(b):
    return f"{b / 2**20:.0f} MiB"


def report(config, runs, variants):
    print(f"\n## {config}")
    print(f"| side | tok/s median | min-max | peak RSS | load (1 min) |")
    print("|---|---|---|---|---|")
    medians = {}
    for side in ["crucible"] + variants:
        rs = runs[side]
        tps = [r["tokens_per_second"] for r in rs]
        medians[side] = statistics.median(tps)
        print(f"| {side} | {medians[side]:.1f} | {min(tps):.1f}-{max(tps):.1f} | "
              f"{mib(max(r['peak_rss_bytes'] for r in rs))} | "
              f"{min(r['load'] for r in rs):.2f}-{max(r['load'] for r in rs):.2f} |")
    best = max(variants, key=lambda v: medians[v])
    per_repeat = [c["tokens_per_second"] / p["tokens_per_second"] for c, p in zip(runs["crucible"], runs[best])]
    ratio = medians["crucible"] / medians[best]
    mfus = [r["mfu"] for r in runs["crucible"] if r.get("mfu") is not None]
    last = runs["crucible"][-1]
    print(f"ratio crucible / best peer ({best}) = {ratio:.2f} (per repeat {min(per_repeat):.2f}-"
          f"{max(per_repeat):.2f})" + (f"; crucible mfu median {statistics.median(mfus):.1f}% of the GEMM ceiling "
                                       f"{last['peak_gflops']} GFLOP/s ({last['peak_source']})" if mfus else ""))
    return {"config": config, "medians": medians, "best_peer": best, "ratio": ratio, "runs": runs}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="small:512:8,tiny:256:8")
    parser.add_argument("--all", action="store_true", help="also " + ",".join(EXTRA_CONFIGS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--crucible", default=os.environ.get("CRUCIBLE", str(ROOT / "build" / "crucible")))
    parser.add_argument("--peer-python", help="default: the environment scripts/setup-current.sh builds")
    parser.add_argument("--json", help="also write every run here")
    args = parser.parse_args()
    variants = args.variants.split(",")
    for v in variants:
        if v not in VARIANTS:
            sys.exit(f"train_vs_torch: --variants: unknown variant {v!r} (known: {', '.join(VARIANTS)})")
    if not args.peer_python:
        print("train_vs_torch: resolving the current PyTorch (scripts/setup-current.sh; the first "
              "time it downloads about 3.2 GB)", flush=True)
        args.peer_python = subprocess.run([ROOT / "scripts" / "setup-current.sh"], check=True,
                                          capture_output=True, text=True).stdout.strip().splitlines()[-1]
    cache = Path(os.environ.get("CRUCIBLE_CACHE", Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                                / "crucible"))
    args.inductor_cache = cache / "bench-inductor"
    args.inductor_cache.mkdir(parents=True, exist_ok=True)
    configs = args.configs.split(",") + (EXTRA_CONFIGS if args.all else [])
    torch_version = subprocess.run([args.peer_python, "-c", "import torch; print(torch.__version__)"],
                                   capture_output=True, text=True, check=True).stdout.strip()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"phase=start cpu=\"{cpu}\" threads={args.threads} torch={torch_version} repeats={args.repeats} "
          f"steps={args.steps} warmup={args.warmup} variants={','.join(variants)}", flush=True)
    results = []
    for config in configs:
        flavor, seq_len, batch = config.split(":")
        seq_len, batch = int(seq_len), int(batch)
        sides = ["crucible"] + variants
        runs = {side: [] for side in sides}
        for repeat in range(args.repeats):
            order = sides[repeat % len(sides):] + sides[:repeat % len(sides)]
            for side in order:
                load = os.getloadavg()[0]
                r = (crucible_run(args, flavor, seq_len, batch, remeasure_peak=repeat == 0) if side == "crucible"
                     else peer_run(args, side, flavor, seq_len, batch))
                r["load"] = load
                runs[side].append(r)
                print(f"phase=run config={config} repeat={repeat + 1}/{args.repeats} side={side} "
                      f"tok/s={r['tokens_per_second']:.1f} peak_rss={mib(r['peak_rss_bytes'])} load={load:.2f}",
                      flush=True)
        results.append(report(config, runs, variants))
    if args.json:
        Path(args.json).write_text(json.dumps({"torch": torch_version, "cpu": cpu, "threads": args.threads,
                                               "results": results}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
