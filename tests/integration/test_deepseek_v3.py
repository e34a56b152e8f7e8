"""The deepseek_v3 family (model/deepseek_v3.h) against an independent float64 PyTorch reference
written from the DeepSeek-V3 equations (deepseek_reference.py): MLA with and without query
compression, the dense first layer, MoE layers with grouped routing, shared experts, normalised
and unnormalised top-k weights, tied and untied heads.

Tolerances (Crucible runs in fp32): loss within 1e-6 and logits within 5e-6 absolute; each
gradient tensor within 2e-5 of the largest magnitude of that tensor; an expert no token chose
has a gradient of exactly zero (the reference has none). Both sides route independently; the
experts chosen must agree for the gradients to.
"""
import json

import numpy as np
import pytest

from conftest import STACKS, python_env, run_crucible
from safetensors_io import read_safetensors, write_safetensors

REFERENCE = "import sys, deepseek_reference; deepseek_reference.main(sys.argv[1:])"

BASE = {"vocab_size": 512, "dim": 64, "n_layers": 3, "n_heads": 4, "ffn_hidden_dim": 160,
        "q_lora_rank": 48, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
        "v_head_dim": 16, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 1, "norm_topk_prob": True, "tie_embeddings": False}

VARIANTS = {
    "compressed-queries-grouped": {},
    "plain-queries-no-shared-unnormalised-tied": {
        "q_lora_rank": 0, "n_shared_experts": 0, "norm_topk_prob": False, "n_group": 1, "topk_group": 1,
        "tie_embeddings": True, "v_head_dim": 24, "routed_scaling_factor": 1.0},
    "all-moe-top3": {"first_k_dense_replace": 0, "num_experts_per_tok": 3, "n_shared_experts": 2},
}


def model_sets(config):
    out = ["--set", "model.name=deepseek_v3", "--set", "debug.seed=7"]
    for key, value in config.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        out += ["--set", f"model.{key}={text}"]
    return out


@pytest.fixture(scope="module", params=STACKS)
def torch_env(request):
    return python_env(request.param)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_loss_and_every_gradient_match_the_pytorch_reference(tmp_path, variant, torch_env):
    config = {**BASE, **VARIANTS[variant]}
    sets = model_sets(config)
    weights_path = tmp_path / "init.safetensors"
    run_crucible("model", "init", *sets, "--out", weights_path)
    rng = np.random.default_rng(3)
    B, T = 2, 160  # T > 128: the attention kernel's causal row blocks
    tokens = rng.integers(0, 512, size=(B, T), dtype=np.int32)
    targets = rng.integers(0, 512, size=(B, T), dtype=np.int32)
    targets[0, :5] = -1
    targets[1, -3:] = -1
    batch_path = tmp_path / "batch.safetensors"
    write_safetensors(batch_path, {"tokens": tokens, "targets": targets})
    out_path = tmp_path / "out.safetensors"
    run_crucible("model", "grads", *sets, "--weights", weights_path, "--batch", batch_path, "--out", out_path)
    ours, _ = read_safetensors(out_path)

    reference = {**config, "rope_theta": 10000.0, "norm_eps": 1e-5}
    version = torch_env.run(REFERENCE, "grads", weights_path, batch_path, tmp_path / "ref.npz",
                            json.dumps(reference)).strip()
    ref = np.load(tmp_path / "ref.npz")

    loss_error = abs(float(ours["loss"]) - float(ref["loss"]))
    logit_error = np.max(np.abs(ours["logits"] - ref["logits"]))
    names = [name for name in read_safetensors(weights_path)[0]]
    errors, unused = {}, []
    for name in names:
        grad = ours["grad." + name]
        if "grad." + name not in ref.files:  # an expert no token chose
            unused.append(name)
            assert np.all(grad == 0), f"{name}: no token chose it, yet its gradient is not zero"
            continue
        expected = ref["grad." + name]
        scale = np.max(np.abs(expected))
        assert scale > 0, name
        errors[name] = np.max(np.abs(grad - expected)) / scale
    worst = max(errors, key=errors.get)
    print(f"{variant} {torch_env.stack} ({version}): |loss error| {loss_error:.2e}, max |logit error| "
          f"{logit_error:.2e}, worst relative gradient error {errors[worst]:.2e} ({worst}); "
          f"{len(unused)} experts unused")
    assert loss_error < 1e-6
    assert logit_error < 5e-6
    for name, error in errors.items():
        assert error < 2e-5, f"{name}: relative max error {error:.3g}"
    # Every routed layer's experts were compared through their gradients: most were used.
    assert len(unused) <= 2
