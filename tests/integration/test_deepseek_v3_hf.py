"""The deepseek_v3 family against transformers' own DeepSeek-V3 (DeepseekV3ForCausalLM at the
release of scripts/requirements-current.txt; the pinned transformers 4.40 has no DeepSeek-V3, so
these tests run on the "current" stack only):

- `crucible export hf` of a trained run loads in transformers; logits, loss and every gradient
  (MLA, the dense layer, the router, each routed expert, the shared expert, the head) agree.
- a random DeepseekV3ForCausalLM that transformers wrote (its default rope_interleave = true, its
  experts saved one by one, the balance bias as a buffer) imports through
  `[checkpoint] initial_load_hf` with the same logits and loss, trains, and `crucible eval` on the
  folder scores a text as transformers does.

The routers run on both sides independently, with balance biases away from 0, so the experts
chosen must agree for anything else to. Tolerances (fp32 on both sides): logits 1e-4 absolute
(observed ~1e-6), loss 1e-5 relative, each gradient tensor within 1e-4 of its largest magnitude.
"""
import json
import re

import numpy as np
import pytest

from conftest import python_env, run_crucible, write_bpe_tokenizer
from safetensors_io import read_safetensors, write_safetensors
from test_deepseek_v3 import model_sets

ATOL = 1e-4
LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-4
THETA = 50000.0
ENV = {"OMP_NUM_THREADS": "1"}

# The shape of test_deepseek_v3.BASE (query compression, one dense layer, grouped routing, a
# shared expert, normalised and scaled weights), with the transformers names of each key.
CONFIG = {"vocab_size": 512, "dim": 64, "n_layers": 3, "n_heads": 4, "ffn_hidden_dim": 160,
          "q_lora_rank": 48, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
          "v_head_dim": 16, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
          "moe_intermediate_size": 32, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5,
          "first_k_dense_replace": 1, "norm_topk_prob": True, "tie_embeddings": False,
          "rope_theta": THETA, "norm_eps": 1e-6}
HF_KEYS = {"dim": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
           "ffn_hidden_dim": "intermediate_size", "tie_embeddings": "tie_word_embeddings",
           "norm_eps": "rms_norm_eps"}
TRAIN = ["--set", "training.seq_len=32", "--set", "training.local_batch_size=2",
         "--set", "metrics.peak_gflops=100", "--set", "model.bias_update_speed=0.01"]

# Logits, mean loss (targets -1 ignored) and the gradient of every parameter of the folder argv[1]
# on the batch argv[2], into argv[3] (.npz); the experts' fused 3-D tensors (gate_up_proj,
# down_proj) are split into the per-expert names the folder stores. Prints the versions.
HF_GRADS = r"""
import sys, numpy as np, torch, transformers
from safetensors.numpy import load_file
from transformers import DeepseekV3ForCausalLM
model = DeepseekV3ForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
batch = load_file(sys.argv[2])
tokens = torch.from_numpy(batch["tokens"].astype(np.int64))
targets = torch.from_numpy(batch["targets"].astype(np.int64))
logits = model(tokens).logits
loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
loss.backward()
out = {"logits": logits.detach().numpy(), "loss": np.array(loss.item())}
for name, p in model.named_parameters():
    grad = p.grad.numpy() if p.grad is not None else np.zeros(p.shape, np.float32)
    if name.endswith("mlp.experts.gate_up_proj"):
        base, half = name[:-len("gate_up_proj")], grad.shape[1] // 2
        for e in range(grad.shape[0]):
            out[f"grad.{base}{e}.gate_proj.weight"] = grad[e, :half]
            out[f"grad.{base}{e}.up_proj.weight"] = grad[e, half:]
    elif name.endswith("mlp.experts.down_proj"):
        base = name[:-len("down_proj")]
        for e in range(grad.shape[0]):
            out[f"grad.{base}{e}.down_proj.weight"] = grad[e]
    else:
        out["grad." + name] = grad
np.savez(sys.argv[3], **out)
print(type(model).__name__, "transformers", transformers.__version__, "torch", torch.__version__)
"""

# A random DeepseekV3ForCausalLM of CONFIG's shape (argv[1]: the crucible keys as JSON) saved by
# transformers into argv[2], with its logits and loss on the batch argv[3] and, for the token ids
# in argv[4], the summed nats after the first (as `crucible eval --text` scores a document). The
# norms drawn in [0.5, 1.5], the balance biases from N(0, 0.05), q_b_proj and the RoPE rows of
# kv_a_proj_with_mqa wider than the init so that the logits depend on the positions.
HF_SAVE = r"""
import json, sys, numpy as np, torch, transformers
from safetensors.numpy import load_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
c = json.loads(sys.argv[1])
torch.manual_seed(0)
config = DeepseekV3Config(
    vocab_size=c["vocab_size"], hidden_size=c["dim"], intermediate_size=c["ffn_hidden_dim"],
    moe_intermediate_size=c["moe_intermediate_size"], num_hidden_layers=c["n_layers"],
    num_attention_heads=c["n_heads"], num_key_value_heads=c["n_heads"], n_shared_experts=c["n_shared_experts"],
    n_routed_experts=c["n_routed_experts"], routed_scaling_factor=c["routed_scaling_factor"],
    kv_lora_rank=c["kv_lora_rank"], q_lora_rank=c["q_lora_rank"], qk_rope_head_dim=c["qk_rope_head_dim"],
    v_head_dim=c["v_head_dim"], qk_nope_head_dim=c["qk_nope_head_dim"], n_group=c["n_group"],
    topk_group=c["topk_group"], num_experts_per_tok=c["num_experts_per_tok"],
    first_k_dense_replace=c["first_k_dense_replace"], norm_topk_prob=c["norm_topk_prob"],
    rms_norm_eps=c["norm_eps"], rope_parameters={"rope_type": "default", "rope_theta": c["rope_theta"]},
    max_position_embeddings=64, tie_word_embeddings=c["tie_embeddings"])
model = DeepseekV3ForCausalLM(config).eval()
with torch.no_grad():
    for name, p in model.named_parameters():
        if "norm" in name:
            p.uniform_(0.5, 1.5)
        if "q_b_proj" in name:
            p.normal_(0.0, 0.3)
        if "kv_a_proj_with_mqa" in name:
            p[c["kv_lora_rank"]:].normal_(0.0, 0.3)
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.normal_(0.0, 0.05)
model.save_pretrained(sys.argv[2])
batch = load_file(sys.argv[3])
tokens = torch.from_numpy(batch["tokens"].astype(np.int64))
labels = torch.from_numpy(batch["targets"].astype(np.int64))
ids = json.load(open(sys.argv[4]))
with torch.no_grad():
    logits = model(tokens).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-1)
    doc = model(torch.tensor([ids])).logits[0, :-1]
    nats = torch.nn.functional.cross_entropy(doc, torch.tensor(ids[1:]), reduction="sum").item()
np.save(sys.argv[2] + "/logits.npy", logits.numpy())
print(json.dumps({"loss": loss.item(), "nats": nats, "tokens": len(ids) - 1,
                  "transformers": transformers.__version__, "torch": torch.__version__}))
"""


@pytest.fixture(scope="module")
def hf():
    return python_env("current")


def write_batch(path, seed):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, CONFIG["vocab_size"], size=(2, 48), dtype=np.int32)
    targets = np.roll(tokens, -1, axis=1)
    targets[:, -1] = -1
    targets[0, :3] = -1
    write_safetensors(path, {"tokens": tokens, "targets": targets})


def crucible_grads(weights, batch, out):
    run_crucible("model", "grads", *model_sets(CONFIG), "--weights", weights, "--batch", batch, "--out", out, env=ENV)
    return read_safetensors(out)[0]


def compare_gradients(ours, theirs):
    """The worst relative error of every gradient of `theirs` (the balance bias, a buffer there,
    has none) against ours; experts no token chose have zero gradients on both sides."""
    errors = {}
    for key in theirs.files:
        if not key.startswith("grad."):
            continue
        expected, got = theirs[key], ours[key]
        assert expected.shape == got.shape, key
        scale = float(np.max(np.abs(expected)))
        if scale == 0:
            assert np.all(got == 0), f"{key}: no token chose it in transformers, yet crucible's gradient is not 0"
            continue
        errors[key] = float(np.max(np.abs(got - expected))) / scale
    return errors


def test_export_loads_in_transformers_with_the_same_logits_loss_and_gradients(tmp_path, hf):
    init = tmp_path / "init.safetensors"
    run_crucible("model", "init", *model_sets(CONFIG), "--out", init)
    weights, meta = read_safetensors(init)
    rng = np.random.default_rng(5)
    for name in weights:  # balance biases away from 0, so that the export must carry them
        if name.endswith("e_score_correction_bias"):
            weights[name] = rng.normal(0, 0.05, size=weights[name].shape).astype(np.float32)
        if "q_b_proj" in name:  # wide, so that a RoPE row in the wrong place shows
            weights[name] = weights[name] * 15
    write_safetensors(init, weights, meta)
    run_dir = tmp_path / "run"
    run_crucible("train", *model_sets(CONFIG), *TRAIN, "--set", "training.steps=3", "--set", "checkpoint.interval=3",
                 "--set", f"model.init_weights={init}", "--set", f"job.dump_folder={run_dir}", env=ENV)
    out = tmp_path / "hf"
    run_crucible("export", "hf", run_dir, out)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DeepseekV3ForCausalLM"] and config["model_type"] == "deepseek_v3"
    for key, value in CONFIG.items():
        hf_key = HF_KEYS.get(key, key)
        assert config[hf_key] == value or (key == "rope_theta" and config["rope_parameters"]["rope_theta"] == value), key
    assert config["rope_interleave"] is False and config["num_key_value_heads"] == CONFIG["n_heads"]
    exported, _ = read_safetensors(out / "model.safetensors")
    assert "model.layers.2.mlp.experts.7.down_proj.weight" in exported
    bias = exported["model.layers.1.mlp.gate.e_score_correction_bias"]
    assert np.all(bias != 0) and "model.layers.0.mlp.gate.weight" not in exported

    batch = tmp_path / "batch.safetensors"
    write_batch(batch, seed=1)
    ours = crucible_grads(out / "model.safetensors", batch, tmp_path / "ours.safetensors")
    version = hf.run(HF_GRADS, out, batch, tmp_path / "hf.npz").strip()
    theirs = np.load(tmp_path / "hf.npz")
    logit_error = float(np.max(np.abs(theirs["logits"] - ours["logits"])))
    loss_error = abs(float(theirs["loss"]) - float(ours["loss"])) / float(theirs["loss"])
    errors = compare_gradients(ours, theirs)
    worst = max(errors, key=errors.get)
    print(f"export ({version}): max |logit error| {logit_error:.2e}, relative loss error {loss_error:.2e}, "
          f"worst relative gradient error {errors[worst]:.2e} ({worst}) over {len(errors)} tensors")
    assert logit_error < ATOL and loss_error < LOSS_RTOL
    for name, error in errors.items():
        assert error < GRAD_RTOL, f"{name}: relative max error {error:.3g}"
    assert len(errors) >= len(exported) - 3 * 2 - 2  # most experts were chosen, so compared
    # The balance bias decides: without it, transformers chooses other experts.
    zeroed = {k: (np.zeros_like(v) if k.endswith("e_score_correction_bias") else v) for k, v in exported.items()}
    write_safetensors(out / "model.safetensors", zeroed, read_safetensors(out / "model.safetensors")[1])
    hf.run(HF_GRADS, out, batch, tmp_path / "zeroed.npz")
    assert float(np.max(np.abs(np.load(tmp_path / "zeroed.npz")["logits"] - ours["logits"]))) > 100 * ATOL


def test_model_saved_by_transformers_imports_with_the_same_logits_trains_and_evaluates(tmp_path, hf):
    text = ("In the beginning God created the heaven and the earth. And the earth was without form, "
            "and void; and darkness was upon the face of the deep.")
    hf_dir = tmp_path / "from_hf"
    hf_dir.mkdir()
    ids = write_bpe_tokenizer(hf_dir, text)
    (tmp_path / "ids.json").write_text(json.dumps(ids))
    (tmp_path / "held.txt").write_text(text)
    batch = tmp_path / "batch.safetensors"
    write_batch(batch, seed=2)
    saved = json.loads(hf.run(HF_SAVE, json.dumps(CONFIG), hf_dir, batch, tmp_path / "ids.json"))
    config = json.loads((hf_dir / "config.json").read_text())
    assert config.get("rope_interleave", True), "the interleaved RoPE layout is what this test reads"
    stored, _ = read_safetensors(hf_dir / "model.safetensors")
    assert "model.layers.1.mlp.experts.0.gate_proj.weight" in stored, sorted(stored)[:8]

    run_dir = tmp_path / "run"
    proc = run_crucible("train", *model_sets(CONFIG), *TRAIN, "--set", "training.steps=0",
                        "--set", f"checkpoint.initial_load_hf={hf_dir}", "--set", f"job.dump_folder={run_dir}", env=ENV)
    assert f"phase=initial_load_hf from={hf_dir}" in proc.stdout
    imported = run_dir / "model.safetensors"
    ours = crucible_grads(imported, batch, tmp_path / "ours.safetensors")
    theirs = np.load(hf_dir / "logits.npy")
    diff = float(np.max(np.abs(theirs - ours["logits"])))
    loss = float(ours["loss"])
    print(f"import (transformers {saved['transformers']}, torch {saved['torch']}): max |logits_hf - logits_crucible| "
          f"= {diff:.3g}, loss {saved['loss']:.7f} vs {loss:.7f}")
    assert diff < ATOL
    assert loss == pytest.approx(saved["loss"], rel=LOSS_RTOL)
    # The RoPE rows were de-interleaved: read as stored, the logits differ.
    raw = {name: stored[name] for name in read_safetensors(imported)[0]}
    write_safetensors(tmp_path / "raw.safetensors", raw)
    wrong = crucible_grads(tmp_path / "raw.safetensors", batch, tmp_path / "wrong.safetensors")
    assert float(np.max(np.abs(theirs - wrong["logits"]))) > 100 * ATOL, "the RoPE layout does not show"

    trained = run_crucible("train", *model_sets(CONFIG), *TRAIN, "--set", "training.steps=3",
                           "--set", f"checkpoint.initial_load_hf={hf_dir}",
                           "--set", f"job.dump_folder={tmp_path / 'run2'}", env=ENV)
    assert re.search(r"^done steps=3 ", trained.stdout, re.M) and "load_cv=" in trained.stdout

    # crucible eval reads the family and its shape from config.json alone.
    run_crucible("eval", "-q", hf_dir, "--text", tmp_path / "held.txt", "--json", tmp_path / "eval.json", env=ENV)
    scored = json.loads((tmp_path / "eval.json").read_text())["perplexity"]["held"]
    print(f"eval: nats {scored['nats']:.6f} vs transformers {saved['nats']:.6f} over {saved['tokens']} tokens")
    assert scored["tokens"] == saved["tokens"]
    assert scored["nats"] == pytest.approx(saved["nats"], rel=LOSS_RTOL)

    # [model] keys that disagree with the folder are named, not loaded.
    proc = run_crucible("train", *model_sets({**CONFIG, "n_routed_experts": 16}), *TRAIN, "--set", "training.steps=0",
                        "--set", f"checkpoint.initial_load_hf={hf_dir}", "--set", f"job.dump_folder={tmp_path / 'run3'}",
                        env=ENV, check=False)
    assert proc.returncode == 2 and "n_routed_experts=8 vs model.n_routed_experts=16" in proc.stderr, proc.stderr


@pytest.mark.parametrize("keys,message", [
    ({"scoring_func": "softmax"}, "scoring_func 'softmax'"),
    ({"topk_method": "greedy"}, "topk_method 'greedy'"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0}}, "rope_type 'yarn'"),
    ({"num_key_value_heads": 2}, "num_key_value_heads differs from num_attention_heads"),
    ({"moe_layer_freq": 2}, "moe_layer_freq 2"),
    # Read by `crucible eval` from config.json alone (a run with [model] keys lists the differences).
    ({"n_routed_experts": 6}, "model.n_routed_experts (6) must be divisible by model.n_group (4)"),
])
def test_a_config_crucible_cannot_reproduce_is_refused_naming_the_file_and_key(tmp_path, keys, message):
    folder = tmp_path / "folder"
    folder.mkdir()
    config = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 512,
              "hidden_size": 64, "intermediate_size": 160, "moe_intermediate_size": 32, "num_hidden_layers": 3,
              "num_attention_heads": 4, "num_key_value_heads": 4, "n_shared_experts": 1, "n_routed_experts": 8,
              "routed_scaling_factor": 2.5, "kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 8,
              "v_head_dim": 16, "qk_nope_head_dim": 16, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 2,
              "first_k_dense_replace": 1, "norm_topk_prob": True, "hidden_act": "silu", "rms_norm_eps": 1e-6,
              "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "tie_word_embeddings": False}
    (folder / "config.json").write_text(json.dumps({**config, **keys}))
    train = ["train", *model_sets(CONFIG), "--set", "training.steps=0", "--set", f"checkpoint.initial_load_hf={folder}",
             "--set", f"job.dump_folder={tmp_path / 'run'}"]
    evaluate = ["eval", folder, "--text", folder / "config.json"]
    for command in ([evaluate] if "n_routed_experts" in keys else [train, evaluate]):
        proc = run_crucible(*command, env=ENV, check=False)
        assert proc.returncode == 65, (command[0], proc.stdout, proc.stderr)
        assert str(folder / "config.json") in proc.stderr and message in proc.stderr, (command[0], proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
