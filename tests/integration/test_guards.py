"""The step guards and the batch-size ramp through `crucible train`: the exit codes (3 when the
skip limit stops the run, 2 for a bad ramp) and a ramped run on 2 ranks, resumed in the middle of
a stage, equal to the uninterrupted run on 1 rank (losses and the final weights' hash)."""
import json
import os
import re

import pytest

from test_distributed import BASE, mpirun

RAMP = ["training.batch_ramp=[\"2x@3\", \"32@6\"]", "training.batch_ramp_lr=\"linear\"", "checkpoint.interval=4"]


def losses_and_hash(proc, run_dir):
    lines = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    digest = re.search(r"weights_xxh3=([0-9a-f]+)", proc.stdout).group(1)
    return [(r["step"], r["loss"], r["global_batch"]) for r in lines], digest


@pytest.mark.parametrize("zero_stage", [1, 3])
def test_a_ramped_run_on_two_ranks_resumed_mid_stage_equals_the_straight_run(tmp_path, zero_stage):
    straight = tmp_path / "straight"
    reference = losses_and_hash(mpirun(1, BASE + RAMP + ["training.steps=7", f"job.dump_folder={straight}"]),
                                straight)
    assert [b for _, _, b in reference[0]] == [8, 8, 16, 16, 16, 32, 32]
    run_dir = tmp_path / "resumed"
    # Steps 1-4 (step 4 is the middle of the second stage), then on to 7 from the checkpoint.
    first = mpirun(2, BASE + RAMP + ["training.steps=4", f"job.dump_folder={run_dir}",
                                     f"parallelism.zero_stage={zero_stage}"])
    assert "batch_ramp=8@1,16@3,32@6 batch_ramp_lr=linear" in first.stdout
    assert "global_batch=16 skipped=0" in first.stdout
    proc = mpirun(2, BASE + RAMP + ["training.steps=7", f"job.dump_folder={run_dir}",
                                    f"parallelism.zero_stage={zero_stage}"])
    assert "phase=resume" in proc.stdout
    assert losses_and_hash(proc, run_dir) == reference
    state = json.load(open(run_dir / "ckpt" / "step-4" / "state.json"))
    assert state["consumed_samples"] == 8 + 8 + 16 + 16


def test_the_consecutive_skip_limit_exits_3_naming_the_checkpoint(tmp_path):
    proc = mpirun(1, BASE + ["training.steps=8", "checkpoint.interval=2", "checkpoint.async=false",
                             "debug.skip_steps=\"4,5\"", "training.max_consecutive_skips=2",
                             f"job.dump_folder={tmp_path / 'run'}"], check=False)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "step 4: update skipped (listed in debug.skip_steps); skipped=1, 1 in a row" in proc.stderr
    assert ("step 5: 2 updates skipped in a row (training.max_consecutive_skips = 2): training stopped; "
            f"nothing of this step was saved; roll back to the last checkpoint: {tmp_path / 'run' / 'ckpt' / 'step-4'}"
            in proc.stderr), proc.stderr


def test_a_ramp_stage_that_does_not_divide_is_exit_2_naming_the_key(tmp_path):
    proc = mpirun(2, BASE + ["training.steps=4", "training.batch_ramp=[\"10@3\"]",
                             f"job.dump_folder={tmp_path / 'run'}"], check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert ("training.batch_ramp: stage \"10@3\": its global batch 10 is not a multiple of local_batch_size x "
            "ranks (2 x 2)") in proc.stderr
