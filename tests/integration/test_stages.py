"""Continued pre-training in stages ([[data.stages]], docs/training.md#stages) through the real
binary: a two-stage run with an anneal, killed in the middle of each stage and resumed, equals the
uninterrupted run bit for bit, and two ranks train it to the same bits; changed stages refuse to
resume; `crucible data inspect --config` shows each stage's mixture within one sample of its
weights at every prefix, a blend of blends' too (its lists' lines reweighted by their shares);
each LR policy's values at the boundary as the docs state them; a run starting from another run's
weights, a checkpoint's or a Hugging Face folder's; one stage equals the plain blend of its list;
lr-find on a blend of blends; bad stages are refused in one line (exit 2)."""
import json
import math
import os
import re
import subprocess

import pytest

from conftest import crucible_binary, run_crucible
from test_distributed import MPI_ENV
from test_data import EOS_TOKEN, corpus, prepare, tokenizer_json  # noqa: F401 (fixture)

LR, WARMUP = 1e-3, 2


def train(*args, check=True):
    """crucible train on one thread: the tiny model gains nothing from two, and a second thread
    spinning beside other work on a shared 2-core machine only slows it (the bits are the same for
    any thread count)."""
    return run_crucible("train", *args, env={"OMP_NUM_THREADS": "1"}, check=check)


@pytest.fixture
def corpora(tmp_path, tokenizer_json):  # noqa: F811
    prepare(tmp_path, tokenizer_json, "web", corpus(300, "w"))
    prepare(tmp_path, tokenizer_json, "books", corpus(120, "b"))
    prepare(tmp_path, tokenizer_json, "dict", corpus(80, "d"))
    (tmp_path / "pre.txt").write_text("0.6 shards/web web\n0.4 shards/books books\n")
    (tmp_path / "cpt.txt").write_text("0.3 shards/books books\n0.7 shards/dict dict\n")
    return tmp_path


def config(tmp, tokenizer_json, run, stages, extra=""):  # noqa: F811
    text = f"""
[job]
dump_folder = "{tmp / run}"
[model]
flavor = "debug"
vocab_size = 640
tokenizer_path = "{tokenizer_json}"
[training]
seq_len = 32
local_batch_size = 2
global_batch_size = 4
dataset = "blend"
[optimizer]
lr = {LR}
[lr_scheduler]
warmup_steps = {WARMUP}
decay_type = "cosine"
[metrics]
peak_gflops = 100.0
[checkpoint]
interval = 2
async = false
keep_latest_k = 0
{extra}
"""
    for stage in stages:
        text += "\n[[data.stages]]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in stage.items())
    path = tmp / f"{run}.toml"
    path.write_text(text)
    return path


def toml_value(value):
    """A stage value as TOML: JSON's scalars and strings, inline tables for dicts (blends)."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)


def two_stages(tmp, policy="gentle"):
    second = {"name": "cpt", "list": str(tmp / "cpt.txt"), "steps": 6, "lr_policy": policy,
              "warmup_steps": 2, "anneal_steps": 3}
    if policy == "gentle":
        second["peak_fraction"] = 0.3
    return [{"name": "pre", "list": str(tmp / "pre.txt"), "tokens": 6 * 4 * 32}, second]


def records(run_dir):
    return [json.loads(line) for line in open(run_dir / "metrics.jsonl")]


def digest(proc):
    return re.search(r"weights_xxh3=([0-9a-f]+)", proc.stdout).group(1)


def test_a_two_stage_run_resumed_in_the_middle_of_each_stage_equals_the_straight_run(corpora, tokenizer_json):  # noqa: F811
    tmp = corpora
    straight = train("--config", config(tmp, tokenizer_json, "straight", two_stages(tmp)))
    assert "stages=pre@1-6:continue,cpt@7-12:gentle" in straight.stdout
    assert "phase=stage stage=2 name=cpt first_step=7 last_step=12 lr_policy=gentle anneal_steps=3" \
        in straight.stdout
    assert "stage=2 stage_name=cpt" in [l for l in straight.stdout.splitlines() if l.startswith("step=7 ")][0]
    reference = records(tmp / "straight")
    assert [(r["step"], r["stage"], r["stage_name"]) for r in reference] == \
        [(s, 1 if s <= 6 else 2, "pre" if s <= 6 else "cpt") for s in range(1, 13)]
    resolved = open(tmp / "straight" / "config.toml").read()
    assert "steps = 12\n" in resolved and "[data]\nstages = [{ list = " in resolved

    def comparable(rs):
        return [(r["step"], r["loss"], r["lr"], r["grad_norm"], r["stage"]) for r in rs]

    # Killed before step 5 (stage 1, checkpoint 4), and before step 10 (stage 2 just after its
    # anneal, checkpoint 8, inside the anneal): each resumed to the end.
    for kill_step, resumed_from in [(5, 4), (10, 8)]:
        name = f"killed{kill_step}"
        path = config(tmp, tokenizer_json, name, two_stages(tmp),
                      f"\n[debug]\nkill_rank = 0\nkill_step = {kill_step}\n")
        killed = train("--config", path, check=False)
        assert killed.returncode != 0 and f"before step {kill_step}" in killed.stderr, killed.stderr
        resumed = train("--config", path)
        assert f"phase=resume" in resumed.stdout and f"step-{resumed_from}" in resumed.stdout
        stage = 1 if resumed_from < 6 else 2
        assert f"phase=stage stage={stage} " in resumed.stdout and f"resumed_at={resumed_from + 1}" in resumed.stdout
        assert comparable(records(tmp / name)) == comparable(reference)
        assert digest(resumed) == digest(straight)

    # The stages are resume-sensitive: a run directory whose checkpoints were made with other
    # stages refuses to resume with these.
    changed = two_stages(tmp)
    changed[1]["anneal_steps"] = 2
    proc = train("--config", config(tmp, tokenizer_json, "changed", changed),
                        "--set", f"job.dump_folder={tmp / 'straight'}", check=False)
    assert proc.returncode == 2, proc.stderr
    assert "the config changed in keys that break resume: data.stages #2: { anneal_steps = 3, " in proc.stderr
    assert "} -> { anneal_steps = 2, " in proc.stderr and "#1" not in proc.stderr, proc.stderr

    # data inspect --config: each stage's realised mixture, within one sample of its weights at
    # every prefix (after the anneal; in it, of the interpolated target).
    report = run_crucible("data", "inspect", "--config", tmp / "straight.toml").stdout
    assert 'Stage 1 "pre": steps 1-6, samples 0-23 (24)' in report
    assert 'Stage 2 "cpt": steps 7-12, samples 24-47 (24)' in report
    assert "anneal: its first 12 samples (3 steps)" in report
    rows = inspect_rows(report)
    assert set(rows) == {(1, "web"), (1, "books"), (2, "books"), (2, "dict"), (2, "web")}
    for (stage, corpus_name), (weight, realised, samples, error, anneal, anneal_error) in rows.items():
        assert error <= 1.0 and anneal_error <= 1.0, (stage, corpus_name, rows)
    assert rows[(1, "web")][0] == 0.6 and rows[(2, "dict")][0] == 0.7
    assert rows[(2, "web")][0] == 0 and rows[(2, "web")][2] == 0  # annealed out: in the anneal only
    assert sum(r[2] for (s, _), r in rows.items() if s == 2) == 24 - 12
    assert sum(r[4] for (s, _), r in rows.items() if s == 2) == 12


def test_two_ranks_train_the_stages_to_the_same_bits(corpora, tokenizer_json):  # noqa: F811
    tmp = corpora
    path = config(tmp, tokenizer_json, "ranks", two_stages(tmp), "enable = false")
    one = train("--config", path, "--set", f"job.dump_folder={tmp / 'one-rank'}")
    args = ["mpirun", "-np", "2"] + [a for key in MPI_ENV for a in ("-x", key)]
    two = subprocess.run(args + [crucible_binary(), "train", "--config", str(path)], capture_output=True,
                         text=True, env=dict(os.environ, **MPI_ENV), timeout=300)
    assert two.returncode == 0, two.stdout + two.stderr
    assert digest(two) == digest(one)
    assert [r["loss"] for r in records(tmp / "ranks")] == [r["loss"] for r in records(tmp / "one-rank")]


def cosine(peak, progress):
    floor = 0.1 * peak
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))


@pytest.mark.parametrize("policy", ["continue", "rewarm", "gentle"])
def test_each_lr_policy_gives_the_stated_learning_rates_at_the_boundary(corpora, tokenizer_json, policy):  # noqa: F811
    tmp = corpora
    stages = two_stages(tmp, policy)
    if policy == "continue":
        del stages[1]["warmup_steps"]
    train("--config", config(tmp, tokenizer_json, policy, stages, "enable = false"))
    lr = {r["step"]: r["lr"] for r in records(tmp / policy)}
    # [lr_scheduler]: warmup 2, cosine to 0.1 x the peak (min_lr_factor's default), per segment.
    if policy == "continue":  # one segment of 12 steps
        expected = {6: cosine(LR, 4 / 10), 7: cosine(LR, 5 / 10), 12: cosine(LR, 1)}
    else:  # stage 1 alone (6 steps), then the stage's own: warmup 2 to its peak, 4 steps of decay
        peak = LR * (0.3 if policy == "gentle" else 1)
        expected = {6: cosine(LR, 1), 7: peak / 2, 8: peak, 10: cosine(peak, 2 / 4), 12: cosine(peak, 1)}
    for step, value in expected.items():
        assert lr[step] == pytest.approx(value, rel=1e-12), (policy, step, lr)


def test_one_stage_is_the_plain_blend_of_its_list(corpora, tokenizer_json):  # noqa: F811
    tmp = corpora
    staged = train("--config", config(
        tmp, tokenizer_json, "one", [{"list": str(tmp / "pre.txt"), "steps": 4}], "enable = false"))
    plain = train("--config", config(tmp, tokenizer_json, "plain", [], "enable = false"),
                         "--set", f"training.dataset_path={tmp / 'pre.txt'}", "--set", "training.steps=4")
    assert [r["loss"] for r in records(tmp / "one")] == [r["loss"] for r in records(tmp / "plain")]
    assert digest(staged) == digest(plain)


def test_stages_start_from_a_run_a_checkpoint_or_a_hugging_face_folder(corpora, tokenizer_json):  # noqa: F811
    tmp = corpora
    train("--config", config(tmp, tokenizer_json, "base", [{"list": str(tmp / "pre.txt"), "steps": 4}]))
    run_crucible("export", "hf", tmp / "base", tmp / "base-hf")
    starts = {"run": f"model.init_weights={tmp / 'base' / 'model.safetensors'}",
              "checkpoint": f"model.init_weights={tmp / 'base' / 'ckpt' / 'step-2' / 'model.safetensors'}",
              "hf": f"checkpoint.initial_load_hf={tmp / 'base-hf'}"}
    first_losses = {}
    for name, setting in starts.items():
        proc = train("--config", config(tmp, tokenizer_json, f"from-{name}", two_stages(tmp)),
                            "--set", setting)
        assert "step=12 " in proc.stdout, proc.stdout
        first_losses[name] = records(tmp / f"from-{name}")[0]["loss"]
    fresh = records(tmp / "base")[0]["loss"]
    assert first_losses["run"] < fresh and first_losses["checkpoint"] < fresh
    assert first_losses["hf"] == first_losses["run"]  # the same weights, the same bits


def inspect_rows(report):
    """data inspect --config's dataset rows: {(stage, corpus): [weight, realised, samples, error,
    anneal samples, anneal error]}."""
    rows, stage = {}, None
    for line in report.splitlines():
        if line.startswith("Stage "):
            stage = int(line.split()[1])
        fields = line.split()
        if stage and len(fields) == 8 and fields[1].isdigit():
            rows[(stage, fields[0])] = [float(x) for x in fields[2:]]
    return rows


def test_a_blend_of_blends_stage_trains_on_the_union_of_its_lists_reweighted(corpora, tokenizer_json):  # noqa: F811
    tmp = corpora
    # pre.txt: web 0.6, books 0.4; cpt.txt: books 0.3, dict 0.7. At 0.25 and 0.75: web 0.15,
    # books 0.1 + 0.225 (a shard both lists name is one dataset, its weights added), dict 0.525.
    blends = [{"list": str(tmp / "pre.txt"), "weight": 0.25}, {"list": str(tmp / "cpt.txt"), "weight": 0.75}]
    stages = [{"name": "pre", "list": str(tmp / "pre.txt"), "steps": 2},
              {"name": "mix", "blends": blends, "steps": 25, "anneal_steps": 2}]
    path = config(tmp, tokenizer_json, "mix", stages, "enable = false")
    description = f"0.25*{tmp / 'pre.txt'}+0.75*{tmp / 'cpt.txt'}"
    report = run_crucible("data", "inspect", "--config", path).stdout
    assert f'Stage 2 "mix": steps 3-27, samples 8-107 (100), blends {description}, lr_policy' in report, report
    rows = inspect_rows(report)
    expected = {"web": 0.15, "books": 0.325, "dict": 0.525}
    assert {c for (s, c) in rows if s == 2} == set(expected)
    steady = 100 - 2 * 4
    for corpus_name, weight in expected.items():
        shown, realised, samples, error, anneal, anneal_error = rows[(2, corpus_name)]
        assert shown == pytest.approx(weight, abs=1e-4)
        assert abs(samples - steady * weight) <= 1 and error <= 1 and anneal_error <= 1, rows
        assert realised == pytest.approx(samples / steady, abs=1e-4)
    assert sum(rows[(2, c)][2] + rows[(2, c)][4] for c in expected) == 100

    # The run reads that mixture; its phase=stage line names the blend of blends.
    proc = train("--config", path)
    assert (f"phase=stage stage=2 name=mix first_step=3 last_step=27 lr_policy=continue "
            f"anneal_steps=2 list={description}") in proc.stdout, proc.stdout
    assert "step=27 " in proc.stdout


def test_lr_find_sweeps_on_a_first_stage_that_is_a_blend_of_blends(corpora, tokenizer_json):  # noqa: F811
    tmp = corpora
    blends = [{"list": str(tmp / "pre.txt"), "weight": 1}, {"list": str(tmp / "cpt.txt"), "weight": 2}]
    stages = [{"name": "mix", "blends": blends, "steps": 30, "lr_policy": "gentle", "peak_fraction": 0.5},
              {"name": "cpt", "list": str(tmp / "cpt.txt"), "steps": 4}]
    out = tmp / "sweep"
    proc = run_crucible("lr-find", "--config", config(tmp, tokenizer_json, "lrf", stages), "--steps", "12",
                        "--out", out, env={"OMP_NUM_THREADS": "1"})
    assert (f"phase=stage stage=1 name=stage1 first_step=1 last_step=12 lr_policy=continue "
            f"anneal_steps=0 list=1*{tmp / 'pre.txt'}+2*{tmp / 'cpt.txt'}") in proc.stdout, proc.stdout
    assert "phase=lr_find status=done steps_run=12 " in proc.stdout


def test_a_blend_list_with_bad_content_is_bad_data_naming_the_stage(corpora, tokenizer_json):  # noqa: F811
    tmp = corpora
    (tmp / "bad.txt").write_text("1 shards/web\n-2 shards/dict\n")
    blends = [{"list": str(tmp / "pre.txt"), "weight": 1}, {"list": str(tmp / "bad.txt"), "weight": 1}]
    path = config(tmp, tokenizer_json, "badlist", [{"name": "mix", "blends": blends, "steps": 2}])
    proc = train("--config", path, check=False)
    assert proc.returncode == 65, proc.stdout + proc.stderr
    errors = [l for l in proc.stderr.splitlines() if "error" in l]
    assert len(errors) == 1 and f'[[data.stages]] #1 ("mix"): {tmp / "bad.txt"}:2: weight -2' in errors[0], \
        proc.stderr


@pytest.mark.parametrize("stage,expected", [
    ({"steps": 3}, '#2 ("stage2"): no list: name the stage\'s blend file list'),
    ({"list": "LIST", "steps": 3, "tokens": 384}, '#2 ("stage2"): both steps and tokens are given'),
    ({"list": "LIST", "steps": 3, "lr_policy": "warm"}, 'lr_policy = "warm" is not a policy'),
    ({"list": "LIST", "steps": 3, "anneal_steps": 4}, "anneal_steps = 4 is longer than the stage (3 steps)"),
    ({"list": "MISSING", "steps": 3}, "cannot read the file list: no such file"),
    ({"list": "LIST", "tokens": 100}, "tokens = 100 is not a whole number of samples"),
    ({"list": "LIST", "blends": [{"list": "LIST", "weight": 1}], "steps": 3},
     '#2 ("stage2"): both list and blends are given'),
    ({"blends": [], "steps": 3}, '#2 ("stage2"): blends = []: name at least one file list'),
    ({"blends": [{"list": "LIST", "weight": 1}, {"list": "LIST", "weight": 0}], "steps": 3},
     '#2 ("stage2"): blends #2 ("LIST"): weight = 0 is out of range: expected a positive finite number'),
    ({"blends": [{"list": "LIST", "weight": -1.5}], "steps": 3}, "weight = -1.5 is out of range"),
    ({"blends": [{"list": "MISSING", "weight": 1}], "steps": 3},
     'blends #1: list = "MISSING": cannot read the file list: no such file'),
    ({"blends": [{"weight": 1}], "steps": 3}, '#2 ("stage2"): blends #1: no list: name a blend file list'),
])
def test_bad_stages_exit_2_in_one_line(corpora, tokenizer_json, stage, expected):  # noqa: F811
    tmp = corpora
    names = {"LIST": str(tmp / "cpt.txt"), "MISSING": str(tmp / "nope.txt")}

    def named(value):
        if isinstance(value, dict):
            return {k: named(v) for k, v in value.items()}
        if isinstance(value, list):
            return [named(v) for v in value]
        return names.get(value, value) if isinstance(value, str) else value
    stage, expected = named(stage), expected.replace("LIST", names["LIST"]).replace("MISSING", names["MISSING"])
    path = config(tmp, tokenizer_json, "bad", [{"list": str(tmp / "pre.txt"), "steps": 3}, stage])
    proc = train("--config", path, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [l for l in proc.stderr.splitlines() if "error" in l]
    assert len(errors) == 1 and expected in errors[0] and f"{path}:" in errors[0], proc.stderr
    if stage.get("list", "").endswith("nope.txt"):
        assert str(tmp / "nope.txt") in errors[0]


def test_steps_that_disagree_with_the_stages_exit_2(corpora, tokenizer_json):  # noqa: F811
    tmp = corpora
    path = config(tmp, tokenizer_json, "steps", two_stages(tmp))
    proc = train("--config", path, "--set", "training.steps=20", check=False)
    assert proc.returncode == 2
    assert ("--set training.steps=20: training.steps = 20 but the stages of [[data.stages]] add up "
            "to 12 steps (pre 6 + cpt 6)") in proc.stderr, proc.stderr
