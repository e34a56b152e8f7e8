#!/usr/bin/env python3
"""Training throughput: Crucible vs PyTorch eager on the CPU, same model, data shape, optimizer
and thread count, in one run. Prints tokens/s of each and the ratio, plus Crucible's MFU.

    .venv/bin/python bench/train_vs_torch.py [--flavor small] [--seq-len 512] [--batch 8] [--steps 6]

PyTorch runs a straightforward eager Llama (nn.Linear, F.silu, matmul attention with a causal
mask, F.cross_entropy, torch.optim.AdamW) in float32 with torch.set_num_threads(threads).
The first step of each is a warm-up and is not timed.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

FLAVORS = {  # must match src/model/llama_config.cc
    "debug": dict(vocab=2048, dim=128, layers=2, heads=4, kv=2, ffn=352, tie=False),
    "tiny": dict(vocab=8192, dim=256, layers=4, heads=8, kv=4, ffn=688, tie=True),
    "small": dict(vocab=8192, dim=512, layers=6, heads=8, kv=4, ffn=1376, tie=False),
    "base": dict(vocab=32000, dim=768, layers=12, heads=12, kv=4, ffn=2048, tie=False),
}


class Block(torch.nn.Module):
    def __init__(self, f):
        super().__init__()
        d, hd = f["dim"], f["dim"] // f["heads"]
        self.heads, self.kv, self.hd = f["heads"], f["kv"], hd
        self.ln1 = torch.nn.Parameter(torch.ones(d))
        self.ln2 = torch.nn.Parameter(torch.ones(d))
        self.q = torch.nn.Linear(d, f["heads"] * hd, bias=False)
        self.k = torch.nn.Linear(d, f["kv"] * hd, bias=False)
        self.v = torch.nn.Linear(d, f["kv"] * hd, bias=False)
        self.o = torch.nn.Linear(f["heads"] * hd, d, bias=False)
        self.gate = torch.nn.Linear(d, f["ffn"], bias=False)
        self.up = torch.nn.Linear(d, f["ffn"], bias=False)
        self.down = torch.nn.Linear(f["ffn"], d, bias=False)

    @staticmethod
    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        h = self.norm(x, self.ln1)
        q = self.q(h).view(B, T, self.heads, self.hd).transpose(1, 2)
        k = self.k(h).view(B, T, self.kv, self.hd).transpose(1, 2)
        v = self.v(h).view(B, T, self.kv, self.hd).transpose(1, 2)

        def rope(t):
            t1, t2 = t[..., : self.hd // 2], t[..., self.hd // 2:]
            return t * cos + torch.cat([-t2, t1], dim=-1) * sin

        q, k = rope(q), rope(k)
        k = k.repeat_interleave(self.heads // self.kv, dim=1)
        v = v.repeat_interleave(self.heads // self.kv, dim=1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd) + mask
        y = torch.softmax(att, dim=-1) @ v
        x = x + self.o(y.transpose(1, 2).reshape(B, T, -1))
        h = self.norm(x, self.ln2)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(torch.nn.Module):
    def __init__(self, f, seq_len):
        super().__init__()
        self.embed = torch.nn.Embedding(f["vocab"], f["dim"])
        self.blocks = torch.nn.ModuleList(Block(f) for _ in range(f["layers"]))
        self.norm = torch.nn.Parameter(torch.ones(f["dim"]))
        self.head = None if f["tie"] else torch.nn.Linear(f["dim"], f["vocab"], bias=False)
        hd = f["dim"] // f["heads"]
        inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))
        ang = torch.arange(seq_len).float()[:, None] * inv[None, :]
        emb = torch.cat([ang, ang], dim=-1)
        self.register_buffer("cos", emb.cos()[None, None])
        self.register_buffer("sin", emb.sin()[None, None])
        self.register_buffer("mask", torch.full((seq_len, seq_len), float("-inf")).triu(1))

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, self.cos, self.sin, self.mask)
        x = Block.norm(x, self.norm)
        logits = x @ self.embed.weight.T if self.head is None else self.head(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def torch_tokens_per_second(f, seq_len, batch, steps, threads):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = Llama(f, seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    times = []
    for step in range(steps):
        tokens = torch.randint(0, f["vocab"], (batch, seq_len + 1))
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - start)
        print(f"  torch step {step + 1}: loss={loss.item():.4f} {times[-1]:.2f}s", flush=True)
    timed = times[1:]
    return batch * seq_len * len(timed) / sum(timed)


def crucible_tokens_per_second(binary, flavor, seq_len, batch, steps, threads):
    with tempfile.TemporaryDirectory() as run_dir:
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        cmd = [binary, "train", "--set", f"model.flavor={flavor}", "--set", f"training.seq_len={seq_len}",
               "--set", f"training.local_batch_size={batch}", "--set", f"training.steps={steps}",
               "--set", f"job.dump_folder={run_dir}", "--set", "checkpoint.enable=false",
               "--set", "metrics.profile=true"]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        for line in proc.stdout.splitlines():
            if line.startswith(("step=", "phase=profile", "phase=start")):
                print("  crucible", line, flush=True)
        records = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
        timed = [r["step_seconds"] for r in records[1:]]
        return batch * seq_len * len(timed) / sum(timed), records[-1]["mfu"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flavor", default="small", choices=FLAVORS)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--crucible", default=os.environ.get("CRUCIBLE", "build/crucible"))
    args = parser.parse_args()
    f = FLAVORS[args.flavor]
    print(f"flavor={args.flavor} seq_len={args.seq_len} batch={args.batch} steps={args.steps} "
          f"threads={args.threads} torch={torch.__version__}", flush=True)
    ours, mfu = crucible_tokens_per_second(args.crucible, args.flavor, args.seq_len, args.batch, args.steps,
                                           args.threads)
    theirs = torch_tokens_per_second(f, args.seq_len, args.batch, args.steps, args.threads)
    # mfu is null when a step ran faster than the measured peak (the trainer warns then).
    print(f"crucible tok/s={ours:.1f} mfu=" + (f"{mfu:.1f}%" if mfu is not None else "n/a"))
    print(f"pytorch_eager tok/s={theirs:.1f}")
    print(f"ratio crucible/pytorch={ours / theirs:.2f}")


if __name__ == "__main__":
    sys.exit(main())
