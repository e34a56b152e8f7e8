"""An independent PyTorch implementation of Crucible's Llama architecture, for reference tests.

Written from the Llama / Hugging Face definitions (RMSNorm, rotate-half RoPE, grouped-query
attention, SwiGLU), not from Crucible's kernels. Parameters use the Hugging Face names, so the
same safetensors file initialises both.

The tests run it in a subprocess under each package set (tests/integration/conftest.py, STACKS):
`python -c 'import llama_reference, sys; llama_reference.main(sys.argv[1:])' grads|train ...`.
"""
import json
import math
import sys

import numpy as np
import torch

from safetensors_io import read_safetensors


def round_bf16(x):
    """x rounded to bfloat16 as Crucible rounds its float32 values (through float32, ties to even)."""
    return x.float().bfloat16().to(x.dtype)


class Bf16Matmul(torch.autograd.Function):
    """a @ b with both operands of the product and of each backward product rounded to bf16
    (compute/backend.h "Precision"): forward r(a) r(b); backward da = r(g) r(b)^T, db = r(a)^T r(g)."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return round_bf16(a) @ round_bf16(b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        g = round_bf16(g)
        da = g @ round_bf16(b).transpose(-1, -2)
        if b.dim() == 2:  # a weight shared by every row of a batched a
            return da, round_bf16(a).reshape(-1, a.shape[-1]).T @ g.reshape(-1, g.shape[-1])
        return da, round_bf16(a).transpose(-1, -2) @ g


class Bf16FlashAttention(torch.autograd.Function):
    """Causal attention of q, k, v (B, H, T, D; k and v already repeated per query head) with the
    roundings of Crucible's bf16 attention (compute/backend.h "Precision"), which depend on the
    kernel's 64-key tiles: the forward rounds each tile's unnormalised probabilities
    exp(s - m), m the running maximum over the key tiles seen so far, after their sum is taken
    unrounded; the backward recomputes P = exp(s - lse), forms dS = P (dP - delta) / sqrt(D)
    with delta = rowsum(dO * O) unrounded, and rounds P and dS (and q, k, v, dO) as the operands
    of the products. The rest in the tensors' precision (float64)."""

    TILE = 64

    @staticmethod
    def forward(ctx, q, k, v):
        B, H, T, D = q.shape
        scale = 1.0 / math.sqrt(D)
        rq, rk, rv = round_bf16(q), round_bf16(k), round_bf16(v)
        s = (rq @ rk.transpose(-1, -2)) * scale
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        s = s.masked_fill(~causal, float("-inf"))
        rows = torch.arange(T)
        m = torch.full((B, H, T), float("-inf"), dtype=q.dtype)
        total = torch.zeros((B, H, T), dtype=q.dtype)
        acc = torch.zeros_like(q)
        for c0 in range(0, T, Bf16FlashAttention.TILE):
            c1 = min(T, c0 + Bf16FlashAttention.TILE)
            active = (rows >= c0)[None, None, :]  # rows that visit this key tile
            tile = s[..., c0:c1]
            new_m = torch.where(active, torch.maximum(m, tile.max(-1).values), m)
            p = torch.exp(tile - new_m[..., None]).masked_fill(~active[..., None], 0.0)
            alpha = torch.where(active & (c0 > 0), torch.exp(m - new_m), torch.ones_like(m))
            total = total * alpha + p.sum(-1)
            acc = acc * alpha[..., None] + round_bf16(p) @ rv[..., c0:c1, :]
            m = new_m
        out = acc / total[..., None]
        lse = m + torch.log(total)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        T, D = q.shape[-2], q.shape[-1]
        scale = 1.0 / math.sqrt(D)
        rq, rk, rv, rdo = round_bf16(q), round_bf16(k), round_bf16(v), round_bf16(dout)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        s = (rq @ rk.transpose(-1, -2)) * scale
        p = torch.exp(s - lse[..., None]).masked_fill(~causal, 0.0)
        delta = (dout * out).sum(-1, keepdim=True)
        ds = p * ((rdo @ rv.transpose(-1, -2)) - delta) * scale
        rp, rds = round_bf16(p), round_bf16(ds)
        return rds @ rk, rds.transpose(-1, -2) @ rq, rp.transpose(-1, -2) @ rdo


class LlamaReference(torch.nn.Module):
    def __init__(self, weights, n_heads, n_kv_heads, rope_theta=10000.0, eps=1e-5, dtype=torch.float64,
                 bf16=False):
        super().__init__()
        self.bf16 = bf16
        self.mm = Bf16Matmul.apply if bf16 else torch.matmul
        self.params = torch.nn.ParameterDict()
        self.names = list(weights.keys())
        for name, array in weights.items():
            self.params[name.replace(".", "__")] = torch.nn.Parameter(torch.tensor(np.array(array), dtype=dtype))
        self.n_heads, self.n_kv_heads, self.theta, self.eps = n_heads, n_kv_heads, rope_theta, eps
        self.n_layers = sum(1 for n in weights if n.endswith("input_layernorm.weight"))
        self.tied = "lm_head.weight" not in weights

    def p(self, name):
        return self.params[name.replace(".", "__")]

    def named(self):
        return {name: self.p(name) for name in self.names}

    def rmsnorm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def rope(self, x, T):  # x (B, T, heads, D)
        D = x.shape[-1]
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
        angles = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
        emb = torch.cat([angles, angles], dim=-1)
        cos, sin = emb.cos().to(x.dtype)[None, :, None, :], emb.sin().to(x.dtype)[None, :, None, :]
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        rotated = torch.cat([-x2, x1], dim=-1)
        return x * cos + rotated * sin

    def forward(self, tokens):
        B, T = tokens.shape
        x = self.p("model.embed_tokens.weight")[tokens]
        H, KV = self.n_heads, self.n_kv_heads
        for l in range(self.n_layers):
            pre = f"model.layers.{l}."
            h = self.rmsnorm(x, self.p(pre + "input_layernorm.weight"))
            q = self.mm(h, self.p(pre + "self_attn.q_proj.weight").T).view(B, T, H, -1)
            k = self.mm(h, self.p(pre + "self_attn.k_proj.weight").T).view(B, T, KV, -1)
            v = self.mm(h, self.p(pre + "self_attn.v_proj.weight").T).view(B, T, KV, -1)
            D = q.shape[-1]
            q, k = self.rope(q, T), self.rope(k, T)
            k = k.repeat_interleave(H // KV, dim=2)
            v = v.repeat_interleave(H // KV, dim=2)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
            if self.bf16:
                att = Bf16FlashAttention.apply(q, k, v)
            else:
                scores = (q @ k.transpose(-1, -2)) / math.sqrt(D)
                mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
                scores = scores.masked_fill(mask, float("-inf"))
                att = torch.softmax(scores, dim=-1) @ v
            att = att.transpose(1, 2).reshape(B, T, H * D)
            x = x + self.mm(att, self.p(pre + "self_attn.o_proj.weight").T)
            h = self.rmsnorm(x, self.p(pre + "post_attention_layernorm.weight"))
            gate = self.mm(h, self.p(pre + "mlp.gate_proj.weight").T)
            up = self.mm(h, self.p(pre + "mlp.up_proj.weight").T)
            x = x + self.mm(torch.nn.functional.silu(gate) * up, self.p(pre + "mlp.down_proj.weight").T)
        x = self.rmsnorm(x, self.p("model.norm.weight"))
        head = self.p("model.embed_tokens.weight") if self.tied else self.p("lm_head.weight")
        return self.mm(x, head.T)

    def loss(self, tokens, targets):
        logits = self.forward(tokens)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                                 ignore_index=-1, reduction="mean"), logits


def gradients(weights_path, batch_path, out_path, n_heads, n_kv_heads, precision="float32"):
    """Loss, logits and every parameter's gradient (float64) of the batch's tokens/targets, into
    the .npz out_path as loss, logits and grad.<name>. precision "bfloat16": every product's
    operands rounded to bf16 (Bf16Matmul), the rest float64."""
    weights, _ = read_safetensors(weights_path)
    batch, _ = read_safetensors(batch_path)
    ref = LlamaReference(weights, n_heads=n_heads, n_kv_heads=n_kv_heads, bf16=precision == "bfloat16")
    loss, logits = ref.loss(torch.tensor(batch["tokens"], dtype=torch.long),
                            torch.tensor(batch["targets"], dtype=torch.long))
    loss.backward()
    out = {"loss": np.array(loss.item()), "logits": logits.detach().numpy()}
    out.update({"grad." + name: p.grad.numpy() for name, p in ref.named().items()})
    np.savez(out_path, **out)


def each_parameter(optimizer):
    """(group, parameter) of every parameter of a torch optimizer, in group order."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            yield group, p


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2), as
    published; PyTorch has none: c = b1 m + (1 - b1) g; w = w (1 - lr wd) - lr sign(c);
    m = b2 m + (1 - b2) g."""

    def __init__(self, params, lr, betas, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group, p in each_parameter(self):
            beta1, beta2 = group["betas"]
            m = self.state[p].setdefault("exp_avg", torch.zeros_like(p))
            c = beta1 * m + (1 - beta1) * p.grad
            p.mul_(1 - group["lr"] * group["weight_decay"]).add_(torch.sign(c), alpha=-group["lr"])
            m.mul_(beta2).add_(p.grad, alpha=1 - beta2)


def newton_schulz(g, steps=5):
    """Keller Jordan's quintic Newton-Schulz iteration ("Muon: An optimizer for hidden layers",
    2024), in the reference's precision: X = G / (|G|_F + 1e-7), worked on the wide orientation,
    X <- a X + (b A + c A A) X with A = X X^T, (a, b, c) = (3.4445, -4.7750, 2.0315)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g / (g.norm() + 1e-7)
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


class Muon(torch.optim.Optimizer):
    """Muon on 2-D matrices, with Moonlight's scale (Liu et al. 2025, "Muon is Scalable for LLM
    Training": 0.2 sqrt(max(m, n)), the update RMS of AdamW): M = b M + (1 - b) G; Nesterov
    U = (1 - b) G + b M; W = W (1 - lr wd) - lr 0.2 sqrt(max(m, n)) NS5(U)."""

    def __init__(self, params, lr, momentum, weight_decay):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            beta = group["momentum"]
            for p in group["params"]:
                m = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                m.mul_(beta).add_(p.grad, alpha=1 - beta)
                update = newton_schulz((1 - beta) * p.grad + beta * m)
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(update, alpha=-group["lr"] * 0.2 * max(p.shape) ** 0.5)


class Mano(torch.optim.Optimizer):
    """Mano (Gu & Xie 2026, "Mano: Restriking Manifold Optimization for LLM Training", arXiv
    2601.23000) on 2-D matrices, written from the paper's Algorithm 1 (form="paper"), or from the
    official repository's mano_v2.py (form="v2", xie-lab-ml/Mano-Restriking-Manifold-Optimization-
    for-LLM-Training at 8f4e0f1: no line 6, W itself in the projection, norm + eps). At the
    matrix's t-th update (t from 0), with |.|_k and <.,.>_k the norms and dots of each column
    (k = 0, torch dim 0) or row (k = 1); the eps clamps are the official mano.py's (at b78b952)."""

    def __init__(self, params, lr, momentum, weight_decay, nesterov=False, form="paper", eps=1e-8):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, eps=eps,
                                      nesterov=nesterov, form=form))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            mu, eps, lr = group["momentum"], group["eps"], group["lr"]
            for p in group["params"]:
                state = self.state[p]
                M = state.setdefault("momentum_buffer", torch.zeros_like(p))
                t = state.setdefault("steps", 0)
                M.mul_(mu).add_(p.grad)  # Alg. 1 line 4: M_t = mu M_{t-1} + g_t
                V = p.grad + mu * M if group["nesterov"] else M  # mano.py's nesterov option
                k = t % 2  # line 5: the rotating manifold
                if group["form"] == "paper":  # line 6: theta^ = theta / |theta|_{2,k}
                    unit = p / p.norm(dim=k, keepdim=True).clamp(min=eps)
                else:
                    unit = p
                v = V - unit * (V * unit).sum(dim=k, keepdim=True)  # line 7: tangent momentum
                norm = v.norm(dim=k, keepdim=True)
                v_hat = v / (norm + eps if group["form"] == "v2" else norm.clamp(min=eps))  # line 8
                # line 9: theta = theta - lr (0.2 sqrt(n_k) v^ + wd theta), n_0 = m, n_1 = n
                p.sub_(lr * (0.2 * p.size(k) ** 0.5 * v_hat + group["weight_decay"] * p))
                state["steps"] = t + 1


def torch_muon(params, lr, momentum, weight_decay, nesterov, scale, ns_precision):
    """torch.optim.Muon (in PyTorch 2.15, the current set) with Crucible's options: scale "moonlight" is its
    adjust_lr_fn="match_rms_adamw", "keller" its "original"; ns_precision "fp32" runs torch's own
    Newton-Schulz function in the parameters' float64 (torch casts its input to bf16, by
    .to(dtype=torch.bfloat16) in 2.15, .bfloat16() before: the input is handed over as a tensor
    whose casts to bf16 keep its precision, and the result is checked to be float64), "bf16"
    leaves torch's own bf16 iteration."""
    import torch.optim._muon as muon_module
    if ns_precision == "fp32" and not getattr(muon_module, "_crucible_keeps_precision", False):
        original = muon_module._zeropower_via_newtonschulz

        class KeepsPrecision(torch.Tensor):
            def bfloat16(self, *args, **kwargs):
                return self.as_subclass(torch.Tensor).clone()

            def to(self, *args, **kwargs):
                plain = self.as_subclass(torch.Tensor)
                if kwargs.get("dtype") is torch.bfloat16 or torch.bfloat16 in args:
                    return plain.clone()
                return plain.to(*args, **kwargs)

        def in_input_precision(grad, *args, **kwargs):
            out = original(grad.as_subclass(KeepsPrecision), *args, **kwargs).as_subclass(torch.Tensor)
            assert out.dtype == grad.dtype, f"torch's Newton-Schulz ran in {out.dtype}: its cast changed"
            return out

        muon_module._zeropower_via_newtonschulz = in_input_precision
        muon_module._crucible_keeps_precision = True
    return torch.optim.Muon(params, lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov,
                            adjust_lr_fn={"moonlight": "match_rms_adamw", "keller": "original"}[scale])


class Combined:
    """A matrices-only optimizer beside AdamW for the other groups, stepped together."""

    def __init__(self, *optimizers):
        self.optimizers = optimizers
        self.param_groups = [g for o in optimizers for g in o.param_groups]

    def zero_grad(self):
        for o in self.optimizers:
            o.zero_grad()

    def step(self):
        for o in self.optimizers:
            o.step()


class SophiaG(torch.optim.Optimizer):
    """SophiaG (Liu et al. 2023, "Sophia: A Scalable Stochastic Second-order Optimizer for Language
    Model Pre-training", arXiv 2305.14342), written from the paper's Algorithm 3 (Sophia) with its
    Algorithm 2 (the Gauss-Newton-Bartlett estimator), in the paper's form, not the official
    code's: the estimate is B g^ (.) g^ and the clip divides by max(gamma h, eps); PyTorch has
    none. (The official code keeps h / B and writes rho B h + eps in the denominator.) The
    schedule of the estimate is the caller's (train_losses: the official script's, after the
    update of every step % k == 0, where Algorithm 3 estimates before the update of t mod k = 1)."""

    def __init__(self, params, lr, betas, rho, batch_tokens, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, rho=rho, weight_decay=weight_decay))
        self.batch_tokens = batch_tokens

    @torch.no_grad()
    def step(self):
        for group, p in each_parameter(self):
            beta1, lr, gamma, eps = group["betas"][0], group["lr"], group["rho"], 1e-15
            m = self.state[p].setdefault("exp_avg", torch.zeros_like(p))
            h = self.state[p].setdefault("hessian", torch.zeros_like(p))  # Alg. 3: h_{1-k} = 0
            m.mul_(beta1).add_(p.grad, alpha=1 - beta1)  # Alg. 3: m_t = beta1 m_{t-1} + (1 - beta1) g_t
            p.mul_(1 - lr * group["weight_decay"])  # Alg. 3: theta_t = theta_t - eta_t lambda theta_t
            # Alg. 3: theta_{t+1} = theta_t - eta_t clip(m_t / max(gamma h_t, eps), 1), clip(z, 1) = max(min(z, 1), -1)
            p.sub_(lr * torch.clamp(m / torch.clamp(gamma * h, min=eps), -1, 1))

    @torch.no_grad()
    def update_hessian(self):
        """p.grad: Alg. 2's g^, the gradient of the mean loss against labels y^ ~ softmax(logits)."""
        for group, p in each_parameter(self):
            beta2 = group["betas"][1]
            h = self.state[p].setdefault("hessian", torch.zeros_like(p))
            h_hat = self.batch_tokens * p.grad * p.grad  # Alg. 2: output B g^ (.) g^
            h.mul_(beta2).add_(h_hat, alpha=1 - beta2)  # Alg. 3: h_t = beta2 h_{t-k} + (1 - beta2) h^_t


def philox4x32(counter, key):
    """Philox-4x32-10 (Salmon et al. 2011) on Python ints, as src/common/philox.h."""
    mask = 0xFFFFFFFF
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & mask, p1 & mask, ((p0 >> 32) ^ c3 ^ k1) & mask, p0 & mask
        k0, k1 = (k0 + 0x9E3779B9) & mask, (k1 + 0xBB67AE85) & mask
    return c0, c1, c2, c3


def sampled_labels(logits, seed, step, first_sample):
    """Labels drawn from softmax(logits) (B, T, V), one 53-bit uniform per position from Philox
    keyed on (seed, step, global sample, position) as Crucible's SampleTargets draws them."""
    B, T, V = logits.shape
    stream = 0x50F1A6E55A000000 ^ step
    out = np.zeros((B, T), dtype=np.int64)
    for b in range(B):
        for t in range(T):
            offset = 2 * ((first_sample + b) * T + t)
            block = philox4x32((offset // 4 & 0xFFFFFFFF, offset // 4 >> 32, stream & 0xFFFFFFFF, stream >> 32),
                               (seed & 0xFFFFFFFF, seed >> 32))
            lane = offset % 4
            u = (((block[lane] << 32) | block[lane + 1]) >> 11) / 9007199254740992.0
            row = logits[b, t].astype(np.float64)
            cumulative = np.cumsum(np.exp(row - row.max()))
            out[b, t] = min(int(np.searchsorted(cumulative, u * cumulative[-1], side="right")), V - 1)
    return out


def make_optimizer(name, groups, lr, beta1, beta2, s=None):
    """torch's AdamW; SGD with momentum (decoupled decay applied by train_losses); Lion; SophiaG."""
    if name == "AdamW":
        return torch.optim.AdamW(groups, lr=lr, betas=(beta1, beta2), eps=1e-8)
    if name == "SGD":
        return torch.optim.SGD([dict(g, weight_decay=0.0, decoupled=g["weight_decay"]) for g in groups],
                               lr=lr, momentum=beta1, dampening=0.0)
    if name == "Lion" and (s or {}).get("reference") == "lion-pytorch":
        import lion_pytorch  # the current set only (scripts/requirements-current.txt)
        return lion_pytorch.Lion(groups, lr=lr, betas=(beta1, beta2))
    if name == "Lion":
        return Lion(groups, lr=lr, betas=(beta1, beta2))
    if name == "SophiaG":
        return SophiaG(groups, lr=lr, betas=(beta1, beta2), rho=s["sophia_rho"],
                       batch_tokens=s["global_batch"] * s["seq_len"])
    sys.exit(f"llama_reference: unknown optimizer {name!r} (AdamW, SGD, Lion, SophiaG, Muon, Mano, Mano_v2)")


def train_losses(weights_path, stream_path, settings_path, out_path):
    """The per-step losses of an optimizer training the reference on consecutive windows of the
    token stream (.npy), with warmup and clipping as Crucible's trainer does; settings (JSON):
    n_heads, n_kv_heads, seq_len, global_batch, steps, lr, warmup, weight_decay, max_norm, and
    optionally optimizer (AdamW, SGD, Lion, SophiaG, Muon, Mano, Mano_v2; default AdamW), beta1,
    beta2 (0.9, 0.95), decay_norms, decay_embeddings (false: norms and the embedding are not
    decayed); reference: "torch.optim.Muon" (Muon: torch's, with muon_scale, muon_nesterov,
    ns_precision) or "lion-pytorch" (Lion: that package's), else the references written here;
    mano_nesterov, mano_v2_nesterov; SophiaG:
    sophia_k, sophia_rho, seed (the Hessian pass after the update of every step % k == 0, on
    the step's batch, its gradient clipped as the step's)."""
    s = json.loads(open(settings_path).read())
    weights, _ = read_safetensors(weights_path)
    stream = np.load(stream_path)
    ref = LlamaReference(weights, n_heads=s["n_heads"], n_kv_heads=s["n_kv_heads"])
    named = ref.named()
    exempt = [n for n in named if (n.endswith("norm.weight") and not s.get("decay_norms", False))
              or (n == "model.embed_tokens.weight" and not s.get("decay_embeddings", False))]
    groups = [{"params": [p for n, p in named.items() if n not in exempt], "weight_decay": s["weight_decay"]},
              {"params": [named[n] for n in exempt], "weight_decay": 0.0}]
    name = s.get("optimizer", "AdamW")
    if name in ("Muon", "Mano", "Mano_v2"):  # the hidden matrices; AdamW (betas 0.9, 0.95) for the rest
        hidden = [p for n, p in named.items() if n.startswith("model.layers.") and not n.endswith("norm.weight")]
        rest = [dict(g, params=[p for p in g["params"] if all(p is not h for h in hidden)]) for g in groups]
        common = dict(lr=s["lr"], momentum=s.get("beta1", 0.9), weight_decay=s["weight_decay"])
        if name == "Muon" and s.get("reference") == "torch.optim.Muon":
            matrices = torch_muon(hidden, nesterov=s.get("muon_nesterov", True), scale=s.get("muon_scale", "moonlight"),
                                  ns_precision=s.get("ns_precision", "fp32"), **common)
        elif name == "Muon":
            matrices = Muon(hidden, **common)
        elif name == "Mano":
            matrices = Mano(hidden, nesterov=s.get("mano_nesterov", False), form="paper", **common)
        else:
            matrices = Mano(hidden, nesterov=s.get("mano_v2_nesterov", True), form="v2", **common)
        opt = Combined(matrices, make_optimizer("AdamW", rest, s["lr"], 0.9, 0.95))
    else:
        opt = make_optimizer(name, groups, s["lr"], s.get("beta1", 0.9), s.get("beta2", 0.95), s)
    seq_len, batch = s["seq_len"], s["global_batch"]
    windows = (len(stream) - 1) // seq_len
    losses = []
    for step in range(1, s["steps"] + 1):
        for group in opt.param_groups:
            group["lr"] = s["lr"] * min(1.0, step / s["warmup"])
        opt.zero_grad()
        indices = [((step - 1) * batch + i) % windows for i in range(batch)]
        samples = np.stack([stream[i * seq_len:i * seq_len + seq_len + 1] for i in indices]).astype(np.int64)
        loss, _ = ref.loss(torch.tensor(samples[:, :-1]), torch.tensor(samples[:, 1:]))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(named.values()), s["max_norm"])
        with torch.no_grad():  # SGD's decoupled decay: w (1 - lr wd) before the momentum step
            for group in opt.param_groups:
                for p in group["params"]:
                    p.mul_(1 - group["lr"] * group.get("decoupled", 0.0))
        opt.step()
        losses.append(loss.item())
        if isinstance(opt, SophiaG) and step % s["sophia_k"] == 0:
            opt.zero_grad()
            logits = ref.forward(torch.tensor(samples[:, :-1]))
            labels = sampled_labels(logits.detach().numpy(), s["seed"], step, (step - 1) * batch)
            torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                              torch.tensor(labels).reshape(-1)).backward()
            torch.nn.utils.clip_grad_norm_(list(named.values()), s["max_norm"])
            opt.update_hessian()
    with open(out_path, "w") as f:
        json.dump(losses, f)


def main(argv):
    command, *args = argv
    if command == "grads":
        gradients(args[0], args[1], args[2], int(args[3]), int(args[4]), *args[5:])
    elif command == "train":
        train_losses(*args)
    else:
        sys.exit(f"llama_reference: unknown command {command!r} (grads, train)")
    print(f"torch {torch.__version__} numpy {np.__version__}")
