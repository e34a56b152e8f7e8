#!/usr/bin/env python3
"""Crucible against PyTorch on the same GPU, in one run: the same Llama, the same batch and
sequence length, bf16 compute with fp32 master weights on both sides.

    CRUCIBLE=build/crucible python3 bench/gpu_train.py --flavors base,1b --seq-len 2048 \
        --batch 4,1 --steps 4 --out results/

Sides, each in its own process, in turn for each flavor:
  crucible          `crucible train --set training.device=cuda --set
                    training.mixed_precision_param=bfloat16` (checkpoints off, synthetic data)
  torch eager       bench/torch_peer.py --device cuda --autocast bf16 --attention sdpa
  torch compile     the same under torch.compile
Each reports tokens/s over its timed steps (after --warmup untimed ones: compilation, cuBLASLt
heuristics), MFU against two peaks — the bf16 matmul ceiling measured here (torch.matmul of
8192-square bf16 matrices, best of several) and the datasheet's 989 TFLOP/s (H100/H200 SXM dense
bf16) — and peak GPU memory (torch: max_memory_allocated; Crucible: the most nvidia-smi saw its
process use). FLOPs per token are Crucible's own count, 6 N + 6 L d T (`crucible model info`), for every
side. Crucible's per-kernel table is the run's profile
(metrics.profile = true, one extra run of --steps steps), written to <out>/kernels-<flavor>.txt.

Without a CUDA GPU (or without torch.cuda) it prints one line and exits 2. --budget-s stops
starting new runs once the budget is spent and says what it skipped; --hard-stop-s kills a run
still going at that time (it is recorded as an error), so the whole ends before the caller's cap.
<out>/gpu_train.json is rewritten after every row, so a run cut short keeps what it measured.
"""
import argparse
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from llama_flavors import FLAVORS  # noqa: E402

DATASHEET_TFLOPS = 989.0


def fail(message):
    print(f"gpu_train: {message}", file=sys.stderr)
    sys.exit(2)


def matmul_ceiling_tflops():
    import torch
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    best = 0.0
    for _ in range(3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        best = max(best, 10 * 2 * n ** 3 / (time.perf_counter() - start) / 1e12)
    return best


class GpuMemoryWatcher:
    """The most GPU memory nvidia-smi reports for one process, polled every 0.2 s."""

    def __init__(self, pid):
        self.pid, self.peak, self.stop = pid, 0, False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop:
            try:
                text = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                       "--format=csv,noheader,nounits"], capture_output=True,
                                      text=True, timeout=5).stdout
                for line in text.splitlines():
                    pid, used = [x.strip() for x in line.split(",")[:2]]
                    if pid == str(self.pid):
                        self.peak = max(self.peak, int(used) * 2 ** 20)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
            time.sleep(0.2)

    def done(self):
        self.stop = True
        self.thread.join()
        return self.peak


def crucible_side(binary, flavor, seq_len, batch, steps, warmup, run_dir, timeout, profile=False):
    args = [binary, "train", "--set", f"model.flavor={flavor}", "--set", "training.device=cuda",
            "--set", "training.mixed_precision_param=bfloat16", "--set", f"training.seq_len={seq_len}",
            "--set", f"training.local_batch_size={batch}", "--set", f"training.steps={warmup + steps}",
            "--set", "checkpoint.enable=false", "--set", "debug.detectors=false",
            "--set", f"metrics.profile={'true' if profile else 'false'}",
            "--set", f"job.dump_folder={run_dir}"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watcher = GpuMemoryWatcher(proc.pid)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        watcher.done()
        return {"error": f"killed at the hard stop ({timeout:.0f} s left)"}
    peak = watcher.done()
    if proc.returncode != 0:
        return {"error": (stderr.strip().splitlines() or ["exit %d" % proc.returncode])[-1]}
    rates = [float(m) for m in re.findall(r"^step=\d+ .*?tok/s=([0-9.]+)", stdout, re.M)]
    timed = rates[warmup:]
    start = next((l for l in stdout.splitlines() if l.startswith("phase=start")), "")
    return {"tokens_per_second": statistics.median(timed) if timed else 0.0, "steps": timed,
            "peak_gpu_bytes": peak, "start": start, "stdout": stdout}


def torch_side(flavor, seq_len, batch, steps, warmup, compile_, timeout):
    args = [sys.executable, str(HERE / "torch_peer.py"), "--flavor", flavor, "--seq-len", str(seq_len),
            "--batch", str(batch), "--steps", str(steps), "--warmup", str(warmup), "--device", "cuda",
            "--autocast", "bf16", "--attention", "sdpa", "--compile" if compile_ else "--no-compile"]
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"killed at the hard stop ({timeout:.0f} s left)"}
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["exit %d" % proc.returncode])[-1]}
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"tokens_per_second": report["tokens_per_second"], "peak_gpu_bytes": report.get("peak_gpu_bytes", 0),
            "torch": report["torch"]}


def flops_per_token(binary, flavor, seq_len):
    """Crucible's own count (6 N + 6 L d T), from `crucible model info`, for every side."""
    text = subprocess.run([binary, "model", "info", "--set", f"model.flavor={flavor}",
                           "--set", f"training.seq_len={seq_len}"], capture_output=True, text=True,
                          check=True).stdout
    return float(re.search(r"flops_per_token\(seq_len=\d+\)=(\S+)", text).group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flavors", default="base,1b")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", default="4,1", help="micro-batch per flavor, comma-separated")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--budget-s", type=float, default=140,
                        help="start no run after this many seconds")
    parser.add_argument("--hard-stop-s", type=float, default=None,
                        help="kill a run still going after this many seconds (default budget + 60)")
    parser.add_argument("--out", default="gpu-bench-out")
    args = parser.parse_args()
    binary = os.environ.get("CRUCIBLE", str(HERE.parent / "build" / "crucible"))
    try:
        import torch
    except ImportError:
        fail("PyTorch is not installed: the peer needs it")
    if not torch.cuda.is_available():
        fail("no CUDA GPU visible to PyTorch (torch.cuda.is_available() is false); run on a GPU machine")
    if not pathlib.Path(binary).exists():
        fail(f"crucible binary not found at {binary}; set CRUCIBLE")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix="gpu-train-"))  # run directories: weights, not results
    flavors = args.flavors.split(",")
    for flavor in flavors:
        if flavor not in FLAVORS:
            fail(f"--flavors: unknown flavor '{flavor}' (choose from {', '.join(FLAVORS)})")
    batches = [int(b) for b in args.batch.split(",")]
    batches += [batches[-1]] * (len(flavors) - len(batches))
    began = time.perf_counter()
    hard_stop = args.hard_stop_s if args.hard_stop_s is not None else args.budget_s + 60

    def left():
        return max(1.0, hard_stop - (time.perf_counter() - began))

    ceiling = matmul_ceiling_tflops()
    print(f"gpu: {torch.cuda.get_device_name()} torch {torch.__version__}; bf16 matmul ceiling "
          f"{ceiling:.0f} TFLOP/s (measured), datasheet {DATASHEET_TFLOPS:.0f}", flush=True)
    rows, skipped = [], []

    def write_json():  # after every row: a run cut short keeps what it measured
        path = out / "gpu_train.json"
        path.with_suffix(".tmp").write_text(json.dumps(
            {"ceiling_tflops": ceiling, "rows": [dict(flavor=f, batch=b, side=n, **{k: v for k, v in r.items()
                                                                                    if k != "stdout"})
                                                 for f, b, n, r, _ in rows], "skipped": skipped}, indent=1))
        path.with_suffix(".tmp").replace(path)

    for flavor, batch in zip(flavors, batches):
        sides = [("crucible", lambda: crucible_side(binary, flavor, args.seq_len, batch, args.steps,
                                                    args.warmup, work / f"run-{flavor}", left())),
                 ("torch eager", lambda: torch_side(flavor, args.seq_len, batch, args.steps, args.warmup, False,
                                                    left())),
                 ("torch compile", lambda: torch_side(flavor, args.seq_len, batch, args.steps, args.warmup, True,
                                                      left()))]
        flops = flops_per_token(binary, flavor, args.seq_len)
        for name, run in sides:
            if time.perf_counter() - began > args.budget_s:
                skipped.append(f"{flavor}/{name}")
                continue
            result = run()
            rows.append((flavor, batch, name, result, flops))
            write_json()
            rate = result.get("tokens_per_second", 0.0)
            print(f"{flavor} seq={args.seq_len} batch={batch} {name}: "
                  + (f"ERROR {result['error']}" if "error" in result else
                     f"{rate:.0f} tok/s, MFU {100 * rate * flops / 1e12 / ceiling:.1f}% of measured, "
                     f"{100 * rate * flops / 1e12 / DATASHEET_TFLOPS:.1f}% of datasheet, "
                     f"peak GPU memory {result['peak_gpu_bytes'] / 2 ** 30:.2f} GiB"), flush=True)
        if time.perf_counter() - began <= args.budget_s:
            profiled = crucible_side(binary, flavor, args.seq_len, batch, args.steps, 0,
                                     work / f"profile-{flavor}", left(), profile=True)
            table = [l for l in profiled.get("stdout", "").splitlines() if "kernel" in l or "profile" in l]
            (out / f"kernels-{flavor}.txt").write_text("\n".join(table) + "\n")
        else:
            skipped.append(f"{flavor}/profile")
    print("\n| flavor | batch | side | tok/s | MFU (measured) | MFU (989) | peak GPU GiB | crucible / side |")
    print("|---|---|---|---|---|---|---|---|")
    for flavor, batch, name, result, flops in rows:
        ours = next((r for f, _, n, r, _ in rows if f == flavor and n == "crucible"), {})
        rate = result.get("tokens_per_second", 0.0)
        ratio = ours.get("tokens_per_second", 0.0) / rate if rate else float("nan")
        print(f"| {flavor} | {batch} | {name} | {rate:.0f} | {100 * rate * flops / 1e12 / ceiling:.1f}% | "
              f"{100 * rate * flops / 1e12 / DATASHEET_TFLOPS:.1f}% | {result.get('peak_gpu_bytes', 0) / 2 ** 30:.2f} | "
              f"{ratio:.2f} |" if "error" not in result else f"| {flavor} | {batch} | {name} | error: {result['error']} |")
    if skipped:
        print(f"skipped (budget {args.budget_s:.0f} s spent): {', '.join(skipped)}")
    write_json()
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
