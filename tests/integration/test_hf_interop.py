"""Hugging Face interop: `crucible export hf` loads in transformers as LlamaForCausalLM with the
same logits, and a model saved by transformers trains from `[checkpoint] initial_load_hf` with
the same logits in crucible.

transformers 4.40.2 (the newest line that supports Debian's torch 1.13) lives in
.venv/hf-interop (scripts/setup-hf-interop.sh, run by the fixture below) and is imported only in
a subprocess with that folder first on PYTHONPATH, so its pinned tokenizers / huggingface_hub do
not replace the venv's. Tolerance: fp32 logits agree to 1e-4 absolute (observed ~1e-6)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from conftest import REPO, crucible_binary, run_crucible

ATOL = 1e-4
DEBUG = ["--set", "model.flavor=debug", "--set", "training.seq_len=32",
         "--set", "training.local_batch_size=2", "--set", "metrics.peak_gflops=100"]
ENV = {"OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def hf_python():
    """Runs python code with transformers importable; returns its stdout."""
    venv = Path(sys.executable).parent.parent
    subprocess.run([str(REPO / "scripts" / "setup-hf-interop.sh"), str(venv)], check=True)
    target = venv / "hf-interop"

    def run(code, *args):
        env = dict(os.environ, PYTHONPATH=str(target), OMP_NUM_THREADS="1")
        proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                              text=True, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout
    return run


def write_batch(path, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 2048, size=(2, 16), dtype=np.int32)
    targets = np.roll(tokens, -1, axis=1)
    targets[:, -1] = -1
    save_file({"tokens": tokens, "targets": targets}, str(path))
    return tokens


def crucible_logits(weights, batch, out):
    run_crucible("model", "grads", *DEBUG, "--weights", weights, "--batch", batch, "--out", out, env=ENV)
    return load_file(str(out))["logits"]


HF_LOGITS = r"""
import sys, numpy as np, torch
from safetensors.numpy import load_file
from transformers import AutoTokenizer, LlamaForCausalLM
model = LlamaForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32).eval()
tokens = torch.from_numpy(load_file(sys.argv[2])["tokens"].astype(np.int64))
with torch.no_grad():
    np.save(sys.argv[3], model(tokens).logits.numpy())
print("class", type(model).__name__)
if len(sys.argv) > 4:
    tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
    print("tokenizer", type(tokenizer).__name__, tokenizer("hello world")["input_ids"])
"""

MAKE_TOKENIZER = r"""
import sys
from tokenizers import Tokenizer, models, pre_tokenizers
vocab = {"<|endoftext|>": 0, "hello": 1, "world": 2, "[UNK]": 3}
tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer.add_special_tokens(["<|endoftext|>"])
tokenizer.save(sys.argv[1])
"""


def test_export_loads_in_transformers_with_the_same_logits(tmp_path, hf_python):
    tokenizer = tmp_path / "tokenizer.json"
    hf_python(MAKE_TOKENIZER, tokenizer)
    run_dir = tmp_path / "run"
    run_crucible("train", *DEBUG, "--set", "training.steps=5", "--set", "checkpoint.interval=5",
                 "--set", f"model.tokenizer_path={tokenizer}", "--set", f"job.dump_folder={run_dir}", env=ENV)
    out = tmp_path / "hf"
    proc = run_crucible("export", "hf", run_dir, out)
    assert "ckpt/step-5/model.safetensors" in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["hidden_size"] == 128
    assert config["eos_token_id"] == 0 and config["max_position_embeddings"] == 32
    assert (out / "tokenizer.json").read_bytes() == tokenizer.read_bytes()

    batch = tmp_path / "batch.safetensors"
    write_batch(batch)
    ours = crucible_logits(out / "model.safetensors", batch, tmp_path / "ours.safetensors")
    stdout = hf_python(HF_LOGITS, out, batch, tmp_path / "hf.npy", "tokenizer")
    assert "class LlamaForCausalLM" in stdout
    assert "tokenizer PreTrainedTokenizerFast [1, 2]" in stdout
    theirs = np.load(tmp_path / "hf.npy")
    assert theirs.shape == ours.shape == (2, 16, 2048)
    diff = float(np.abs(theirs - ours).max())
    print(f"export: max |logits_hf - logits_crucible| = {diff:.3g}")
    assert diff < ATOL
    # Exporting into a folder that has files is refused, with nothing written.
    again = run_crucible("export", "hf", run_dir, out, check=False)
    assert again.returncode == 2 and "not empty" in again.stderr


HF_SAVE = r"""
import sys, numpy as np, torch
from safetensors.numpy import load_file
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
config = LlamaConfig(vocab_size=2048, hidden_size=int(sys.argv[3]), intermediate_size=352,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                     max_position_embeddings=64)
model = LlamaForCausalLM(config).eval()
with torch.no_grad():
    for name, p in model.named_parameters():
        if "norm" in name:
            p.uniform_(0.5, 1.5)  # not all ones, so a norm loaded in the wrong place shows
model.save_pretrained(sys.argv[1])
tokens = torch.from_numpy(load_file(sys.argv[2])["tokens"].astype(np.int64))
with torch.no_grad():
    np.save(sys.argv[1] + "/logits.npy", model(tokens).logits.numpy())
"""


def test_model_saved_by_transformers_imports_with_the_same_logits(tmp_path, hf_python):
    batch = tmp_path / "batch.safetensors"
    write_batch(batch, seed=1)
    hf_dir = tmp_path / "from_hf"
    hf_python(HF_SAVE, hf_dir, batch, 128)
    run_dir = tmp_path / "run"
    proc = run_crucible("train", *DEBUG, "--set", "training.steps=0",
                        "--set", f"checkpoint.initial_load_hf={hf_dir}",
                        "--set", f"job.dump_folder={run_dir}", env=ENV)
    assert f"phase=initial_load_hf from={hf_dir}" in proc.stdout
    ours = crucible_logits(run_dir / "model.safetensors", batch, tmp_path / "ours.safetensors")
    theirs = np.load(hf_dir / "logits.npy")
    diff = float(np.abs(theirs - ours).max())
    print(f"import: max |logits_hf - logits_crucible| = {diff:.3g}")
    assert diff < ATOL
    # And training continues from it (the import is the step-0 state).
    trained = run_crucible("train", *DEBUG, "--set", "training.steps=3",
                           "--set", f"checkpoint.initial_load_hf={hf_dir}",
                           "--set", f"job.dump_folder={tmp_path / 'run2'}", env=ENV)
    assert re.search(r"^done steps=3 ", trained.stdout, re.M)


def test_import_of_a_different_shape_lists_the_differing_keys(tmp_path, hf_python):
    batch = tmp_path / "batch.safetensors"
    write_batch(batch)
    hf_dir = tmp_path / "wide"
    hf_python(HF_SAVE, hf_dir, batch, 256)
    proc = run_crucible("train", *DEBUG, "--set", "training.steps=0",
                        "--set", f"checkpoint.initial_load_hf={hf_dir}",
                        "--set", f"job.dump_folder={tmp_path / 'run'}", env=ENV, check=False)
    assert proc.returncode == 2
    assert "hidden_size=256 vs model.dim=128" in proc.stderr
