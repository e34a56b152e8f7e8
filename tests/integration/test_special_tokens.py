"""The end- and beginning-of-text tokens: found by the names released tokenizers give them
(DeepSeek's <｜end▁of▁sentence｜> included) or named with --eos-token, used by data prepare, and
written into a Hugging Face export so that transformers' AutoTokenizer reports them."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, run_crucible

ENV = {"OMP_NUM_THREADS": "1"}
DEEPSEEK = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"]
LLAMA3 = ["<|begin_of_text|>", "<|end_of_text|>"]
TEXT = ("The quick brown fox jumps over the lazy dog. " * 40 + "\n") * 20


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


def trained_tokenizer(tmp_path, specials):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    path = tmp_path / "tokenizer.json"
    run_crucible("tokenizer", "train", corpus, "-o", path, "--vocab-size", "300", "--special",
                 *specials, "--special", "<|reserved_0|>", env=ENV)
    return path, corpus


def ids(tokenizer):
    return {t["content"]: t["id"] for t in json.loads(tokenizer.read_text())["added_tokens"]}


def info(tokenizer, *extra):
    out = run_crucible("tokenizer", "info", tokenizer, *extra).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if not
                line.startswith("special_token="))


def test_info_finds_deepseeks_end_of_sentence_or_the_token_named(tmp_path):
    tokenizer, _ = trained_tokenizer(tmp_path, DEEPSEEK)
    fields, known = info(tokenizer), ids(tokenizer)
    assert (fields["bos_token"], fields["bos_id"]) == (DEEPSEEK[0], str(known[DEEPSEEK[0]]))
    assert (fields["eos_token"], fields["eos_id"]) == (DEEPSEEK[1], str(known[DEEPSEEK[1]]))
    named = info(tokenizer, "--eos-token", "<|reserved_0|>")
    assert named["eos_token"] == "<|reserved_0|>"
    assert named["eos_id"] == str(known["<|reserved_0|>"])


def test_data_prepare_closes_documents_with_the_named_token(tmp_path):
    tokenizer, corpus = trained_tokenizer(tmp_path, DEEPSEEK)
    known = ids(tokenizer)
    for extra, eos in (([], known[DEEPSEEK[1]]),
                       (["--eos-token", "<|reserved_0|>"], known["<|reserved_0|>"])):
        prefix = tmp_path / f"shard{eos}"
        run_crucible("data", "prepare", "-q", "-t", tokenizer, "-o", prefix, "--split", "line",
                     corpus, *extra, env=ENV)
        documents = [json.loads(line) for line in
                     run_crucible("data", "dump", prefix).stdout.splitlines()]
        assert len(documents) == 20 and all(d[-1] == eos and eos not in d[:-1] for d in documents)
        manifest = json.loads(Path(str(prefix) + ".manifest.json").read_text())
        assert manifest["tokenizer"]["eos_id"] == eos
    bad = run_crucible("data", "prepare", "-q", "-t", tokenizer, "-o", tmp_path / "bad", corpus,
                       "--eos-token", "<|missing|>", check=False)
    assert bad.returncode == 2 and "<|missing|>" in bad.stderr and str(tokenizer) in bad.stderr


AUTO_TOKENIZER = r"""
import sys
from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
print(repr((tokenizer.bos_token, tokenizer.bos_token_id, tokenizer.eos_token,
            tokenizer.eos_token_id)))
"""


@pytest.fixture(scope="module")
def lm_eval_python():
    """Runs python code with lm-eval importable (offline); returns its stdout."""
    venv = Path(sys.executable).parent.parent
    subprocess.run([str(REPO / "scripts" / "setup-lm-eval.sh"), str(venv)], check=True)

    def run(code, *args):
        env = dict(os.environ, PYTHONPATH=str(venv / "lm-eval"), OMP_NUM_THREADS="1",
                   HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
        proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                              text=True, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout
    return run


LM_EVAL_DEFAULTS = r"""
import sys
from lm_eval.models.huggingface import HFLM
model = HFLM(pretrained=sys.argv[1], device="cpu", dtype="float32")  # default arguments
print(repr((model.eot_token_id, model.prefix_token_id, model.tokenizer.pad_token,
            len(model.tokenizer))))
"""


def export_run(tmp_path, specials):
    """A 2-step debug run with a crucible tokenizer, exported; returns (folder, bos, eos)."""
    tokenizer, _ = trained_tokenizer(tmp_path, specials)
    bos, eos = (ids(tokenizer)[s] for s in specials)
    run_dir = tmp_path / "run"
    run_crucible("train", "--set", "model.flavor=debug", "--set", "model.vocab_size=300",
                 "--set", "training.seq_len=32", "--set", "training.local_batch_size=2",
                 "--set", "metrics.peak_gflops=100", "--set", "training.steps=2",
                 "--set", "checkpoint.interval=2", "--set", f"model.tokenizer_path={tokenizer}",
                 "--set", f"job.dump_folder={run_dir}", env=ENV)
    out = tmp_path / "hf"
    run_crucible("export", "hf", run_dir, out)
    return out, bos, eos, json.loads(tokenizer.read_text())


def test_lm_eval_with_default_arguments_finds_the_end_of_text(tmp_path, lm_eval_python):
    # Without eos_token in tokenizer_config.json lm-eval 0.4.3 had no end-of-text token and added
    # a pad token of its own (a vocabulary the model does not have).
    out, bos, eos, tokenizer = export_run(tmp_path, LLAMA3)
    size = max(t["id"] for t in tokenizer["added_tokens"]) + 1
    assert lm_eval_python(LM_EVAL_DEFAULTS, out).strip() == repr((eos, bos, LLAMA3[1], size))


@pytest.mark.parametrize("specials", [LLAMA3, DEEPSEEK], ids=["llama3", "deepseek"])
def test_export_makes_autotokenizer_report_bos_and_eos(specials, tmp_path, hf_python):
    out, bos, eos, _ = export_run(tmp_path, specials)
    config = json.loads((out / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (bos, eos)
    reported = hf_python(AUTO_TOKENIZER, out).strip()
    assert reported == repr((specials[0], bos, specials[1], eos))
