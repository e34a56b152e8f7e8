"""crucible eval: the same results from a run directory, its checkpoint and its Hugging Face
export; --json / --predictions contents; perplexity equals the summed per-token losses of
`crucible model grads`; bad input (missing files, malformed JSONL, unknown shape, label out of
range) fails with the documented exit code, naming the file and line, and writes nothing."""
import json
import math

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from conftest import run_crucible
from eval_model import ENV, STEPS, small_task, trained_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    run, hf, tokenizer = trained_model(tmp_path_factory)
    return run.parent, run, hf, tokenizer


def evaluate(target, *args, check=True):
    return run_crucible("eval", target, *args, env=ENV, check=check)


def test_run_checkpoint_and_export_give_the_same_predictions(model, tmp_path):
    root, run, hf, tokenizer = model
    tasks = [small_task("kjv_next_verse", tmp_path / "kjv.jsonl", 12),
             small_task("fortune_ending", tmp_path / "fortune.jsonl", 12),
             small_task("jargon_term", tmp_path / "jargon.jsonl", 12)]
    outputs = {}
    for name, target in [("run", run), ("checkpoint", run / "ckpt" / f"step-{STEPS}"), ("hf", hf)]:
        proc = evaluate(target, "--tasks", *tasks, "--json", tmp_path / f"{name}.json",
                        "--predictions", tmp_path / f"{name}.jsonl", "--batch-size", 5)
        assert f"kind={name}" in proc.stdout
        assert "phase=eval task=kjv requests=48/48" in proc.stdout
        outputs[name] = ((tmp_path / f"{name}.jsonl").read_text(), json.loads((tmp_path / f"{name}.json").read_text()))
    predictions, results = outputs["run"]
    assert outputs["checkpoint"][0] == predictions
    assert outputs["hf"][0] == predictions  # same weights, same tokenizer: bit-identical scores
    assert set(results["tasks"]) == {"kjv", "fortune", "jargon"}
    assert [results["tasks"][t]["shape"] for t in ("kjv", "fortune", "jargon")] == ["generic", "hellaswag", "arc"]
    rows = [json.loads(line) for line in predictions.splitlines()]
    assert len(rows) == 36
    for task, summary in results["tasks"].items():
        mine = [r for r in rows if r["task"] == task]
        assert summary["items"] == len(mine) == 12
        acc = np.array([r["acc"] for r in mine], dtype=float)
        assert summary["acc"] == pytest.approx(acc.mean(), abs=1e-12)
        assert summary["acc_stderr"] == pytest.approx(acc.std(ddof=1) / math.sqrt(len(acc)), abs=1e-12)
        assert summary["chance"] == pytest.approx(0.25)
        for r in mine:
            lls = np.array(r["loglikelihoods"])
            assert r["pred"] == int(np.argmax(lls))
            assert r["pred_norm"] == int(np.argmax(lls / np.array(r["choice_lengths"])))
            assert all(ll < 0 for ll in lls)
    # Batch size does not change the answers beyond float noise.
    evaluate(hf, "--tasks", tasks[0], "--predictions", tmp_path / "b1.jsonl", "--batch-size", 1, "-q")
    one = [json.loads(line) for line in (tmp_path / "b1.jsonl").read_text().splitlines()]
    for a, b in zip(one, rows[:12]):
        assert np.allclose(a["loglikelihoods"], b["loglikelihoods"], atol=1e-4)


def test_bits_per_byte_is_the_sum_of_token_losses(model, tmp_path):
    root, run, hf, tokenizer = model
    text = "In the beginning God created the heaven and the earth. And the earth was without form."
    held = tmp_path / "held.jsonl"
    held.write_text(json.dumps({"text": text}) + "\n")
    evaluate(hf, "--text", held, "--json", tmp_path / "ppl.json", "-q")
    result = json.loads((tmp_path / "ppl.json").read_text())["perplexity"]["held"]
    assert result["bytes"] == len(text.encode()) and result["documents"] == 1 and result["windows"] == 1
    # The same figure from the model's per-token losses: tokens [BOS] + ids, targets ids.
    encoded = run_crucible("tokenizer", "encode", "-t", tokenizer, tmp_path / "held.jsonl", env=ENV).stdout.split()
    ids = [int(t) for t in encoded]
    assert len(ids) == result["tokens"]
    bos = json.loads((hf / "config.json").read_text())["bos_token_id"]
    tokens = np.array([[bos] + ids[:-1]], dtype=np.int32)
    targets = np.array([ids], dtype=np.int32)
    save_file({"tokens": tokens, "targets": targets}, str(tmp_path / "batch.safetensors"))
    run_crucible("model", "grads", "--set", "model.flavor=debug", "--set", "model.vocab_size=512",
                 "--weights", hf / "model.safetensors", "--batch", tmp_path / "batch.safetensors",
                 "--out", tmp_path / "grads.safetensors", env=ENV)
    nats = float(load_file(str(tmp_path / "grads.safetensors"))["losses"].astype(np.float64).sum())
    assert result["nats"] == pytest.approx(nats, rel=1e-5)
    assert result["bits_per_byte"] == pytest.approx(nats / (len(text.encode()) * math.log(2)), rel=1e-5)


def test_long_documents_are_scored_in_rolling_windows(model, tmp_path):
    root, run, hf, tokenizer = model
    held = tmp_path / "long.txt"
    held.write_text(" ".join(["And the evening and the morning were the first day."] * 60))
    proc = evaluate(hf, "--text", held, "--json", tmp_path / "long.json")
    result = json.loads((tmp_path / "long.json").read_text())["perplexity"]["long"]
    assert result["tokens"] > 128 and result["windows"] == math.ceil(result["tokens"] / 128)
    assert "bits_per_byte" in proc.stdout and 0 < result["bits_per_byte"] < 8


BAD_LINES = [
    ("malformed.jsonl", '{"context": "a", "choices": ["b", "c"], "gold": 0}\n{"context": "a", "choi\n',
     65, "malformed.jsonl:2: not valid JSON"),
    ("shape.jsonl", '{"prompt": "a", "completion": "b"}\n', 65, "shape.jsonl:1: unknown task shape"),
    ("range.jsonl", '{"ctx": "a", "endings": ["b", "c", "d"], "label": 3}\n', 65,
     "range.jsonl:1: label 3 is out of range for 3 choices"),
    ("arc.jsonl", '{"question": "q", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, "answerKey": "C"}\n',
     65, "arc.jsonl:1: answerKey 'C' is not one of choices.label"),
]


@pytest.mark.parametrize("name,contents,code,message", BAD_LINES)
def test_bad_task_files_name_file_and_line(model, tmp_path, name, contents, code, message):
    root, run, hf, tokenizer = model
    path = tmp_path / name
    path.write_text(contents)
    proc = evaluate(hf, "--tasks", path, "--json", tmp_path / "out.json", "--predictions", tmp_path / "p.jsonl",
                    check=False)
    assert proc.returncode == code, proc.stderr
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out.json").exists() and not (tmp_path / "p.jsonl").exists()


def test_missing_inputs_are_usage_errors(model, tmp_path):
    root, run, hf, tokenizer = model
    task = small_task("kjv_next_verse", tmp_path / "kjv.jsonl", 2)
    cases = [
        ((tmp_path / "nope", "--tasks", task), "nope: no such run directory"),
        ((hf, "--tasks", tmp_path / "missing.jsonl"), "missing.jsonl: no such task file"),
        ((hf, "--text", tmp_path / "missing.txt"), "missing.txt: no such text file"),
        ((hf,), "nothing to do"),
        ((hf, "--tasks", task, "--tokenizer", tmp_path / "no-tokenizer.json"), "no-tokenizer.json: no such tokenizer"),
        ((hf, "--tasks", task, "--json", tmp_path / "no" / "dir" / "out.json"), "does not exist"),
    ]
    for args, message in cases:
        proc = evaluate(*args, check=False)
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in proc.stderr, (args, proc.stderr)
    # A damaged export: the weights file is named in a data error.
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in hf.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / "model.safetensors").write_bytes((hf / "model.safetensors").read_bytes()[:1000])
    proc = evaluate(broken, "--tasks", task, check=False)
    assert proc.returncode == 65 and "model.safetensors" in proc.stderr, proc.stderr


def test_a_max_length_beyond_the_models_positions_is_a_usage_error_naming_both(model, tmp_path):
    root, run, hf, tokenizer = model  # trained and exported with 128 positions (training.seq_len)
    task = small_task("kjv_next_verse", tmp_path / "kjv.jsonl", 2)
    for target, source in ((hf, f"max_position_embeddings of {hf}/config.json"),
                           (run, f"training.seq_len of {run}/")):
        proc = evaluate(target, "--tasks", task, "--max-length", 2000000000, check=False)
        assert proc.returncode == 2, (target, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "--max-length 2000000000 is more than the model's 128 positions" in proc.stderr, proc.stderr
        assert source in proc.stderr, proc.stderr
    evaluate(hf, "--tasks", task, "--max-length", 128, "-q")


def test_limit_scores_only_the_first_items(model, tmp_path):
    root, run, hf, tokenizer = model
    task = small_task("fortune_ending", tmp_path / "fortune.jsonl", 10)
    evaluate(hf, "--tasks", task, "--limit", 3, "--json", tmp_path / "r.json", "--predictions", tmp_path / "p.jsonl", "-q")
    assert json.loads((tmp_path / "r.json").read_text())["tasks"]["fortune"]["items"] == 3
    assert [json.loads(line)["line"] for line in (tmp_path / "p.jsonl").read_text().splitlines()] == [1, 2, 3]


@pytest.mark.parametrize("name,contents,extra,reason", [
    ("empty.txt", "", [], "no text to score (the file is empty)"),
    ("blank.jsonl", "\n\n   \n", [], "no text to score (no documents)"),
    ("empty_texts.jsonl", '{"text": ""}\n{"text": ""}\n', [], "no text to score (every document's text is empty)"),
    ("limited.jsonl", '{"text": ""}\n{"text": "In the beginning"}\n', ["--limit", "1"],
     "no text to score in the first 1 documents (--limit 1)"),
])
def test_text_with_nothing_to_score_is_bad_data_not_a_perfect_score(model, tmp_path, name, contents, extra, reason):
    root, run, hf, tokenizer = model
    path = tmp_path / name
    path.write_text(contents)
    proc = evaluate(hf, "--text", path, "--json", tmp_path / "out.json", *extra, check=False)
    assert proc.returncode == 65, proc.stderr
    errors = [l for l in proc.stderr.splitlines() if l.strip()]
    assert errors == [errors[0]] and f"{path}: {reason}" in errors[0], errors
    assert "bits_per_byte" not in proc.stdout and not (tmp_path / "out.json").exists()


def test_whitespace_is_text_the_model_scores(model, tmp_path):
    root, run, hf, tokenizer = model
    path = tmp_path / "newlines.txt"
    path.write_text("\n\n\n")
    evaluate(hf, "--text", path, "--json", tmp_path / "out.json", "-q")
    result = json.loads((tmp_path / "out.json").read_text())["perplexity"]["newlines"]
    assert result["bytes"] == 3 and result["tokens"] >= 1 and result["bits_per_byte"] > 0
