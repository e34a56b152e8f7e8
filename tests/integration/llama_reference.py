"""An independent PyTorch implementation of Crucible's Llama architecture, for reference tests.

Written from the Llama / Hugging Face definitions (RMSNorm, rotate-half RoPE, grouped-query
attention, SwiGLU), not from Crucible's kernels. Parameters use the Hugging Face names, so the
same safetensors file initialises both.
"""
import json
import math
import struct

import numpy as np
import torch


def read_safetensors(path):
    """Minimal safetensors reader (numpy); returns ({name: array}, metadata)."""
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    metadata = header.pop("__metadata__", {})
    base = 8 + length
    dtypes = {"F32": np.float32, "I32": np.int32, "F64": np.float64, "I64": np.int64}
    out = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        out[name] = np.frombuffer(data[base + begin:base + end], dtype=dtypes[entry["dtype"]]).reshape(entry["shape"])
    return out, metadata


def write_safetensors(path, tensors):
    """Minimal safetensors writer for I32/F32 numpy arrays."""
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        dtype = {np.dtype(np.int32): "I32", np.dtype(np.float32): "F32"}[array.dtype]
        raw = array.tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


class LlamaReference(torch.nn.Module):
    def __init__(self, weights, n_heads, n_kv_heads, rope_theta=10000.0, eps=1e-5, dtype=torch.float64):
        super().__init__()
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
            q = (h @ self.p(pre + "self_attn.q_proj.weight").T).view(B, T, H, -1)
            k = (h @ self.p(pre + "self_attn.k_proj.weight").T).view(B, T, KV, -1)
            v = (h @ self.p(pre + "self_attn.v_proj.weight").T).view(B, T, KV, -1)
            D = q.shape[-1]
            q, k = self.rope(q, T), self.rope(k, T)
            k = k.repeat_interleave(H // KV, dim=2)
            v = v.repeat_interleave(H // KV, dim=2)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(D)
            mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
            scores = scores.masked_fill(mask, float("-inf"))
            att = torch.softmax(scores, dim=-1) @ v
            att = att.transpose(1, 2).reshape(B, T, H * D)
            x = x + att @ self.p(pre + "self_attn.o_proj.weight").T
            h = self.rmsnorm(x, self.p(pre + "post_attention_layernorm.weight"))
            gate = h @ self.p(pre + "mlp.gate_proj.weight").T
            up = h @ self.p(pre + "mlp.up_proj.weight").T
            x = x + (torch.nn.functional.silu(gate) * up) @ self.p(pre + "mlp.down_proj.weight").T
        x = self.rmsnorm(x, self.p("model.norm.weight"))
        head = self.p("model.embed_tokens.weight") if self.tied else self.p("lm_head.weight")
        return x @ head.T

    def loss(self, tokens, targets):
        logits = self.forward(tokens)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                                 ignore_index=-1, reduction="mean"), logits
