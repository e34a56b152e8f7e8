"""TensorBoard event files ([metrics] enable_tensorboard), read back with TensorBoard's own reader
(tensorboard.backend.event_processing): every scalar equals metrics.jsonl's value at every step,
the held-out validation numbers equal eval/validation.jsonl's, the config text is the resolved
config, and a run killed and resumed shows each step once, with the values of the resumed run.

Tiny runs: the debug flavor with a small seq_len and OMP_NUM_THREADS=1, as test_checkpoint.py."""
import json
import math
import os
import subprocess
from pathlib import Path

import numpy as np
from tensorboard.backend.event_processing import event_accumulator

from conftest import crucible_binary, run_crucible

BASE = ["model.flavor=debug", "training.seq_len=32", "training.local_batch_size=2",
        "metrics.peak_gflops=100", "metrics.enable_tensorboard=true"]
ENV = {"OMP_NUM_THREADS": "1"}
TEXT = "/usr/share/common-licenses/GPL-3"


def settings(run_dir, *extra):
    return sum((["--set", s] for s in [*BASE, f"job.dump_folder={run_dir}", *extra]), [])


def flatten(value, tag, out, top=False):
    """The documented tags (src/train/tensorboard.h, ScalarsOfRecord) of a JSON record."""
    if isinstance(value, bool):
        out[tag] = float(value)
    elif isinstance(value, (int, float)):
        if math.isfinite(value):
            out[tag] = value
    elif isinstance(value, dict):
        for key, item in value.items():
            if not (top and key == "step"):
                flatten(item, f"{tag}/{key}", out)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, dict) and isinstance(item.get("layer"), int):
                flatten({k: v for k, v in item.items() if k != "layer"}, f"{tag}/layer{item['layer']}", out)
            else:
                flatten(item, f"{tag}/{i}", out)
    return out


def expected_scalars(path, prefix):
    """{tag: {step: value}} of every record of a JSON-lines file."""
    expected = {}
    for record in map(json.loads, open(path)):
        for tag, value in flatten(record, prefix, {}, top=True).items():
            expected.setdefault(tag, {})[record["step"]] = value
    return expected


def read(path):
    accumulator = event_accumulator.EventAccumulator(
        str(path), size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
    accumulator.Reload()
    return accumulator


def assert_scalars_equal(accumulator, expected, prefix):
    tags = [t for t in accumulator.Tags()["scalars"] if t.startswith(prefix + "/")]
    assert sorted(tags) == sorted(expected), (sorted(tags), sorted(expected))
    for tag in tags:
        events = accumulator.Scalars(tag)
        steps = [e.step for e in events]
        assert steps == sorted(expected[tag]), f"{tag}: steps {steps}, metrics {sorted(expected[tag])}"
        for e in events:
            assert np.float32(e.value) == np.float32(expected[tag][e.step]), (tag, e.step, e.value)


def assert_config_text(accumulator, run_dir):
    assert accumulator.SummaryMetadata("config").plugin_data.plugin_name == "text"
    config = accumulator.Tensors("config")[-1].tensor_proto
    assert config.string_val[0].decode() == (Path(run_dir) / "config.toml").read_text()


def test_every_metric_and_validation_number_reads_back_equal(tmp_path):
    run_crucible("tokenizer", "train", "--vocab-size", "512", "--whole-file", "-o",
                 tmp_path / "tokenizer.json", TEXT, env=ENV)
    (tmp_path / "held_out.jsonl").write_text(json.dumps({"text": open(TEXT).read()[:1500]}) + "\n")
    run_dir = tmp_path / "run"
    run_crucible("train", *settings(run_dir, "training.steps=10", "model.vocab_size=512",
                                    f"model.tokenizer_path={tmp_path / 'tokenizer.json'}",
                                    "validation.enable=true", "validation.freq=5",
                                    f"validation.held_out={tmp_path / 'held_out.jsonl'}"), env=ENV)
    files = sorted((run_dir / "tb").iterdir())
    assert len(files) == 1 and files[0].name.startswith("events.out.tfevents.")
    accumulator = read(run_dir / "tb")
    train = expected_scalars(run_dir / "metrics.jsonl", "train")
    assert sorted(train["train/loss"]) == list(range(1, 11))
    assert_scalars_equal(accumulator, train, "train")
    validation = expected_scalars(run_dir / "eval" / "validation.jsonl", "validation")
    assert sorted(validation) == ["validation/held_out/bits_per_byte", "validation/held_out/loss",
                                  "validation/held_out/tokens"]
    assert_scalars_equal(accumulator, validation, "validation")
    assert_config_text(accumulator, run_dir)


def test_a_killed_and_resumed_run_shows_each_step_once_with_the_resumed_values(tmp_path):
    run_dir = tmp_path / "run"
    args = [crucible_binary(), "train", *settings(
        run_dir, "training.steps=12", "checkpoint.interval=5", "checkpoint.async=false",
        "debug.kill_rank=0", "debug.kill_step=9", "metrics.save_tb_folder=board")]
    env = dict(os.environ, **ENV)
    killed = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert killed.returncode == -9, killed.stderr
    first = sorted((run_dir / "board").iterdir())
    assert len(first) == 1
    before = read(first[0])
    assert [e.step for e in before.Scalars("train/loss")] == list(range(1, 9))

    resumed = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "phase=resume" in resumed.stdout and " step=5" in resumed.stdout
    files = sorted((run_dir / "board").iterdir())
    assert len(files) == 2 and files[0] == first[0]  # the resumed run's file sorts last
    accumulator = read(run_dir / "board")
    train = expected_scalars(run_dir / "metrics.jsonl", "train")
    assert sorted(train["train/loss"]) == list(range(1, 13))
    # Steps 6-8 of the killed attempt differ (their times at least) and must not show.
    killed_times = {e.step: e.value for e in before.Scalars("train/step_seconds")}
    assert any(np.float32(killed_times[s]) != np.float32(train["train/step_seconds"][s]) for s in (6, 7, 8))
    assert_scalars_equal(accumulator, train, "train")
    assert_config_text(accumulator, run_dir)


def test_off_by_default_and_an_empty_folder_is_a_config_error(tmp_path):
    run_crucible("train", "--set", "model.flavor=debug", "--set", "training.seq_len=32", "--set",
                 "training.steps=2", "--set", f"job.dump_folder={tmp_path / 'off'}", env=ENV)
    assert (tmp_path / "off" / "metrics.jsonl").exists() and not (tmp_path / "off" / "tb").exists()
    proc = run_crucible("train", *settings(tmp_path / "bad", "training.steps=2", 'metrics.save_tb_folder=""'),
                        env=ENV, check=False)
    assert proc.returncode == 2 and "metrics.save_tb_folder is empty" in proc.stderr, proc.stderr
