#!/usr/bin/env python3
"""The optimizer table: the same model, the same tokens and the same steps for each optimizer,
each at the learning rate `crucible lr-find` suggests for it, in one run.

    .venv/bin/python bench/optimizers.py [--optimizers AdamW,Muon,Mano,Mano_v2,SophiaG] [--flavor small]
        [--steps 200] [--seq-len 256] [--batch 8] [--lr Muon=0.02 ...] [--work DIR]
    .venv/bin/python bench/optimizers.py --speed 3 --optimizers AdamW,Muon --steps 12   (speed only)

Data: the demo corpora (scripts/fetch-demo-corpora.sh: King James Bible, fortunes, Jargon File,
GCIDE), the last 2% of each corpus's documents held out for bits per byte, the rest tokenized with
an 8192-id BPE and blended as `make demo` does. Everything lands in --work (default
~/.cache/crucible/bench-optimizers), reused by the next run.

For each optimizer: `crucible lr-find` on the training config (unless --lr names its LR), then
`crucible train` for --steps steps (warmup 10%, cosine decay, metrics.profile on), then `crucible
eval --text` on the held-out documents. Printed, one row each: optimizer, LR (and where it came
from), final train loss, held-out bits per byte, tokens/s, the optimizer's share of the training
time (its profiled seconds over train_s), optimizer-state bytes (rank 0's phase=memory line).
"""
import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CRUCIBLE = os.environ.get("CRUCIBLE", str(ROOT / "build" / "crucible"))
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def run(args, log=None):
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if log:
        Path(log).write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"optimizers: {' '.join(map(str, args[:3]))} ... exited {proc.returncode}\n"
                 f"{proc.stderr[-2000:]}")
    return proc.stdout


def prepare_data(work):
    """Corpora, held-out split, tokenizer, shards and blend list (skipped when present)."""
    blend = work / "blend.txt"
    if blend.exists():
        return blend, work / "heldout.jsonl", work / "tokenizer.json"
    corpora = work / "corpora"
    run([ROOT / "scripts" / "fetch-demo-corpora.sh", corpora])
    train_dir = work / "train"
    train_dir.mkdir(parents=True, exist_ok=True)
    held = []
    names = ["kjv", "fortunes", "jargon", "gcide"]
    for name in names:
        lines = (corpora / f"{name}.jsonl").read_text().splitlines()
        cut = len(lines) - max(1, len(lines) // 50)
        (train_dir / f"{name}.jsonl").write_text("\n".join(lines[:cut]) + "\n")
        held += lines[cut:]
    (work / "heldout.jsonl").write_text("\n".join(held) + "\n")
    tokenizer = work / "tokenizer.json"
    run([CRUCIBLE, "tokenizer", "train", "--vocab-size", "8192", "-o", tokenizer,
         *[train_dir / f"{n}.jsonl" for n in names]])
    for name in names:
        run([CRUCIBLE, "data", "prepare", "-q", "-t", tokenizer, "-o", work / "shards" / name,
             train_dir / f"{name}.jsonl"])
    blend.write_text("0.4 shards/kjv\n0.2 shards/fortunes\n0.2 shards/jargon\n0.2 shards/gcide\n")
    return blend, work / "heldout.jsonl", tokenizer


# Each optimizer's published betas (docs/optimizers.md); AdamW keeps the project's defaults.
PUBLISHED = {"Muon": ["optimizer.beta1=0.95"], "Mano": ["optimizer.beta1=0.95"],
             "Mano_v2": ["optimizer.beta1=0.95"],
             "SophiaG": ["optimizer.beta1=0.965", "optimizer.beta2=0.99"]}


def settings(opts, blend, tokenizer, optimizer, run_dir):
    extra = [arg for item in PUBLISHED.get(optimizer, []) for arg in ("--set", item)]
    return extra + ["--config", ROOT / "configs" / "small.toml", "--set", f"model.flavor={opts.flavor}", "--set", f"model.tokenizer_path={tokenizer}",
            "--set", "training.dataset=blend", "--set", f"training.dataset_path={blend}",
            "--set", f"training.seq_len={opts.seq_len}", "--set", f"training.local_batch_size={opts.batch}",
            "--set", f"training.steps={opts.steps}", "--set", f"optimizer.name={optimizer}",
            "--set", f"lr_scheduler.warmup_steps={max(1, opts.steps // 10)}",
            "--set", "lr_scheduler.decay_type=cosine", "--set", f"job.dump_folder={run_dir}",
            "--set", "checkpoint.enable=true", "--set", f"checkpoint.interval={opts.steps}"]


def find_lr(opts, work, blend, tokenizer, optimizer):
    out = work / f"lr-find-{optimizer}"
    args = [CRUCIBLE, "lr-find", *settings(opts, blend, tokenizer, optimizer, work / "unused"),
            "--steps", str(opts.lr_find_steps), "--out", out]
    run(args, log=work / f"lr-find-{optimizer}.log")
    found = json.loads((out / "lr_find.json").read_text())
    return found["suggested_lr"], f"lr-find ({found['suggestion_rule']})"


def train_and_eval(opts, work, blend, heldout, tokenizer, optimizer, lr):
    run_dir = work / f"run-{optimizer}"
    subprocess.run(["rm", "-rf", str(run_dir)])
    stdout = run([CRUCIBLE, "train", *settings(opts, blend, tokenizer, optimizer, run_dir),
                  "--set", f"optimizer.lr={lr}", "--set", "metrics.profile=true", "--resume", "none"],
                 log=work / f"train-{optimizer}.log")
    done = re.search(r"^done .*train_s=([\d.]+) final_loss=([-\w.]+) tok/s=([\d.]+)", stdout, re.M)
    state = re.search(r"^phase=memory .*optimizer_state=([\d.]+) (\w+)", stdout, re.M)
    optimizer_s = re.search(r"^phase=profile kernel=optimizer seconds=([\d.]+)", stdout, re.M)
    evaluation = work / f"eval-{optimizer}.json"
    run([CRUCIBLE, "eval", "-q", run_dir, "--text", heldout, "--json", evaluation])
    bpb = next(iter(json.loads(evaluation.read_text())["perplexity"].values()))["bits_per_byte"]
    train_s = float(done.group(1))
    return {"loss": float(done.group(2)), "tok_s": float(done.group(3)), "bpb": bpb,
            "optimizer_share": 100 * float(optimizer_s.group(1)) / train_s if optimizer_s else float("nan"),
            "state_bytes": float(state.group(1)) * UNITS[state.group(2)]}


def profile_of(stdout):
    """kernel name -> (seconds, gflop) from the phase=profile lines."""
    out = {}
    for m in re.finditer(r"^phase=profile kernel=(\S+) seconds=([\d.]+)(?:.*? gflop=([\d.]+))?", stdout, re.M):
        out[m.group(1)] = (float(m.group(2)), float(m.group(3) or 0))
    return out


def speed(opts, work, blend, tokenizer, given):
    """Tokens/s of each optimizer over ROUNDS interleaved rounds (A B A B ...: a drift of the
    machine's speed falls on all alike), the same tokens and steps each, and for the optimizers
    whose profile has a newton_schulz entry: its share of the training time against its share of
    the flops (its gflop over its gflop plus the first optimizer's whole profile, the model's
    forward and backward)."""
    names = opts.optimizers.split(",")
    runs = {name: [] for name in names}
    for round_ in range(opts.speed):
        for name in names:
            run_dir = work / f"speed-{name}"
            subprocess.run(["rm", "-rf", str(run_dir)])
            stdout = run([CRUCIBLE, "train", *settings(opts, blend, tokenizer, name, run_dir), "--set", f"optimizer.lr={given.get(name, '1e-3')}",
                          "--set", "metrics.profile=true", "--set", "checkpoint.enable=false",
                          "--resume", "none"], log=work / f"speed-{name}.log")
            done = re.search(r"^done .*train_s=([\d.]+) .*tok/s=([\d.]+)", stdout, re.M)
            runs[name].append((float(done.group(2)), float(done.group(1)), profile_of(stdout)))
            print(f"phase=bench round={round_ + 1}/{opts.speed} optimizer={name} tok/s={done.group(2)}", flush=True)
    median = lambda xs: sorted(xs)[len(xs) // 2]
    base = names[0]
    base_tok = median([r[0] for r in runs[base]])
    model_gflop = median([sum(g for k, (_, g) in r[2].items() if k != "optimizer") for r in runs[base]])
    print(f"\n{opts.flavor}, seq_len {opts.seq_len}, batch {opts.batch}, {opts.steps} steps x {opts.speed} "
          f"interleaved rounds, threads {os.environ.get('OMP_NUM_THREADS', 'all')}, load {os.getloadavg()[0]:.1f}; "
          f"{base}'s kernels: {model_gflop:.0f} GFLOP per run\n")
    print(f"| optimizer | tokens/s (median) | vs {base} | Newton-Schulz share of train_s | its flops share | its GFLOP/s |")
    print("|---|---|---|---|---|---|")
    for name in names:
        tok = median([r[0] for r in runs[name]])
        ns = [(r[2]["newton_schulz"], r[1]) for r in runs[name] if "newton_schulz" in r[2]]
        if ns:  # the median round by Newton-Schulz's share of its train_s
            (sec, gflop), train_s = median([(s / t, (s, g), t) for (s, g), t in ns])[1:]
            shares = f"{100 * sec / train_s:.1f}% | {100 * gflop / (gflop + model_gflop):.1f}% | {gflop / sec:.0f}"
        else:
            shares = "- | - | -"
        print(f"| {name} | {tok:,.0f} | {tok / base_tok:.2f}x | {shares} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--optimizers", default="AdamW,Muon,Mano,Mano_v2,SophiaG")
    parser.add_argument("--flavor", default="small")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr-find-steps", type=int, default=60)
    parser.add_argument("--lr", action="append", default=[], help="NAME=LR: skip lr-find for NAME")
    parser.add_argument("--work", default=os.path.expanduser("~/.cache/crucible/bench-optimizers"))
    parser.add_argument("--speed", type=int, default=0, metavar="ROUNDS",
                        help="only the speed: ROUNDS interleaved rounds of --steps steps per optimizer "
                             "(no lr-find, no eval; --lr or 1e-3), medians and the Newton-Schulz shares")
    opts = parser.parse_args()
    work = Path(opts.work)
    work.mkdir(parents=True, exist_ok=True)
    given = dict(item.split("=", 1) for item in opts.lr)
    blend, heldout, tokenizer = prepare_data(work)
    if opts.speed:
        return speed(opts, work, blend, tokenizer, given)
    rows = []
    for optimizer in opts.optimizers.split(","):
        if optimizer in given:
            lr, source = float(given[optimizer]), "--lr"
        else:
            lr, source = find_lr(opts, work, blend, tokenizer, optimizer)
        print(f"phase=bench optimizer={optimizer} lr={lr:.3g} from={source}", flush=True)
        rows.append((optimizer, lr, source, train_and_eval(opts, work, blend, heldout, tokenizer, optimizer, lr)))
    print(f"\n{opts.flavor}, seq_len {opts.seq_len}, batch {opts.batch}, {opts.steps} steps, "
          f"threads {os.environ.get('OMP_NUM_THREADS', 'all')}, load {os.getloadavg()[0]:.1f}\n")
    print("| optimizer | LR (from) | final loss | held-out bits/byte | tokens/s | optimizer share | state |")
    print("|---|---|---|---|---|---|---|")
    for optimizer, lr, source, r in rows:
        print(f"| {optimizer} | {lr:.3g} ({source.split(' ')[0]}) | {r['loss']:.3f} | {r['bpb']:.3f} | "
              f"{r['tok_s']:,.0f} | {r['optimizer_share']:.1f}% | {r['state_bytes'] / 2**20:.1f} MiB |")


if __name__ == "__main__":
    main()
