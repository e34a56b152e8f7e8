"""Weights that are not finite are refused where they are loaded: `model.init_weights = FILE`,
`checkpoint.initial_load_hf = DIR`, and `crucible eval` of such a folder exit 65 with one line
naming the file, the first tensor holding NaN or infinity and how many values are not finite,
before a single step is trained or item scored."""
import shutil

import numpy as np
from safetensors.numpy import load_file, save_file

from conftest import run_crucible
from eval_model import ENV, small_task, trained_model

SMALL = ["--set", "model.flavor=debug", "--set", "model.vocab_size=512", "--set", "training.seq_len=64",
         "--set", "training.local_batch_size=4", "--set", "training.steps=2", "--set", "metrics.peak_gflops=100"]


def poison(path, tensor, values):
    """Rewrites the safetensors file with `values` (a list of floats) at the start of `tensor`."""
    tensors = load_file(str(path))
    flat = tensors[tensor].reshape(-1)
    flat[:len(values)] = values
    save_file(tensors, str(path), metadata={"format": "pt"})


def refusal(proc):
    assert proc.returncode == 65, proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, lines
    assert "step=" not in proc.stdout
    return lines[0]


def test_init_weights_holding_nan_are_refused_before_training(tmp_path):
    weights = tmp_path / "init.safetensors"
    run_crucible("model", "init", "--set", "model.flavor=debug", "--set", "model.vocab_size=512",
                 "--out", weights, env=ENV)
    poison(weights, "model.layers.1.mlp.up_proj.weight", [np.nan, np.inf, np.nan])
    poison(weights, "model.norm.weight", [-np.inf])
    proc = run_crucible("train", *SMALL, "--set", f"model.init_weights={weights}",
                        "--set", f"job.dump_folder={tmp_path / 'run'}", check=False, env=ENV)
    line = refusal(proc)
    assert f"{weights}: tensor 'model.layers.1.mlp.up_proj.weight' holds 3 non-finite values" in line, line
    assert "4 in all, in 2 tensors" in line, line
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not (tmp_path / "run" / "metrics.jsonl").read_text()


def test_a_hugging_face_folder_holding_nan_is_refused_for_training_and_eval(tmp_path_factory, tmp_path):
    run, hf, tokenizer = trained_model(tmp_path_factory)
    bad = tmp_path / "hf"
    shutil.copytree(hf, bad)
    poison(bad / "model.safetensors", "model.embed_tokens.weight", [np.nan] * 7)
    proc = run_crucible("train", *SMALL, "--set", f"checkpoint.initial_load_hf={bad}",
                        "--set", f"job.dump_folder={tmp_path / 'run'}", check=False, env=ENV)
    line = refusal(proc)
    assert f"{bad}/model.safetensors: tensor 'model.embed_tokens.weight' holds 7 non-finite values" in line, line
    task = small_task("kjv_next_verse", tmp_path / "kjv.jsonl", 2)
    line = refusal(run_crucible("eval", bad, "--tasks", task, check=False, env=ENV))
    assert "tensor 'model.embed_tokens.weight' holds 7 non-finite values" in line, line


def test_weights_with_tensors_the_model_lacks_are_refused_by_init_weights_and_grads(tmp_path):
    """A file of a model with attention biases holds every tensor of ours and more: loading it would
    score another model (its biases dropped), so it is refused as a file lacking a tensor is."""
    model = ["--set", "model.flavor=debug", "--set", "model.vocab_size=512"]
    weights = tmp_path / "biased.safetensors"
    run_crucible("model", "init", *model, "--out", weights, env=ENV)
    tensors = load_file(str(weights))
    for layer in range(2):
        for projection in ("q_proj", "k_proj", "v_proj"):
            rows = tensors[f"model.layers.{layer}.self_attn.{projection}.weight"].shape[0]
            tensors[f"model.layers.{layer}.self_attn.{projection}.bias"] = np.full(rows, 0.5, np.float32)
    save_file(tensors, str(weights), metadata={"format": "pt"})
    expected = f"{weights}: tensor 'model.layers.0.self_attn.k_proj.bias' is not in the model (6 tensors are not)"
    proc = run_crucible("train", *SMALL, "--set", f"model.init_weights={weights}",
                        "--set", f"job.dump_folder={tmp_path / 'run'}", check=False, env=ENV)
    assert expected in refusal(proc)
    batch = tmp_path / "batch.safetensors"
    tokens = np.arange(16, dtype=np.int32).reshape(2, 8)
    save_file({"tokens": tokens, "targets": tokens}, str(batch))
    proc = run_crucible("model", "grads", *model, "--weights", weights, "--batch", batch,
                        "--out", tmp_path / "grads.safetensors", check=False, env=ENV)
    assert expected in refusal(proc)
    assert not (tmp_path / "grads.safetensors").exists()
