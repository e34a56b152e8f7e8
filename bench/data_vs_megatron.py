"""Data pipeline benchmarks, side by side in one run, with ratios.

1. Blend-index build: 10^7 samples over 1,000 datasets (random weights), Crucible's quota method
   (O(N log D), build/data_bench) against Megatron-core's own `build_blending_indices` (the C++
   helper shipped compiled in the megatron-core wheel, O(N D)). Both outputs are checked: the
   realised mixture's worst deviation from the weights at any prefix is printed for each.
2. Loader throughput: tokens/s that DataLoader delivers from a blend of three prepared corpora,
   against the tokens/s `crucible train` consumes with the `tiny` flavor on the same blend.

Usage: CRUCIBLE=build/crucible .venv/bin/python bench/data_vs_megatron.py [--samples N] [--datasets D]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
import megatron_compat  # noqa: E402


def max_prefix_error(dataset_index, dataset_sample, shares):
    """Worst |taken_d(n) - n w_d| over every prefix n and dataset d, in O(N): a dataset's deviation
    is extreme just before and just after each of its samples (and at the end)."""
    i = np.arange(len(dataset_index), dtype=np.float64)
    w = shares[dataset_index]
    c = dataset_sample.astype(np.float64)
    worst = max(np.abs(c - i * w).max(), np.abs(c + 1 - (i + 1) * w).max())
    counts = np.bincount(dataset_index, minlength=len(shares))
    return max(worst, np.abs(counts - len(dataset_index) * shares).max())


def bench_blend_index(binary_dir, samples, datasets, tmp):
    weights = np.random.default_rng(0).random(datasets)
    shares = weights / weights.sum()
    np.savetxt(tmp / "weights.txt", weights, fmt="%.17g")

    build = megatron_compat.blending_helper()
    meg_index = np.zeros(samples, dtype=np.int16)
    meg_sample = np.zeros(samples, dtype=np.int64)
    t, cpu = time.perf_counter(), time.process_time()
    build(meg_index, meg_sample, shares, datasets, samples, False)
    meg_seconds, meg_cpu = time.perf_counter() - t, time.process_time() - cpu
    meg_error = max_prefix_error(meg_index.astype(np.int64), meg_sample, shares)
    del meg_index, meg_sample

    out = subprocess.run([binary_dir / "data_bench", "blend-index", tmp / "weights.txt", str(samples), tmp / "ours"],
                         check=True, capture_output=True, text=True).stdout
    ours_seconds = float(re.search(r" seconds=([0-9.]+)", out).group(1))
    ours_cpu = float(re.search(r"cpu_seconds=([0-9.]+)", out).group(1))
    ours_index = np.fromfile(tmp / "ours.dataset", dtype=np.uint16).astype(np.int64)
    ours_sample = np.fromfile(tmp / "ours.sample", dtype=np.int64)
    ours_error = max_prefix_error(ours_index, ours_sample, shares)
    return (meg_seconds, meg_cpu, meg_error), (ours_seconds, ours_cpu, ours_error)


def skewed_mixtures(binary_dir, tmp, trials=20, datasets=6, samples=20000):
    """Worst prefix deviation of each method over random skewed mixes (weights = u^3)."""
    build = megatron_compat.blending_helper()
    worst_meg = worst_ours = 0.0
    rng = np.random.default_rng(2)
    for _ in range(trials):
        weights = rng.random(datasets) ** 3 + 1e-3
        shares = weights / weights.sum()
        index, sample = np.zeros(samples, dtype=np.int16), np.zeros(samples, dtype=np.int64)
        build(index, sample, shares, datasets, samples, False)
        worst_meg = max(worst_meg, max_prefix_error(index.astype(np.int64), sample, shares))
        np.savetxt(tmp / "skewed.txt", weights, fmt="%.17g")
        subprocess.run([binary_dir / "data_bench", "blend-index", tmp / "skewed.txt", str(samples), tmp / "skewed"],
                       check=True, capture_output=True)
        worst_ours = max(worst_ours, max_prefix_error(np.fromfile(tmp / "skewed.dataset", dtype=np.uint16).astype(np.int64),
                                                      np.fromfile(tmp / "skewed.sample", dtype=np.int64), shares))
    return worst_meg, worst_ours


def make_blend(crucible, tmp):
    """Three corpora of generated English-like text, a tokenizer trained by crucible, shards."""
    rng = np.random.default_rng(1)
    words = ("the of and to in that is was he for it with as his on be at by had are but from or "
             "have an they which one you were her all she there would their we him been has when who "
             "will more no if out so said what up its about into than them can only other new some "
             "could time these two may then do first any my now such like our over man me even most "
             "made after also did many before must through back years where much your way well down "
             "should because each just those people how too little state good very make world still "
             "own see men work long get here between both life being under never day same another "
             "know while last might us great old year off come since against go came right used take "
             "three").split()
    for name, n_docs, mean_len in [("web", 4000, 200), ("books", 400, 2000), ("dict", 8000, 40)]:
        with open(tmp / f"{name}.jsonl", "w") as f:
            for _ in range(n_docs):
                n = max(5, int(rng.exponential(mean_len)))
                text = " ".join(rng.choice(words, size=n)).capitalize() + "."
                f.write(json.dumps({"text": text}) + "\n")
    subprocess.run([crucible, "tokenizer", "train", "--vocab-size", "8192", "-o", tmp / "tokenizer.json",
                    tmp / "web.jsonl", tmp / "books.jsonl"], check=True, capture_output=True)
    for name in ("web", "books", "dict"):
        subprocess.run([crucible, "data", "prepare", "-q", "-t", tmp / "tokenizer.json", "-o", tmp / "shards" / name,
                        tmp / f"{name}.jsonl"], check=True, capture_output=True)
    (tmp / "blend.txt").write_text("0.6 shards/web web\n0.3 shards/books books\n0.1 shards/dict dict\n")
    return tmp / "blend.txt"


def bench_loader(binary_dir, crucible, tmp, seq_len=256, global_batch=64, batches=400):
    lst = make_blend(crucible, tmp)
    out = subprocess.run([binary_dir / "data_bench", "loader", lst, str(seq_len), str(global_batch), str(batches)],
                         check=True, capture_output=True, text=True).stdout
    loader_tps = float(re.search(r"tokens_per_s=([0-9.]+)", out).group(1))
    config = tmp / "tiny.toml"
    config.write_text(f"""
[job]
dump_folder = "{tmp / 'run'}"
[model]
flavor = "tiny"
tokenizer_path = "{tmp / 'tokenizer.json'}"
[training]
steps = 6
seq_len = {seq_len}
local_batch_size = 8
dataset = "blend"
dataset_path = "{lst}"
[checkpoint]
enable = false
[metrics]
peak_gflops = 100.0
""")
    out = subprocess.run([crucible, "train", "--config", config], check=True, capture_output=True, text=True).stdout
    # Steady state: median tok/s of the steps after the first.
    rates = [float(m) for m in re.findall(r"^step=\d+ .*?tok/s=([0-9.]+)", out, re.M)][1:]
    return loader_tps, float(np.median(rates))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=10_000_000)
    parser.add_argument("--datasets", type=int, default=1000)
    args = parser.parse_args()
    crucible = Path(os.environ.get("CRUCIBLE", REPO / "build" / "crucible")).resolve()
    binary_dir = crucible.parent
    threads = os.cpu_count()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        meg, ours = bench_blend_index(binary_dir, args.samples, args.datasets, tmp)
        print(f"blend-index build: {args.samples:,} samples over {args.datasets:,} datasets, one thread each "
              f"(machine: {threads} cores, load average {os.getloadavg()[0]:.1f})")
        print(f"  {'':38} {'wall s':>8} {'cpu s':>8} {'max prefix error (samples)':>28}")
        print(f"  {'megatron-core build_blending_indices':38} {meg[0]:8.3f} {meg[1]:8.3f} {meg[2]:28.3f}")
        print(f"  {'crucible quota method':38} {ours[0]:8.3f} {ours[1]:8.3f} {ours[2]:28.3f}")
        print(f"  speedup: {meg[0] / ours[0]:.1f}x wall, {meg[1] / ours[1]:.1f}x cpu (target >= 10x)")
        worst_meg, worst_ours = skewed_mixtures(binary_dir, tmp)
        print(f"  skewed mixes (20 x 6 datasets, weights u^3, 20,000 samples): worst prefix deviation "
              f"megatron {worst_meg:.3f}, crucible {worst_ours:.3f} samples")
        loader_tps, train_tps = bench_loader(binary_dir, crucible, tmp)
        print("loader throughput (seq_len 256, global batch 64, blend of 3 corpora)")
        print(f"  {'crucible DataLoader':34} {loader_tps:14,.0f} tokens/s")
        print(f"  {'crucible train, tiny flavor':34} {train_tps:14,.0f} tokens/s consumed")
        print(f"  ratio: {loader_tps / train_tps:.0f}x (target >= 100x)")


if __name__ == "__main__":
    main()
