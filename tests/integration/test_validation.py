"""Evaluation during training ([validation]) and the eval gate."""
import json
import os
import re
import subprocess

import numpy as np
import pytest

from conftest import crucible_binary, run_crucible

TEXT = "/usr/share/common-licenses/GPL-3"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A BPE tokenizer and a token file of the GPL text, a next-sentence task made from it."""
    root = tmp_path_factory.mktemp("validation")
    run_crucible("tokenizer", "train", "--vocab-size", "512", "--whole-file", "-o", root / "tokenizer.json", TEXT)
    run_crucible("tokenizer", "encode", "-t", root / "tokenizer.json", "--whole-file", "--out-bin",
                 root / "tokens.u32", TEXT)
    sentences = [s.strip() for s in re.split(r"(?<=[.;:])\s+", open(TEXT).read()) if 20 < len(s.strip()) < 160]
    rng = np.random.default_rng(0)
    with open(root / "next_sentence.jsonl", "w") as f:
        for i in rng.choice(len(sentences) - 1, size=24, replace=False):
            wrong = [sentences[j] for j in rng.choice(len(sentences), size=3, replace=False) if j != i + 1][:3]
            gold = int(rng.integers(0, len(wrong) + 1))
            choices = wrong[:gold] + [sentences[i + 1]] + wrong[gold:]
            f.write(json.dumps({"context": sentences[i], "choices": choices, "gold": gold}) + "\n")
    with open(root / "held_out.jsonl", "w") as f:
        f.write(json.dumps({"text": " ".join(sentences[:30])}) + "\n")
    return root


def settings(root, run_dir, *extra):
    items = ["model.flavor=debug", "model.vocab_size=512", "training.dataset=tokens",
             f"training.dataset_path={root / 'tokens.u32'}", "training.token_dtype=uint32",
             "training.seq_len=64", "training.local_batch_size=8", f"model.tokenizer_path={root / 'tokenizer.json'}",
             "validation.enable=true", f"validation.tasks=[\"{root / 'next_sentence.jsonl'}\"]",
             f"validation.held_out={root / 'held_out.jsonl'}", f"job.dump_folder={run_dir}",
             "metrics.peak_gflops=10", *extra]
    return sum((["--set", s] for s in items), [])


def test_validation_runs_every_freq_steps_and_logs(corpus, tmp_path):
    proc = run_crucible("train", *settings(corpus, tmp_path / "run", "training.steps=20", "validation.freq=10",
                                           "optimizer.lr=3e-3"))
    evals = [l for l in proc.stdout.splitlines() if l.startswith("phase=eval step=")]
    assert any("step=10 task=next_sentence" in l for l in evals)
    assert any("step=20 held_out=held_out" in l for l in evals)
    records = [json.loads(l) for l in open(tmp_path / "run" / "eval" / "validation.jsonl")]
    assert [r["step"] for r in records] == [10, 20]
    held = [r["held_out"]["bits_per_byte"] for r in records]
    assert held[1] < held[0], held  # the model learns the text
    task = records[-1]["tasks"]["next_sentence"]
    assert task["items"] == 24 and 0 <= task["acc"] <= 1 and 0.25 <= task["chance"] < 0.34


def test_eval_gate_stops_a_run_that_learns_nothing(corpus, tmp_path):
    proc = run_crucible("train", *settings(corpus, tmp_path / "run", "training.steps=12", "validation.freq=5",
                                           "optimizer.lr=0", "validation.gate_after_steps=5",
                                           "validation.gate_action=stop"), check=False)
    assert proc.returncode == 2
    assert "EVAL GATE: after 5 steps task next_sentence is still at chance" in proc.stderr
    assert "stopped by the eval gate at step 5" in proc.stderr
    assert not any(l.startswith("step=6 ") for l in proc.stdout.splitlines())


def test_validation_without_a_tokenizer_is_a_config_error(tmp_path):
    proc = run_crucible("train", "--set", "validation.enable=true", "--set", "validation.held_out=/etc/hostname",
                        "--set", f"job.dump_folder={tmp_path}", check=False)
    assert proc.returncode == 2 and "model.tokenizer_path" in proc.stderr


def test_validation_under_zero3_on_two_ranks_matches_one_process(corpus, tmp_path):
    """ZeRO-3 keeps no full copy of the weights: rank 0 gathers them for the evaluation. The
    validation records must equal those of one process on the same global batch."""
    common = ["training.steps=10", "validation.freq=5", "optimizer.lr=3e-3", "training.global_batch_size=16"]
    run_crucible("train", *settings(corpus, tmp_path / "one", *common))
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    args = ["mpirun", "--oversubscribe", "-np", "2", "-x", "OMPI_ALLOW_RUN_AS_ROOT", "-x",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "-x", "OMP_NUM_THREADS", crucible_binary(), "train",
            *settings(corpus, tmp_path / "two", *common, "parallelism.zero_stage=3")]
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    one = [json.loads(l) for l in open(tmp_path / "one" / "eval" / "validation.jsonl")]
    two = [json.loads(l) for l in open(tmp_path / "two" / "eval" / "validation.jsonl")]
    assert [r["step"] for r in two] == [5, 10]
    assert one == two  # held-out loss and task scores, bit for bit
