"""An independent PyTorch implementation of the DeepSeek-V3 architecture, for reference tests.

Written from the DeepSeek-V2/V3 papers' equations (multi-head latent attention with low-rank
query and key/value compression, RMSNorms on the latents, decoupled RoPE on a shared key, softmax
scale 1/sqrt(qk_nope_head_dim + qk_rope_head_dim); a mixture of experts with sigmoid affinities,
node-limited (grouped) top-k routing on the affinities plus the balance bias, weights normalised
over the chosen experts and scaled by the routed scaling factor, shared experts), not from
Crucible's kernels. RoPE is rotate-half on the stored layout, as Crucible stores it. Float64.
With `aux_loss_alpha` > 0 in the config, DeepSeek-V3's sequence-wise balance loss (the paper's
L_Bal = alpha sum_i f_i P_i per sequence, f_i = E/(K T) * the sequence's tokens that chose i,
P_i = the sequence's mean of s_i / sum_j s_j) is added to the objective, each sequence's counting
as its T tokens do: objective = (sum of cross-entropies + T sum_seq L_Bal) / valid targets; the
reported loss stays the cross-entropy's mean, `aux_loss` is the rest.

`python -c 'import deepseek_reference, sys; deepseek_reference.main(sys.argv[1:])' grads
WEIGHTS BATCH OUT.npz CONFIG_JSON`: loss (mean over the valid targets), logits, every gradient,
and the chosen experts of each MoE layer (experts.<layer>, (B*T, K) in slot order).
"""
import json
import math
import sys

import numpy as np
import torch

from safetensors_io import read_safetensors


class DeepSeekV3Reference(torch.nn.Module):
    def __init__(self, weights, config, dtype=torch.float64):
        super().__init__()
        self.c = config
        self.params = torch.nn.ParameterDict()
        self.names = list(weights.keys())
        for name, array in weights.items():
            self.params[name.replace(".", "__")] = torch.nn.Parameter(torch.tensor(np.array(array), dtype=dtype))
        self.tied = "lm_head.weight" not in weights
        self.chosen = {}

    def p(self, name):
        return self.params[name.replace(".", "__")]

    def named(self):
        return {name: self.p(name) for name in self.names}

    def rmsnorm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.c["norm_eps"]) * w

    def rope(self, x):  # x (B, T, heads, D), rotate-half pairs (i, i + D/2)
        T, D = x.shape[1], x.shape[-1]
        inv_freq = 1.0 / (self.c["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
        angles = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
        emb = torch.cat([angles, angles], dim=-1)
        cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    def linear(self, x, name):
        return x @ self.p(name).T

    def mla(self, h, pre):
        c = self.c
        B, T, _ = h.shape
        H, Dn, Dr, Dv, Rkv = c["n_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
        if c["q_lora_rank"] > 0:
            q = self.linear(self.rmsnorm(self.linear(h, pre + "q_a_proj.weight"), self.p(pre + "q_a_layernorm.weight")),
                            pre + "q_b_proj.weight")
        else:
            q = self.linear(h, pre + "q_proj.weight")
        q = q.view(B, T, H, Dn + Dr)
        q_nope, q_pe = q[..., :Dn], self.rope(q[..., Dn:])
        kv_a = self.linear(h, pre + "kv_a_proj_with_mqa.weight")
        latent, k_pe = kv_a[..., :Rkv], kv_a[..., Rkv:]
        k_pe = self.rope(k_pe.view(B, T, 1, Dr))
        kv = self.linear(self.rmsnorm(latent, self.p(pre + "kv_a_layernorm.weight")), pre + "kv_b_proj.weight")
        kv = kv.view(B, T, H, Dn + Dv)
        k_nope, v = kv[..., :Dn], kv[..., Dn:]
        query = torch.cat([q_nope, q_pe], dim=-1).transpose(1, 2)  # (B, H, T, Dq)
        key = torch.cat([k_nope, k_pe.expand(B, T, H, Dr)], dim=-1).transpose(1, 2)
        scores = (query @ key.transpose(-1, -2)) / math.sqrt(Dn + Dr)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        att = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v.transpose(1, 2)
        return self.linear(att.transpose(1, 2).reshape(B, T, H * Dv), pre + "o_proj.weight")

    def mlp(self, h, pre):
        gate, up = self.linear(h, pre + "gate_proj.weight"), self.linear(h, pre + "up_proj.weight")
        return self.linear(torch.nn.functional.silu(gate) * up, pre + "down_proj.weight")

    def route(self, x, pre, layer):
        """The chosen experts (N, K) and their weights (N, K), differentiable in the weights."""
        c = self.c
        E, K, G, TG = c["n_routed_experts"], c["num_experts_per_tok"], c["n_group"], c["topk_group"]
        s = torch.sigmoid(self.linear(x, pre + "gate.weight"))  # (N, E)
        self.affinity = s
        bias_name = pre + "gate.e_score_correction_bias"
        bias = self.p(bias_name).detach() if bias_name.replace(".", "__") in self.params else torch.zeros(E, dtype=s.dtype)
        choice = (s + bias).detach()
        N = choice.shape[0]
        grouped = choice.view(N, G, E // G)
        top = grouped.topk(min(2, E // G), dim=-1).values.sum(-1)  # (N, G)
        # Ties to the lower index: a stable sort on the negated scores.
        groups = torch.argsort(-top, dim=-1, stable=True)[:, :TG]
        eligible = torch.zeros(N, G, dtype=torch.bool)
        eligible.scatter_(1, groups, True)
        eligible = eligible.repeat_interleave(E // G, dim=1)
        masked = choice.masked_fill(~eligible, float("-inf"))
        experts = torch.argsort(-masked, dim=-1, stable=True)[:, :K]
        self.chosen[layer] = experts.numpy().astype(np.int32)
        w = s.gather(1, experts)
        if c["norm_topk_prob"]:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return experts, w * c["routed_scaling_factor"]

    def moe(self, h, pre, layer):
        c = self.c
        B, T, C = h.shape
        x = h.reshape(B * T, C)
        experts, w = self.route(x, pre + "mlp.", layer)
        alpha = c.get("aux_loss_alpha", 0.0)
        if alpha > 0:
            E, K = c["n_routed_experts"], c["num_experts_per_tok"]
            s = self.affinity.reshape(B, T, E)
            P = (s / s.sum(-1, keepdim=True)).mean(1)  # (B, E)
            counts = torch.zeros(B, E, dtype=s.dtype)
            counts.scatter_add_(1, experts.reshape(B, T * K), torch.ones(B, T * K, dtype=s.dtype))
            f = counts * E / (K * T)
            self.aux = self.aux + alpha * T * (f * P).sum()
        out = torch.zeros_like(x)
        for e in range(c["n_routed_experts"]):
            token, slot = (experts == e).nonzero(as_tuple=True)
            if token.numel() == 0:
                continue
            y = self.mlp(x[token], pre + f"mlp.experts.{e}.")
            out = out.index_add(0, token, y * w[token, slot][:, None])
        if c["n_shared_experts"] > 0:
            out = out + self.mlp(x, pre + "mlp.shared_experts.")
        return out.view(B, T, C)

    def forward(self, tokens):
        c = self.c
        self.aux = torch.zeros((), dtype=torch.float64)
        x = self.p("model.embed_tokens.weight")[tokens]
        for l in range(c["n_layers"]):
            pre = f"model.layers.{l}."
            x = x + self.mla(self.rmsnorm(x, self.p(pre + "input_layernorm.weight")), pre + "self_attn.")
            h = self.rmsnorm(x, self.p(pre + "post_attention_layernorm.weight"))
            x = x + (self.moe(h, pre, l) if l >= c["first_k_dense_replace"] else self.mlp(h, pre + "mlp."))
        x = self.rmsnorm(x, self.p("model.norm.weight"))
        head = self.p("model.embed_tokens.weight") if self.tied else self.p("lm_head.weight")
        return x @ head.T

    def loss(self, tokens, targets):
        logits = self.forward(tokens)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                                 ignore_index=-1, reduction="mean"), logits


def gradients(weights_path, batch_path, out_path, config_json):
    weights, _ = read_safetensors(weights_path)
    batch, _ = read_safetensors(batch_path)
    ref = DeepSeekV3Reference(weights, json.loads(config_json))
    targets = torch.tensor(batch["targets"], dtype=torch.long)
    loss, logits = ref.loss(torch.tensor(batch["tokens"], dtype=torch.long), targets)
    aux = ref.aux / (targets >= 0).sum()
    (loss + aux).backward()
    out = {"loss": np.array(loss.item()), "aux_loss": np.array(aux.item()), "logits": logits.detach().numpy()}
    out.update({"grad." + name: p.grad.numpy() for name, p in ref.named().items() if p.grad is not None})
    out.update({f"experts.{layer}": chosen for layer, chosen in ref.chosen.items()})
    np.savez(out_path, **out)


def main(argv):
    command, *args = argv
    if command == "grads":
        gradients(*args)
    else:
        sys.exit(f"deepseek_reference: unknown command {command!r} (grads)")
    print(f"torch {torch.__version__} numpy {np.__version__}")
