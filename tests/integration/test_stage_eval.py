"""Evaluations between training stages ([stage_eval], docs/training.md#stages) through the real
binary: a two-stage run writes one line per boundary to eval/stages.jsonl (start, after each
stage) with held-out text and task scores equal to `crucible eval` of the same weights; a run
killed and resumed (at a boundary's checkpoint, and inside a stage), or run on two ranks under
ZeRO-3, leaves the same file; the
stage gate stops the run before the next stage with exit 3 and a line naming stage and task; bad
settings are refused in one line (exit 2); `crucible report` tabulates the boundaries."""
import json
import os
import subprocess

import pytest

from conftest import crucible_binary, run_crucible
from test_distributed import MPI_ENV
from test_data import TEXTS, corpus, tokenizer_json  # noqa: F401 (fixture)
from test_stages import config, corpora, train, two_stages  # noqa: F401 (fixture)


def task_file(path, n=8):
    """A generic multiple-choice task from the corpus sentences: the true ending against others."""
    with open(path, "w") as f:
        for i in range(n):
            words = [TEXTS[(i + k) % len(TEXTS)].split() for k in range(3)]
            half = len(words[0]) // 2
            choices = [" ".join(w[half:]) for w in words]
            gold = i % 3
            choices[0], choices[gold] = choices[gold], choices[0]
            f.write(json.dumps({"context": " ".join(words[0][:half]), "choices": choices, "gold": gold}) + "\n")
    return path


def setup(tmp):
    task = task_file(tmp / "next.jsonl")
    held = tmp / "held.jsonl"
    held.write_text("".join(json.dumps({"text": t}) + "\n" for t in corpus(6, "h")))
    cpt_held = tmp / "cpt_held.txt"
    cpt_held.write_text(" ".join(corpus(4, "d")))
    stages = two_stages(tmp)
    stages[1]["eval_text"] = [str(cpt_held)]
    extra = f'\n[stage_eval]\ntasks = ["{task}"]\ntext = ["{held}"]\ngate_tasks = ["next"]\ngate_margin = 1.0\n'
    return task, held, cpt_held, stages, extra


def lines(run_dir):
    return [json.loads(l) for l in open(run_dir / "eval" / "stages.jsonl")]


def crucible_eval(target, task, texts, out):
    run_crucible("eval", target, "--tasks", task, "--text", *texts, "--json", out, "-q",
                 env={"OMP_NUM_THREADS": "1"})
    return json.loads(out.read_text())


def same_numbers(line, result):
    for name, t in line["tasks"].items():
        for key in ("acc", "acc_stderr", "acc_norm", "acc_norm_stderr", "items"):
            assert t[key] == result["tasks"][name][key], (name, key)
    for name, t in line["text"].items():
        for key in ("bits_per_byte", "tokens", "bytes"):
            assert t[key] == result["perplexity"][name][key], (name, key)


def test_stage_boundaries_are_evaluated_resumed_alike_and_gated(corpora, tokenizer_json):  # noqa: F811
    tmp = corpora
    task, held, cpt_held, stages, extra = setup(tmp)
    straight = train("--config", config(tmp, tokenizer_json, "straight", stages, extra))
    assert "phase=stage_eval boundary=1 step=6 task=next items=8 acc=" in straight.stdout
    reference = lines(tmp / "straight")
    assert [(l["boundary"], l["stage"], l["next_stage"], l["step"], l["tokens_seen"]) for l in reference] == \
        [(0, None, "pre", 0, 0), (1, "pre", "cpt", 6, 6 * 4 * 32), (2, "cpt", None, 12, 12 * 4 * 32)]
    for l in reference:
        assert set(l["text"]) == {"held", "cpt_held"} and l["text"]["cpt_held"]["stage"] == "cpt"
        assert l["text"]["held"]["stage"] is None and l["text"]["held"]["bits_per_byte"] > 0
        assert set(l["tasks"]["next"]) >= {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr", "items"}
        assert l["gate"]["stopped"] is False and l["gate"]["checked"] is (l["boundary"] > 0)
    # Trained on the held-out corpus' kind of text, the model's bits per byte fall.
    assert reference[2]["text"]["held"]["bits_per_byte"] < reference[0]["text"]["held"]["bits_per_byte"]
    # The numbers after each stage are crucible eval's of that step's checkpoint.
    for step, line in [(6, reference[1]), (12, reference[2])]:
        same_numbers(line, crucible_eval(tmp / "straight" / "ckpt" / f"step-{step}", task, [held, cpt_held],
                                         tmp / f"eval{step}.json"))

    # Two ranks under ZeRO-3: the same weights at every boundary, the same file.
    args = ["mpirun", "-np", "2"] + [a for key in MPI_ENV for a in ("-x", key)]
    two = subprocess.run(args + [crucible_binary(), "train", "--config", str(tmp / "straight.toml"),
                                 "--set", f"job.dump_folder={tmp / 'ranks'}", "--set", "parallelism.zero_stage=3"],
                         capture_output=True, text=True, env=dict(os.environ, **MPI_ENV),
                         timeout=300)
    assert two.returncode == 0, two.stdout + two.stderr
    assert (tmp / "ranks" / "eval" / "stages.jsonl").read_text() == \
        (tmp / "straight" / "eval" / "stages.jsonl").read_text()

    # Killed before step 7 (resumes from step 6's checkpoint: boundary 1 passes again and its
    # line is replaced) and before step 10 (inside stage 2): the same file as the straight run.
    for kill_step in (7, 10):
        name = f"killed{kill_step}"
        path = config(tmp, tokenizer_json, name, stages, extra + f"\n[debug]\nkill_rank = 0\nkill_step = {kill_step}\n")
        killed = train("--config", path, check=False)
        assert killed.returncode != 0 and f"before step {kill_step}" in killed.stderr, killed.stderr
        train("--config", path)
        assert (tmp / name / "eval" / "stages.jsonl").read_text() == \
            (tmp / "straight" / "eval" / "stages.jsonl").read_text()

    # The gate, from step 6's weights (the start boundary is crucible eval of the initial
    # weights), with a margin no stage can meet (it demands a gain of 1): stopped after stage 1,
    # before stage 2, exit 3, naming both and the task.
    path = config(tmp, tokenizer_json, "gated", stages, extra.replace("gate_margin = 1.0", "gate_margin = -1.0"))
    initial = tmp / "straight" / "ckpt" / "step-6" / "model.safetensors"
    gated = train("--config", path, "--set", f"model.init_weights={initial}", "--set", "checkpoint.interval=4",
                  check=False)
    assert gated.returncode == 3, gated.stderr
    message = [l for l in gated.stderr.splitlines() if "stage gate:" in l]
    assert len(message) == 1 and "task next acc " in message[0], gated.stderr
    assert "+ 1 after stage pre (step 6); stopping before stage cpt (exit 3)" in message[0]
    got = lines(tmp / "gated")
    assert [l["boundary"] for l in got] == [0, 1]
    assert got[1]["gate"]["stopped"] is True and got[1]["gate"]["stage"] == "pre" and got[1]["gate"]["task"] == "next"
    same_numbers(got[0], json.loads((tmp / "eval6.json").read_text()))
    assert max(r["step"] for r in map(json.loads, open(tmp / "gated" / "metrics.jsonl"))) == 6
    assert "step=7 " not in gated.stdout
    # The stopped stage's last step is saved (the interval, 4, did not), complete, to go on from.
    assert "phase=checkpoint step=6 mode=sync reason=stage_gate" in gated.stdout
    assert (tmp / "gated" / "ckpt" / "step-6" / "COMPLETE").exists()

    # crucible report shows each run's boundaries: stage, next stage, task accuracy, the gate.
    run_crucible("report", tmp / "straight", tmp / "gated", "-o", tmp / "report.html")
    html = (tmp / "report.html").read_text()
    rows = html.split('<table id="stage-eval-table">')[1].split("</table>")[0].split("<tr>")[2:]
    assert len(rows) == 5
    assert rows[1].startswith("<td>straight</td><td>1</td><td>6</td><td>pre</td><td>cpt</td><td>next ")
    assert "<td>stopped: next after pre</td>" in rows[4] and rows[4].startswith("<td>gated</td><td>1</td>")


@pytest.mark.parametrize("stage_key, extra, expected", [
    ({}, '[stage_eval]\ntasks = ["TASK"]\ngate_tasks = ["nope"]',
     "stage_eval.gate_tasks: 'nope' is not a task of stage_eval.tasks (next)"),
    ({}, '[stage_eval]\ntasks = ["TASK"]\ngate_metric = "f1"', 'stage_eval.gate_metric = "f1": expected acc or acc_norm'),
    ({}, '[stage_eval]\ntasks = ["TASK"]\ngate_margin = 2.0', "stage_eval.gate_margin"),
    ({}, '[stage_eval]\ntasks = ["missing.jsonl"]', 'stage_eval.tasks: "missing.jsonl"'),
    ({"eval_text": "missing.txt"}, "", '[[data.stages]] #1 ("pre"): eval_text = "missing.txt": cannot read it'),
    ({"eval_text": 3}, "", '[[data.stages]] #1 ("pre"): eval_text: expected a file name or a list of file names'),
])
def test_bad_stage_eval_settings_exit_2_in_one_line(corpora, tokenizer_json, stage_key, extra, expected):  # noqa: F811
    tmp = corpora
    task = task_file(tmp / "next.jsonl")
    stages = two_stages(tmp)
    stages[0].update(stage_key)
    proc = train("--config", config(tmp, tokenizer_json, "bad", stages, extra.replace("TASK", str(task))), check=False)
    assert proc.returncode == 2, proc.stderr
    errors = [l for l in proc.stderr.splitlines() if expected in l]
    assert len(errors) == 1, proc.stderr


def test_stage_eval_without_stages_is_refused(corpora, tokenizer_json):  # noqa: F811
    tmp = corpora
    task = task_file(tmp / "next.jsonl")
    path = config(tmp, tokenizer_json, "nostages", [], f'[stage_eval]\ntasks = ["{task}"]\n')
    proc = train("--config", path, "--set", "training.dataset=synthetic", "--set", "training.steps=2", check=False)
    assert proc.returncode == 2, proc.stderr
    assert "stage_eval.tasks is set but the run has no [[data.stages]]" in proc.stderr
