#!/usr/bin/env python3
"""The mixture of experts (model.name = "deepseek_v3") measured on the demo corpora, in one run.

    .venv/bin/python bench/moe.py balance [--flavor debug] [--steps 300] [--seq-len 128] [--batch 8]
        [--speeds 0.001,0]
    .venv/bin/python bench/moe.py dense [--flavor small] [--steps 30] [--seq-len 256] [--batch 8]
    .venv/bin/python bench/moe.py ep [--flavor small] [--steps 20] [--seq-len 128] [--batch 4]

balance: the same model, tokens and steps with the auxiliary-loss-free balance bias at each
model.bias_update_speed (0: off). Printed per speed: the expert-load coefficient of variation
(the largest over the routed layers, from metrics.jsonl's expert_load) averaged over the first,
middle and last tenth of the steps, the final one, and the final train loss.

dense: the MoE flavor against a dense Llama of about the same active parameters (the same dim,
layers, heads and vocabulary; its FFN width chosen so that its parameter count equals the MoE's
active count), on the same tokens: tokens/s (median of the steps after the first two), the
loss after --steps, and the memory of rank 0's phase=memory and phase=memory_peak lines, with
the MoE's tokens/s as a ratio of the dense one's (target >= 0.7).

ep: the MoE flavor on 2 ranks (mpirun, one thread each), expert_parallel_degree 1 against 2, on
the same tokens (--batch samples a rank, a global batch of 2 x --batch): tokens/s (median of the
steps after the first two), the share of EP=2's step time in its all-to-alls (expert_exchange_s
over step_seconds, rank 0, median), and whether the two runs end with the same weights (they
must: the same bits at every degree).

Data: bench/optimizers.py's (the demo corpora, an 8192-id BPE (model.vocab_size = 8192 in every
flavor), the blend of `make demo`), cached
in --work (default ~/.cache/crucible/bench-optimizers).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from optimizers import CRUCIBLE, ROOT, prepare_data, run  # noqa: E402


def train(opts, blend, tokenizer, run_dir, extra):
    subprocess.run(["rm", "-rf", str(run_dir)])
    args = [CRUCIBLE, "train", "--config", ROOT / "configs" / "small.toml",
            "--set", f"model.tokenizer_path={tokenizer}", "--set", "model.vocab_size=8192",
            "--set", "training.dataset=blend",
            "--set", f"training.dataset_path={blend}", "--set", "lr_scheduler.decay_type=cosine",
            "--set", f"job.dump_folder={run_dir}", "--set", f"training.steps={opts.steps}",
            "--set", f"training.seq_len={opts.seq_len}", "--set", f"training.local_batch_size={opts.batch}",
            "--set", f"training.global_batch_size={opts.batch}", "--set", "checkpoint.enable=false",
            "--set", "validation.enable=false", "--set", f"lr_scheduler.warmup_steps={max(1, opts.steps // 10)}"]
    for item in extra:
        args += ["--set", item]
    stdout = run(args, log=run_dir.parent / f"{run_dir.name}.log")
    records = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    return stdout, records


def balance(opts, blend, tokenizer, work):
    print(f"flavor={opts.flavor} steps={opts.steps} seq_len={opts.seq_len} batch={opts.batch} lr={opts.lr}")
    print(f"{'bias_update_speed':>18} {'cv first 10%':>13} {'cv middle 10%':>14} {'cv last 10%':>12} "
          f"{'cv final':>9} {'final loss':>11}")
    tenth = max(1, opts.steps // 10)
    for speed in opts.speeds.split(","):
        _, records = train(opts, blend, tokenizer, work / f"moe-balance-{speed}",
                           ["model.name=deepseek_v3", f"model.flavor={opts.flavor}",
                            f"model.bias_update_speed={speed}", f"optimizer.lr={opts.lr}"])
        cv = [max(layer["cv"] for layer in r["expert_load"]) for r in records]
        middle = len(cv) // 2 - tenth // 2
        print(f"{speed:>18} {statistics.mean(cv[:tenth]):>13.3f} "
              f"{statistics.mean(cv[middle:middle + tenth]):>14.3f} {statistics.mean(cv[-tenth:]):>12.3f} "
              f"{cv[-1]:>9.3f} {records[-1]['loss']:>11.4f}")


def memory(stdout):
    peak = re.search(r"phase=memory_peak rss_bytes_per_rank=(\d+)", stdout)
    state = re.search(r"model_state_bytes=(\d+)", stdout)
    return int(state.group(1)) / 2**20, int(peak.group(1)) / 2**20


def model_info(sets):
    args = [CRUCIBLE, "model", "info"]
    for item in sets:
        args += ["--set", item]
    out = run(args)
    return (int(re.search(r"total_params=(\d+)", out).group(1)),
            float(re.search(r"active_params=([0-9.]+)", out).group(1)))


def dense(opts, blend, tokenizer, work):
    moe = ["model.name=deepseek_v3", f"model.flavor={opts.flavor}", "model.vocab_size=8192"]
    total, active = model_info(moe)
    info = run([CRUCIBLE, "model", "info", *sum((["--set", s] for s in moe), [])])
    dim = re.search(r"model.embed_tokens.weight\s+\[(\d+), (\d+)\]", info)
    vocab, C = int(dim.group(1)), int(dim.group(2))
    layers = len(set(re.findall(r"model.layers.(\d+).input_layernorm", info)))
    heads = {"debug": 4, "small": 8, "base": 12}[opts.flavor]
    # A Llama of the same dim, layers, heads (no GQA) and vocabulary, untied, whose FFN width
    # gives the MoE's active parameter count: per layer 4 C^2 (attention) + 3 C F + 2 C.
    fixed = 2 * vocab * C + C + layers * (4 * C * C + 2 * C)
    width = max(8, round((active - fixed) / (3 * C * layers) / 8) * 8)
    llama = ["model.name=llama", f"model.dim={C}", f"model.n_layers={layers}", f"model.n_heads={heads}",
             f"model.n_kv_heads={heads}", f"model.vocab_size={vocab}", f"model.ffn_hidden_dim={width}",
             "model.tie_embeddings=false"]
    dense_total, _ = model_info(llama)
    print(f"MoE {opts.flavor}: {total / 1e6:.1f}M total, {active / 1e6:.1f}M active; dense Llama "
          f"(ffn_hidden_dim={width}): {dense_total / 1e6:.1f}M; steps={opts.steps} seq_len={opts.seq_len} "
          f"batch={opts.batch} lr={opts.lr}")
    rows = {}
    for name, sets in (("dense", llama), ("moe", moe)):
        stdout, records = train(opts, blend, tokenizer, work / f"moe-dense-{name}",
                                sets + [f"optimizer.lr={opts.lr}"])
        speed = statistics.median(r["tok_per_s"] for r in records[2:])
        state, peak = memory(stdout)
        rows[name] = (speed, records[-1]["loss"], state, peak)
    print(f"{'model':>6} {'tok/s':>9} {'final loss':>11} {'model state MiB':>16} {'peak RSS MiB':>13}")
    for name, (speed, loss, state, peak) in rows.items():
        print(f"{name:>6} {speed:>9.1f} {loss:>11.4f} {state:>16.1f} {peak:>13.1f}")
    print(f"moe/dense tokens/s: {rows['moe'][0] / rows['dense'][0]:.3f} (target >= 0.7)")


def expert_parallel(opts, blend, tokenizer, work):
    moe = ["model.name=deepseek_v3", f"model.flavor={opts.flavor}", f"optimizer.lr={opts.lr}",
           f"training.global_batch_size={2 * opts.batch}"]
    total, active = model_info(moe[:2] + ["model.vocab_size=8192"])
    print(f"MoE {opts.flavor}: {total / 1e6:.1f}M total, {active / 1e6:.1f}M active; 2 ranks x 1 thread; "
          f"steps={opts.steps} seq_len={opts.seq_len} batch={opts.batch} a rank")
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    rows = {}
    for ep in (1, 2):
        run_dir = work / f"moe-ep{ep}"
        subprocess.run(["rm", "-rf", str(run_dir)])
        args = ["mpirun", "-np", "2", "--bind-to", "core"]
        for key in ("OMP_NUM_THREADS", "OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"):
            args += ["-x", key]
        args += [CRUCIBLE, "train", "--config", ROOT / "configs" / "small.toml",
                 "--set", f"model.tokenizer_path={tokenizer}", "--set", "model.vocab_size=8192",
                 "--set", "training.dataset=blend", "--set", f"training.dataset_path={blend}",
                 "--set", f"job.dump_folder={run_dir}", "--set", f"training.steps={opts.steps}",
                 "--set", f"training.seq_len={opts.seq_len}", "--set", f"training.local_batch_size={opts.batch}",
                 "--set", "checkpoint.enable=false", "--set", "validation.enable=false",
                 "--set", f"lr_scheduler.warmup_steps={max(1, opts.steps // 10)}",
                 "--set", f"parallelism.expert_parallel_degree={ep}"]
        for item in moe:
            args += ["--set", item]
        proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env)
        (work / f"moe-ep{ep}.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            sys.exit(f"moe: the EP={ep} run exited {proc.returncode}\n{proc.stderr[-2000:]}")
        records = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
        speed = statistics.median(r["tok_per_s"] for r in records[2:])
        share = statistics.median(r["expert_exchange_s"] / r["step_seconds"] for r in records[2:]) \
            if ep > 1 else 0.0
        digest = re.search(r"weights_xxh3=([0-9a-f]+)", proc.stdout).group(1)
        state, peak = memory(proc.stdout)
        rows[ep] = (speed, share, records[-1]["loss"], digest, peak)
    print(f"{'EP':>3} {'tok/s':>9} {'all-to-all share':>17} {'final loss':>11} {'peak RSS MiB':>13} weights_xxh3")
    for ep, (speed, share, loss, digest, peak) in rows.items():
        print(f"{ep:>3} {speed:>9.1f} {share:>17.3f} {loss:>11.6f} {peak:>13.1f} {digest}")
    print(f"EP=2/EP=1 tokens/s: {rows[2][0] / rows[1][0]:.3f}; same weights: {rows[1][3] == rows[2][3]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=["balance", "dense", "ep"])
    parser.add_argument("--flavor", default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--lr", default="3e-3")
    parser.add_argument("--speeds", default="0.001,0")
    parser.add_argument("--work", default=str(Path.home() / ".cache" / "crucible" / "bench-optimizers"))
    opts = parser.parse_args()
    opts.flavor = opts.flavor or ("debug" if opts.mode == "balance" else "small")
    opts.steps = opts.steps or {"balance": 300, "dense": 30, "ep": 20}[opts.mode]
    opts.batch = opts.batch or (4 if opts.mode == "ep" else 8)
    work = Path(opts.work)
    work.mkdir(parents=True, exist_ok=True)
    blend, _, tokenizer = prepare_data(work)
    {"balance": balance, "dense": dense, "ep": expert_parallel}[opts.mode](opts, blend, tokenizer, work)


if __name__ == "__main__":
    main()
