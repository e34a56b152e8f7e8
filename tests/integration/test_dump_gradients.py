"""debug.dump_gradients_step (bench/exact_reduction_error.py reads it): the reduced gradient of
that one step, every parameter in table order, whose norm is the step's logged grad_norm; refused
in one line before the run on more than one rank."""
import json
import re

import numpy as np

from conftest import run_crucible
from test_distributed import BASE, mpirun


def test_the_dumped_gradient_is_the_whole_table_and_its_norm_is_the_logged_grad_norm(tmp_path):
    run_dir = tmp_path / "run"
    proc = mpirun(1, BASE + ["training.steps=3", "debug.dump_gradients_step=2", "checkpoint.enable=false",
                             f"job.dump_folder={run_dir}"])
    dumps = sorted(p.name for p in run_dir.rglob("gradients-step-*.f32"))
    assert dumps == ["gradients-step-2.f32"], dumps
    grads = np.fromfile(next(run_dir.rglob("gradients-step-2.f32")), dtype=np.float32)
    info = run_crucible("model", "info", "--set", "model.flavor=debug").stdout
    assert grads.size == int(re.search(r"total_params=(\d+)", info).group(1))
    assert np.isfinite(grads).all() and np.count_nonzero(grads) > grads.size // 2
    records = {r["step"]: r for r in map(json.loads, next(run_dir.rglob("metrics.jsonl")).read_text().splitlines())}
    norm = float(np.sqrt(np.sum(grads.astype(np.float64) ** 2)))
    assert abs(norm - records[2]["grad_norm"]) <= 1e-6 * records[2]["grad_norm"], (norm, records[2]["grad_norm"])
    assert abs(norm - records[1]["grad_norm"]) > 1e-6 * norm  # step 2's gradient, not step 1's
    assert "wrote " in proc.stdout + proc.stderr


def test_dumping_on_two_ranks_is_refused_in_one_line_before_the_run(tmp_path):
    run_dir = tmp_path / "run"
    proc = mpirun(2, BASE + ["training.steps=2", "debug.dump_gradients_step=1", f"job.dump_folder={run_dir}"],
                  check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "debug.dump_gradients_step: writes one rank's whole gradient; this run has 2 ranks" in proc.stderr
    assert not list(run_dir.rglob("metrics.jsonl")) and not list(run_dir.rglob("gradients-step-*"))
