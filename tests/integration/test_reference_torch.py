"""Crucible's hand-written forward/backward and AdamW against an independent PyTorch reference.

The reference runs in float64, so the differences measure Crucible's own fp32 error. Tolerances:
loss within 1e-6 and logits within 5e-6 absolute; each gradient tensor within 2e-5 of the largest magnitude of
that tensor (max-abs error relative to max-abs value); per-step losses of 10 AdamW steps within 1e-5.
"""
import json

import numpy as np
import pytest
import torch

from conftest import run_crucible
from llama_reference import LlamaReference, read_safetensors, write_safetensors

MODEL = ["model.vocab_size=512", "model.dim=64", "model.n_layers=2", "model.n_heads=4",
         "model.n_kv_heads=2", "model.ffn_hidden_dim=160", "debug.seed=7"]


def sets(items):
    out = []
    for item in items:
        out += ["--set", item]
    return out


@pytest.mark.parametrize("tie", ["false", "true"])
def test_logits_loss_and_every_gradient_match_pytorch(tmp_path, tie):
    model = MODEL + [f"model.tie_embeddings={tie}"]
    weights_path = tmp_path / "init.safetensors"
    run_crucible("model", "init", *sets(model), "--out", weights_path)
    rng = np.random.default_rng(1)
    B, T = 2, 160  # T > 128 exercises the causal row blocks of the attention kernel
    tokens = rng.integers(0, 512, size=(B, T), dtype=np.int32)
    targets = rng.integers(0, 512, size=(B, T), dtype=np.int32)
    targets[0, :5] = -1  # ignored positions (padding)
    targets[1, -3:] = -1
    batch_path = tmp_path / "batch.safetensors"
    write_safetensors(batch_path, {"tokens": tokens, "targets": targets})
    out_path = tmp_path / "out.safetensors"
    run_crucible("model", "grads", *sets(model), "--weights", weights_path, "--batch", batch_path, "--out", out_path)
    ours, meta = read_safetensors(out_path)
    assert int(meta["valid_tokens"]) == B * T - 8

    weights, _ = read_safetensors(weights_path)
    ref = LlamaReference(weights, n_heads=4, n_kv_heads=2)
    loss, logits = ref.loss(torch.tensor(tokens, dtype=torch.long), torch.tensor(targets, dtype=torch.long))
    loss.backward()

    loss_error = abs(float(ours["loss"]) - loss.item())
    logit_error = np.max(np.abs(ours["logits"] - logits.detach().numpy()))
    grad_errors = {}
    for name, param in ref.named().items():
        expected = param.grad.numpy()
        scale = np.max(np.abs(expected))
        assert scale > 0, name
        grad_errors[name] = np.max(np.abs(ours["grad." + name] - expected)) / scale
    worst = max(grad_errors, key=grad_errors.get)
    print(f"tie={tie}: |loss error| {loss_error:.2e}, max |logit error| {logit_error:.2e}, "
          f"worst relative gradient error {grad_errors[worst]:.2e} ({worst})")
    assert loss_error < 1e-6
    assert logit_error < 5e-6
    for name, error in grad_errors.items():
        assert error < 2e-5, f"{name}: relative max error {error:.3g}"


def test_ten_adamw_steps_match_pytorch(tmp_path):
    weights_path = tmp_path / "init.safetensors"
    run_crucible("model", "init", *sets(MODEL), "--out", weights_path)
    seq_len, micro, global_batch, steps = 32, 2, 4, 10
    rng = np.random.default_rng(3)
    # Learnable data: a repeating random sequence, so the loss really moves.
    pattern = rng.integers(0, 512, size=97, dtype=np.uint32)
    stream = np.tile(pattern, 200)
    token_file = tmp_path / "tokens.bin"
    stream.astype(np.uint32).tofile(token_file)
    lr, warmup, wd, max_norm = 3e-3, 3, 0.1, 1.0
    run_dir = tmp_path / "run"
    config = MODEL + [
        f"job.dump_folder={run_dir}", "training.dataset=tokens", f"training.dataset_path={token_file}",
        "training.token_dtype=uint32", f"training.seq_len={seq_len}", f"training.local_batch_size={micro}",
        f"training.global_batch_size={global_batch}", f"training.steps={steps}", f"training.max_norm={max_norm}",
        f"optimizer.lr={lr}", f"optimizer.weight_decay={wd}", "optimizer.beta1=0.9", "optimizer.beta2=0.95",
        "optimizer.eps=1e-8", f"lr_scheduler.warmup_steps={warmup}", "lr_scheduler.decay_type=constant",
        f"model.init_weights={weights_path}", "metrics.peak_gflops=100",
    ]
    run_crucible("train", *sets(config))
    ours = [json.loads(line)["loss"] for line in open(run_dir / "metrics.jsonl")]
    assert len(ours) == steps

    weights, _ = read_safetensors(weights_path)
    ref = LlamaReference(weights, n_heads=4, n_kv_heads=2)
    named = ref.named()
    no_decay = [p for n, p in named.items() if n.endswith("norm.weight") or n == "model.embed_tokens.weight"]
    decay = [p for n, p in named.items() if not (n.endswith("norm.weight") or n == "model.embed_tokens.weight")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    windows = (len(stream) - 1) // seq_len
    expected = []
    for step in range(1, steps + 1):
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, step / warmup)
        opt.zero_grad()
        indices = [((step - 1) * global_batch + i) % windows for i in range(global_batch)]
        samples = np.stack([stream[i * seq_len:i * seq_len + seq_len + 1] for i in indices]).astype(np.int64)
        loss, _ = ref.loss(torch.tensor(samples[:, :-1]), torch.tensor(samples[:, 1:]))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(named.values()), max_norm)
        opt.step()
        expected.append(loss.item())
    assert expected[-1] < expected[0] - 0.1, "reference did not learn; the test data is wrong"
    diffs = [abs(a - b) for a, b in zip(ours, expected)]
    print("max |loss difference| over 10 AdamW steps:", max(diffs))
    assert max(diffs) < 1e-5, list(zip(ours, expected))
