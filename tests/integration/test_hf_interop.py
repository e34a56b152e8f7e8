"""Hugging Face interop: `crucible export hf` loads in transformers as LlamaForCausalLM with the
same logits, and a model saved by transformers trains from `[checkpoint] initial_load_hf` (and is
scored by `crucible eval`) with the same logits and loss in crucible; a config.json crucible
cannot reproduce exactly (a RoPE type other than the default, a RoPE base that disagrees with
[model]) is refused.

Each transformers test runs twice (conftest.py, STACKS): "pinned" is transformers 4.40.2 (the
newest line that supports Debian's torch 1.13) in .venv/hf-interop (scripts/setup-hf-interop.sh,
run by the fixture below); "current" is today's transformers 5 on torch 2.15
(scripts/setup-current.sh), which writes the RoPE base as `rope_parameters.rope_theta` instead of
a top-level `rope_theta`, and `dtype` instead of `torch_dtype`. transformers runs only in a
subprocess, so its pinned tokenizers / huggingface_hub do not replace the venv's. The models use
a RoPE base of 500000, not the default 10000, so a base read wrongly shows in the logits.
Tolerance: fp32 logits agree to 1e-4 absolute (observed ~1e-6); losses (mean nats per token)
and eval's summed nats to 1e-5 relative."""
import json
import re

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from conftest import STACKS, python_env, run_crucible, write_bpe_tokenizer

ATOL = 1e-4
LOSS_RTOL = 1e-5
THETA = 500000.0
DEBUG = ["--set", "model.flavor=debug", "--set", "training.seq_len=32",
         "--set", "training.local_batch_size=2", "--set", "metrics.peak_gflops=100"]
ENV = {"OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module", params=STACKS)
def hf(request):
    """Runs python code with transformers importable (PythonEnv of the pinned or current set)."""
    return python_env(request.param, "setup-hf-interop.sh", "hf-interop")


def write_batch(path, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 2048, size=(2, 16), dtype=np.int32)
    targets = np.roll(tokens, -1, axis=1)
    targets[:, -1] = -1
    save_file({"tokens": tokens, "targets": targets}, str(path))
    return tokens


def crucible_outputs(weights, batch, out, *model):
    """Logits and mean loss of `crucible model grads` on the batch."""
    run_crucible("model", "grads", *DEBUG, *model, "--weights", weights, "--batch", batch, "--out", out, env=ENV)
    outputs = load_file(str(out))
    return outputs["logits"], float(outputs["loss"])


# transformers >= 5 calls the from_pretrained argument `dtype` (torch_dtype is deprecated).
HF_LOGITS = r"""
import sys, numpy as np, torch, transformers
from safetensors.numpy import load_file
from transformers import AutoTokenizer, LlamaForCausalLM
dtype = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
model = LlamaForCausalLM.from_pretrained(sys.argv[1], **{dtype: torch.float32}).eval()
tokens = torch.from_numpy(load_file(sys.argv[2])["tokens"].astype(np.int64))
with torch.no_grad():
    np.save(sys.argv[3], model(tokens).logits.numpy())
print("class", type(model).__name__, "transformers", transformers.__version__, "torch", torch.__version__)
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


def test_export_loads_in_transformers_with_the_same_logits(tmp_path, hf):
    tokenizer = tmp_path / "tokenizer.json"
    hf.run(MAKE_TOKENIZER, tokenizer)
    # q_proj and k_proj drawn wider than the init (as in HF_SAVE), so the logits depend on the RoPE base.
    init = tmp_path / "init.safetensors"
    run_crucible("model", "init", *DEBUG, "--out", init)
    weights = load_file(str(init))
    save_file({n: w * 7.5 if "q_proj" in n or "k_proj" in n else w for n, w in weights.items()}, str(init))
    run_dir = tmp_path / "run"
    rope = ["--set", f"model.rope_theta={THETA}"]
    run_crucible("train", *DEBUG, *rope, "--set", "training.steps=5", "--set", "checkpoint.interval=5",
                 "--set", f"model.init_weights={init}", "--set", f"model.tokenizer_path={tokenizer}",
                 "--set", f"job.dump_folder={run_dir}", env=ENV)
    out = tmp_path / "hf"
    proc = run_crucible("export", "hf", run_dir, out)
    assert "ckpt/step-5/model.safetensors" in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["hidden_size"] == 128
    assert config["eos_token_id"] == 0 and config["max_position_embeddings"] == 32
    # The spellings of transformers 4 and 5 side by side (each reads its own natively).
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == THETA
    assert config["rope_parameters"]["rope_type"] == "default" and "rope_scaling" not in config
    assert config["torch_dtype"] == config["dtype"] == "float32"
    assert (out / "tokenizer.json").read_bytes() == tokenizer.read_bytes()

    batch = tmp_path / "batch.safetensors"
    write_batch(batch)
    ours, _ = crucible_outputs(out / "model.safetensors", batch, tmp_path / "ours.safetensors", *rope)
    stdout = hf.run(HF_LOGITS, out, batch, tmp_path / "hf.npy", "tokenizer")
    assert "class LlamaForCausalLM" in stdout
    assert "tokenizer PreTrainedTokenizerFast [1, 2]" in stdout or "tokenizer TokenizersBackend [1, 2]" in stdout
    theirs = np.load(tmp_path / "hf.npy")
    assert theirs.shape == ours.shape == (2, 16, 2048)
    diff = float(np.abs(theirs - ours).max())
    print(f"export, {hf.stack} ({stdout.splitlines()[0]}): max |logits_hf - logits_crucible| = {diff:.3g}")
    assert diff < ATOL
    wrong, _ = crucible_outputs(out / "model.safetensors", batch, tmp_path / "wrong.safetensors")
    assert float(np.abs(theirs - wrong).max()) > 100 * ATOL, "the logits do not depend on the RoPE base"
    # The export loads back into crucible (both spellings of the RoPE base, which agree).
    run_crucible("train", *DEBUG, *rope, "--set", "training.steps=0", "--set", f"checkpoint.initial_load_hf={out}",
                 "--set", f"job.dump_folder={tmp_path / 'back'}", env=ENV)
    assert load_file(str(tmp_path / "back" / "model.safetensors")).keys() == load_file(
        str(out / "model.safetensors")).keys()
    # Exporting into a folder that has files is refused, with nothing written.
    again = run_crucible("export", "hf", run_dir, out, check=False)
    assert again.returncode == 2 and "not empty" in again.stderr


# A LlamaForCausalLM (argv: folder, batch, hidden_size, rope_theta, tie_word_embeddings) as
# transformers saves it (save_pretrained), with its logits and mean loss on the batch, and the
# summed nats of the token ids in the JSON file argv[6] (when given) after the first, as
# `crucible eval --text` scores a document (the first id is the prefix token). q_proj and k_proj
# are drawn wider than the init (std 0.15, not 0.02) so that attention is sharp and the logits
# depend on the positions, hence on the RoPE base.
HF_SAVE = r"""
import json, sys, numpy as np, torch, transformers
from safetensors.numpy import load_file
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
config = LlamaConfig(vocab_size=2048, hidden_size=int(sys.argv[3]), intermediate_size=352,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     rms_norm_eps=1e-5, rope_theta=float(sys.argv[4]), tie_word_embeddings=sys.argv[5] == "true",
                     max_position_embeddings=64)
model = LlamaForCausalLM(config).eval()
with torch.no_grad():
    for name, p in model.named_parameters():
        if "norm" in name:
            p.uniform_(0.5, 1.5)  # not all ones, so a norm loaded in the wrong place shows
        if "q_proj" in name or "k_proj" in name:
            p.normal_(0.0, 0.15)
model.save_pretrained(sys.argv[1])
batch = load_file(sys.argv[2])
tokens = torch.from_numpy(batch["tokens"].astype(np.int64))
labels = torch.from_numpy(batch["targets"].astype(np.int64))
with torch.no_grad():
    logits = model(tokens).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-1)
np.save(sys.argv[1] + "/logits.npy", logits.numpy())
result = {"loss": loss.item(), "transformers": transformers.__version__, "torch": torch.__version__}
if len(sys.argv) > 6:
    ids = json.load(open(sys.argv[6]))
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1]
    result["nats"] = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]), reduction="sum").item()
    result["tokens"] = len(ids) - 1
print(json.dumps(result))
"""


def test_model_saved_by_transformers_imports_with_the_same_logits(tmp_path, hf):
    batch = tmp_path / "batch.safetensors"
    write_batch(batch, seed=1)
    hf_dir = tmp_path / "from_hf"
    saved = json.loads(hf.run(HF_SAVE, hf_dir, batch, 128, THETA, "false"))
    run_dir = tmp_path / "run"
    rope = ["--set", f"model.rope_theta={THETA}"]
    proc = run_crucible("train", *DEBUG, *rope, "--set", "training.steps=0",
                        "--set", f"checkpoint.initial_load_hf={hf_dir}",
                        "--set", f"job.dump_folder={run_dir}", env=ENV)
    assert f"phase=initial_load_hf from={hf_dir}" in proc.stdout
    ours, loss = crucible_outputs(run_dir / "model.safetensors", batch, tmp_path / "ours.safetensors", *rope)
    theirs = np.load(hf_dir / "logits.npy")
    diff = float(np.abs(theirs - ours).max())
    print(f"import, {hf.stack} (transformers {saved['transformers']}, torch {saved['torch']}): "
          f"max |logits_hf - logits_crucible| = {diff:.3g}, loss {saved['loss']:.7f} vs {loss:.7f}")
    assert diff < ATOL
    assert loss == pytest.approx(saved["loss"], rel=LOSS_RTOL)
    wrong, _ = crucible_outputs(run_dir / "model.safetensors", batch, tmp_path / "wrong.safetensors")
    assert float(np.abs(theirs - wrong).max()) > 100 * ATOL, "the logits do not depend on the RoPE base"
    # And training continues from it (the import is the step-0 state).
    trained = run_crucible("train", *DEBUG, *rope, "--set", "training.steps=3",
                           "--set", f"checkpoint.initial_load_hf={hf_dir}",
                           "--set", f"job.dump_folder={tmp_path / 'run2'}", env=ENV)
    assert re.search(r"^done steps=3 ", trained.stdout, re.M)
    # [model] with the default RoPE base (10000) does not match the folder's: refused, not loaded.
    proc = run_crucible("train", *DEBUG, "--set", "training.steps=0", "--set", f"checkpoint.initial_load_hf={hf_dir}",
                        "--set", f"job.dump_folder={tmp_path / 'run3'}", env=ENV, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "rope_theta=500000 vs model.rope_theta=10000" in proc.stderr


def test_eval_of_a_model_saved_by_transformers_matches_its_loss(tmp_path, hf):
    """`crucible eval` on the folder reads the shape, RoPE base and tied embeddings (transformers
    then saves no lm_head.weight) from its config.json alone."""
    text = ("In the beginning God created the heaven and the earth. And the earth was without form, "
            "and void; and darkness was upon the face of the deep.")
    batch = tmp_path / "batch.safetensors"
    write_batch(batch, seed=2)
    hf_dir = tmp_path / "from_hf"
    hf_dir.mkdir()
    ids = write_bpe_tokenizer(hf_dir, text)
    (tmp_path / "held.txt").write_text(text)
    (tmp_path / "ids.json").write_text(json.dumps(ids))
    saved = json.loads(hf.run(HF_SAVE, hf_dir, batch, 128, THETA, "true", tmp_path / "ids.json"))
    assert 16 < saved["tokens"] < 64  # one window of max_position_embeddings
    run_crucible("eval", "-q", hf_dir, "--text", tmp_path / "held.txt", "--json", tmp_path / "ours.json", env=ENV)
    ours = json.loads((tmp_path / "ours.json").read_text())["perplexity"]["held"]
    print(f"eval, {hf.stack} (transformers {saved['transformers']}): nats {ours['nats']:.6f} "
          f"vs transformers {saved['nats']:.6f} over {saved['tokens']} tokens")
    assert ours["tokens"] == saved["tokens"]
    assert ours["nats"] == pytest.approx(saved["nats"], rel=LOSS_RTOL)
    # The same folder with the default RoPE base scores differently: the check above can fail.
    config = json.loads((hf_dir / "config.json").read_text())
    config.pop("rope_parameters", None)
    (hf_dir / "config.json").write_text(json.dumps(dict(config, rope_theta=10000.0)))
    run_crucible("eval", "-q", hf_dir, "--text", tmp_path / "held.txt", "--json", tmp_path / "wrong.json", env=ENV)
    wrong = json.loads((tmp_path / "wrong.json").read_text())["perplexity"]["held"]
    assert abs(wrong["nats"] - saved["nats"]) > 10 * LOSS_RTOL * saved["nats"], "nats do not depend on the RoPE base"


def test_import_of_a_different_shape_lists_the_differing_keys(tmp_path, hf):
    batch = tmp_path / "batch.safetensors"
    write_batch(batch)
    hf_dir = tmp_path / "wide"
    hf.run(HF_SAVE, hf_dir, batch, 256, 10000.0, "false")
    proc = run_crucible("train", *DEBUG, "--set", "training.steps=0",
                        "--set", f"checkpoint.initial_load_hf={hf_dir}",
                        "--set", f"job.dump_folder={tmp_path / 'run'}", env=ENV, check=False)
    assert proc.returncode == 2
    assert "hidden_size=256 vs model.dim=128" in proc.stderr


# config.json as transformers 5 writes it for the debug shape (RoPE keys replaced per case).
CONFIG_V5 = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
             "bos_token_id": 1, "dtype": "float32", "eos_token_id": 2, "head_dim": 32, "hidden_act": "silu",
             "hidden_size": 128, "initializer_range": 0.02, "intermediate_size": 352, "max_position_embeddings": 64,
             "mlp_bias": False, "model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 2,
             "num_key_value_heads": 2, "pad_token_id": None, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
             "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "tie_word_embeddings": False,
             "transformers_version": "5.24.0", "use_cache": True, "vocab_size": 2048}

LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


@pytest.mark.parametrize("case,keys,message", [pytest.param(*case, id=case[0]) for case in [
    ("llama3", {"rope_parameters": LLAMA3}, "rope_type 'llama3' (rope_parameters)"),
    ("yarn", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}},
     "rope_type 'yarn' (rope_parameters)"),
    ("linear-v4", {"rope_parameters": None, "rope_theta": 10000.0, "rope_scaling": {"type": "linear", "factor": 2.0}},
     "rope_type 'linear' (rope_scaling)"),
    ("dynamic-v4", {"rope_parameters": None, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
     "rope_type 'dynamic' (rope_scaling)"),
    ("disagree", {"rope_theta": 500000.0}, "rope_theta=500000 and rope_parameters.rope_theta=10000 disagree"),
    ("not-llama", {"model_type": "qwen2"}, "model_type 'qwen2'"),
    ("gelu", {"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ("bias", {"attention_bias": True}, "attention_bias=true"),
    ("head_dim", {"head_dim": 64}, "head_dim=64 is not hidden_size/num_attention_heads=32: not supported"),
]])
def test_config_crucible_cannot_reproduce_is_refused_naming_file_and_key(tmp_path, case, keys, message):
    folder = tmp_path / case
    folder.mkdir()
    config = dict(CONFIG_V5, **keys)
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    train = ["train", *DEBUG, "--set", "training.steps=0", "--set", f"checkpoint.initial_load_hf={folder}",
             "--set", f"job.dump_folder={tmp_path / 'run'}"]
    for command in (train, ["eval", folder, "--text", folder / "config.json"]):
        proc = run_crucible(*command, env=ENV, check=False)
        assert proc.returncode == 65, (command[0], proc.stdout, proc.stderr)
        assert str(folder / "config.json") in proc.stderr and message in proc.stderr, (command[0], proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
