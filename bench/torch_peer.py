#!/usr/bin/env python3
"""The PyTorch side of bench/train_vs_torch.py: one variant of the same Llama, trained in this
process alone, timed, and reported as one JSON line on stdout.

    python bench/torch_peer.py --flavor small --seq-len 512 --batch 8 --steps 8 --warmup 2 \
        --threads 2 --attention sdpa|naive --compile|--no-compile

The model is what a user writes today: nn.Linear projections, RMSNorm, rotate-half RoPE,
grouped-query attention either through F.scaled_dot_product_attention(is_causal=True) (keys and
values expanded with repeat_interleave for the query heads, as enable_gqa's fallback does) or
as the textbook masked softmax, SwiGLU, a tied or separate head and F.cross_entropy, trained with
torch.optim.AdamW (fused=False, foreach defaults) and clip_grad_norm_, in float32 on the CPU with
torch.set_num_threads(--threads). --compile wraps the model (not the optimizer) in
torch.compile (inductor; its cache directory is TORCHINDUCTOR_CACHE_DIR, which the orchestrator
keeps outside the clone). The first --warmup steps (compilation included) are not timed.

On a GPU (bench/gpu_train.py): --device cuda places the model and the batches there (fp32
master weights, torch.optim.AdamW fused) and --autocast bf16 runs the forward under
torch.autocast("cuda", torch.bfloat16), as a user trains in mixed precision today; steps are
timed after torch.cuda.synchronize(), and the report adds the peak of
torch.cuda.max_memory_allocated().
"""
import argparse
import contextlib
import json
import math
import resource
import sys
import time

import torch
import torch.nn.functional as F

from llama_flavors import FLAVORS  # bench/, this file's folder, is on sys.path


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w


class Block(torch.nn.Module):
    def __init__(self, f, attention):
        super().__init__()
        d, hd = f["dim"], f["dim"] // f["heads"]
        self.heads, self.kv, self.hd, self.attention = f["heads"], f["kv"], hd, attention
        self.ln1 = torch.nn.Parameter(torch.ones(d))
        self.ln2 = torch.nn.Parameter(torch.ones(d))
        self.q = torch.nn.Linear(d, f["heads"] * hd, bias=False)
        self.k = torch.nn.Linear(d, f["kv"] * hd, bias=False)
        self.v = torch.nn.Linear(d, f["kv"] * hd, bias=False)
        self.o = torch.nn.Linear(f["heads"] * hd, d, bias=False)
        self.gate = torch.nn.Linear(d, f["ffn"], bias=False)
        self.up = torch.nn.Linear(d, f["ffn"], bias=False)
        self.down = torch.nn.Linear(f["ffn"], d, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        h = rms_norm(x, self.ln1)
        q = self.q(h).view(B, T, self.heads, self.hd).transpose(1, 2)
        k = self.k(h).view(B, T, self.kv, self.hd).transpose(1, 2)
        v = self.v(h).view(B, T, self.kv, self.hd).transpose(1, 2)

        def rope(t):
            t1, t2 = t[..., : self.hd // 2], t[..., self.hd // 2:]
            return t * cos + torch.cat([-t2, t1], dim=-1) * sin

        q, k = rope(q), rope(k)
        k = k.repeat_interleave(self.heads // self.kv, dim=1)
        v = v.repeat_interleave(self.heads // self.kv, dim=1)
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd) + mask
            y = torch.softmax(att, dim=-1) @ v
        x = x + self.o(y.transpose(1, 2).reshape(B, T, -1))
        h = rms_norm(x, self.ln2)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(torch.nn.Module):
    def __init__(self, f, seq_len, attention):
        super().__init__()
        self.embed = torch.nn.Embedding(f["vocab"], f["dim"])
        self.blocks = torch.nn.ModuleList(Block(f, attention) for _ in range(f["layers"]))
        self.norm = torch.nn.Parameter(torch.ones(f["dim"]))
        self.head = None if f["tie"] else torch.nn.Linear(f["dim"], f["vocab"], bias=False)
        hd = f["dim"] // f["heads"]
        inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))
        ang = torch.arange(seq_len).float()[:, None] * inv[None, :]
        emb = torch.cat([ang, ang], dim=-1)
        self.register_buffer("cos", emb.cos()[None, None])
        self.register_buffer("sin", emb.sin()[None, None])
        mask = torch.full((seq_len, seq_len), float("-inf")).triu(1) if attention == "naive" else torch.zeros(1)
        self.register_buffer("mask", mask)

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, self.cos, self.sin, self.mask)
        x = rms_norm(x, self.norm)
        logits = x @ self.embed.weight.T if self.head is None else self.head(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flavor", default="small", choices=FLAVORS)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--attention", choices=["naive", "sdpa"], default="sdpa")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--autocast", choices=["none", "bf16"], default="none")
    args = parser.parse_args()
    f = FLAVORS[args.flavor]
    cuda = args.device == "cuda"
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Llama(f, args.seq_len, args.attention).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            **({"fused": True} if cuda else {}))
    step_fn = torch.compile(model) if args.compile else model
    generator = torch.Generator().manual_seed(1)
    autocast = (torch.autocast(args.device, dtype=torch.bfloat16) if args.autocast == "bf16"
                else contextlib.nullcontext())
    times, losses = [], []
    for step in range(args.warmup + args.steps):
        tokens = torch.randint(0, f["vocab"], (args.batch, args.seq_len + 1),
                               generator=generator).to(args.device)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = step_fn(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        losses.append(loss.item())
        print(f"torch_peer step={step + 1} loss={losses[-1]:.4f} seconds={seconds:.3f}"
              f"{' (warm-up)' if step < args.warmup else ''}", file=sys.stderr, flush=True)
        if step >= args.warmup:
            times.append(seconds)
    tokens_per_step = args.batch * args.seq_len
    print(json.dumps({
        "torch": torch.__version__,
        "step_seconds": times,
        "tokens_per_second": tokens_per_step * len(times) / sum(times),
        "final_loss": losses[-1],
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        **({"peak_gpu_bytes": torch.cuda.max_memory_allocated()} if cuda else {}),
    }))


if __name__ == "__main__":
    sys.exit(main())
