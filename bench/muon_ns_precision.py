#!/usr/bin/env python3
"""Issue 12's open question, made measurable: does Muon degrade at a high learning rate because
of the algorithm, or because its Newton-Schulz iterations run in bf16? Trains the `debug` model
with Muon at increasing LRs, Newton-Schulz in fp32 and in exactly emulated bf16
(optimizer.ns_precision), and prints per run: the final loss, the largest Newton-Schulz iterate
entry and the largest distance from orthogonality seen (metrics.jsonl's muon/ns_max_abs and
muon/ns_orthogonality), and whether the run diverged.

    .venv/bin/python bench/muon_ns_precision.py [--steps 30] [--lrs 0.02,0.2,1,4]
"""
import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CRUCIBLE = os.environ.get("CRUCIBLE", str(ROOT / "build" / "crucible"))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lrs", default="0.02,0.2,1,4")
    opts = parser.parse_args()
    print("| lr | ns_precision | exit | final loss | max NS entry | max ‖XXᵀ−I‖/√m |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for lr in opts.lrs.split(","):
            for precision in ("fp32", "bf16"):
                run_dir = Path(tmp) / f"{lr}-{precision}"
                proc = subprocess.run(
                    [CRUCIBLE, "train", "--config", ROOT / "configs" / "debug.toml", "--set", "optimizer.name=Muon",
                     "--set", f"optimizer.lr={lr}", "--set", f"optimizer.ns_precision={precision}",
                     "--set", f"training.steps={opts.steps}", "--set", "training.seq_len=64",
                     "--set", "training.local_batch_size=4", "--set", "lr_scheduler.warmup_steps=1",
                     "--set", "lr_scheduler.decay_type=constant", "--set", "checkpoint.enable=false",
                     "--set", f"job.dump_folder={run_dir}", "--set", "metrics.peak_gflops=100"],
                    capture_output=True, text=True)
                records = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
                entry = max(r.get("muon/ns_max_abs") or float("nan") for r in records)
                orth = max(r.get("muon/ns_orthogonality") or float("nan") for r in records)
                print(f"| {lr} | {precision} | {proc.returncode} | {records[-1]['loss']:.3f} | {entry:.3f} | {orth:.3f} |",
                      flush=True)


if __name__ == "__main__":
    main()
