"""`crucible eval` and `crucible export hf` on a run directory whose ckpt/ holds only checkpoints
that do not verify: they fall back to the run's final model.safetensors and say so on stderr,
naming each checkpoint skipped and why; with no final model either, they fail with an error that
fits them (exit 65, nothing deleted), not the trainer's --resume advice."""
import json
import shutil

import pytest

from conftest import run_crucible
from eval_model import ENV, STEPS, small_task, trained_model


@pytest.fixture
def damaged_run(tmp_path_factory, tmp_path):
    """A copy of the trained run whose only checkpoint has a flipped byte in model.safetensors."""
    run, hf, tokenizer = trained_model(tmp_path_factory)
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    checkpoints = sorted((copy / "ckpt").glob("step-*"))
    assert [c.name for c in checkpoints] == [f"step-{STEPS}"]
    weights = checkpoints[0] / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x40
    weights.write_bytes(bytes(data))
    return copy, tokenizer


def assert_fell_back(proc, run):
    assert proc.returncode == 0, proc.stderr
    assert f"checkpoint {run}/ckpt/step-{STEPS} is unusable: model.safetensors: checksum" in proc.stderr
    assert f"using the run's final model {run}/model.safetensors" in proc.stderr, proc.stderr
    assert "--resume" not in proc.stderr


def test_eval_falls_back_to_the_final_model_and_says_why(damaged_run, tmp_path):
    run, tokenizer = damaged_run
    task = small_task("kjv_next_verse", tmp_path / "kjv.jsonl", 4)
    proc = run_crucible("eval", run, "--tasks", task, "--json", tmp_path / "r.json", "-q", check=False, env=ENV)
    assert_fell_back(proc, run)
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["model"] == f"{run}/model.safetensors" and result["kind"] == "run"


def test_export_falls_back_to_the_final_model_and_says_why(damaged_run, tmp_path):
    run, tokenizer = damaged_run
    proc = run_crucible("export", "hf", run, tmp_path / "hf", check=False, env=ENV)
    assert_fell_back(proc, run)
    assert f"exported {run}/model.safetensors" in proc.stdout
    assert (tmp_path / "hf" / "model.safetensors").exists()


@pytest.mark.parametrize("command", ["eval", "export"])
def test_nothing_usable_is_an_error_that_fits_the_command(damaged_run, tmp_path, command):
    run, tokenizer = damaged_run
    (run / "model.safetensors").unlink()
    before = sorted(p.name for p in (run / "ckpt").iterdir())
    if command == "eval":
        args = ["eval", run, "--tasks", small_task("kjv_next_verse", tmp_path / "kjv.jsonl", 2)]
        verb = "nothing to evaluate"
    else:
        args = ["export", "hf", run, tmp_path / "hf"]
        verb = "nothing to export"
    proc = run_crucible(*args, check=False, env=ENV)
    assert proc.returncode == 65, proc.stderr
    errors = [l for l in proc.stderr.splitlines() if l.startswith("crucible: error")]
    assert len(errors) == 1 and f"{run}: {verb}: none of the 1 checkpoints under {run}/ckpt verifies" in errors[0], errors
    assert "no final model.safetensors" in errors[0] and "--resume" not in errors[0], errors
    assert sorted(p.name for p in (run / "ckpt").iterdir()) == before
    assert not (tmp_path / "hf").exists()
