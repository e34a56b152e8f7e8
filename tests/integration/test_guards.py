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


def test_the_consecutive_skip_limit_exits_3_naming_the_checkpoint_from_before_the_streak(tmp_path):
    # checkpoint.interval = 2: step 4 is due, but its update is skipped, so the save waits for the
    # next accepted step; the checkpoint named to roll back to is step 2's, from before the skips.
    run_dir = tmp_path / "run"
    proc = mpirun(1, BASE + ["training.steps=8", "checkpoint.interval=2", "checkpoint.async=false",
                             "checkpoint.keep_latest_k=1",
                             "debug.skip_steps=\"4,5\"", "training.max_consecutive_skips=2",
                             f"job.dump_folder={run_dir}"], check=False)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "step 4: update skipped (listed in debug.skip_steps); skipped=1, 1 in a row" in proc.stderr
    assert ("step 5: 2 updates skipped in a row since step 4 (training.max_consecutive_skips = 2): training "
            f"stopped; nothing of this step was saved; roll back to the last checkpoint: {run_dir / 'ckpt' / 'step-2'}"
            in proc.stderr), proc.stderr
    assert "step 4: the interval checkpoint waits for the next step whose update is not skipped" in proc.stdout
    # keep_latest_k = 1 would have rotated step 2 out had a skipped step saved.
    assert sorted(p.name for p in (run_dir / "ckpt").glob("step-*")) == ["step-2"]


def test_a_held_interval_checkpoint_is_written_at_the_next_accepted_step(tmp_path):
    run_dir = tmp_path / "run"
    mpirun(1, BASE + ["training.steps=7", "checkpoint.interval=3", "checkpoint.async=false",
                      "debug.skip_steps=\"3\"", f"job.dump_folder={run_dir}"])
    assert sorted(p.name for p in (run_dir / "ckpt").glob("step-*")) == ["step-4", "step-6", "step-7"]


def test_a_non_finite_loss_is_skipped_like_a_non_finite_gradient(tmp_path):
    # debug.scale_loss_step multiplies the logged loss of step 3 by 1e308 (the product overflows to inf): the update is skipped and
    # the run goes on, ending with the bits of a run that skips step 3 by config.
    guarded, reference = tmp_path / "guarded", tmp_path / "reference"
    proc = mpirun(1, BASE + ["training.steps=5", "debug.scale_loss_step=3", "debug.scale_loss_factor=1e308",
                             f"job.dump_folder={guarded}"])
    assert "step 3: update skipped (non-finite loss: inf); skipped=1, 1 in a row" in proc.stderr, proc.stderr
    ref = mpirun(1, BASE + ["training.steps=5", "debug.skip_steps=\"3\"", f"job.dump_folder={reference}"])
    digest = lambda p: re.search(r"weights_xxh3=([0-9a-f]+)", p.stdout).group(1)
    assert digest(proc) == digest(ref)


def test_a_ramp_stage_that_does_not_divide_is_exit_2_naming_the_key(tmp_path):
    proc = mpirun(2, BASE + ["training.steps=4", "training.batch_ramp=[\"10@3\"]",
                             f"job.dump_folder={tmp_path / 'run'}"], check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert ("training.batch_ramp: stage \"10@3\": its global batch 10 is not a multiple of local_batch_size x "
            "ranks (2 x 2)") in proc.stderr


def test_a_run_that_ends_on_a_non_finite_loss_exits_3_without_final_weights(tmp_path):
    # Lion moves every weight by lr: at 1e20 the weights stay finite but every loss from step 2 on
    # overflows; with both skip limits off, no guard stops it, and yet the run must not exit 0.
    run_dir = tmp_path / "run"
    proc = mpirun(1, BASE + ["training.steps=4", "optimizer.name=Lion", "optimizer.lr=1e20",
                             "optimizer.weight_decay=0", "training.max_consecutive_skips=0",
                             "training.spike_limit=0", f"job.dump_folder={run_dir}"], check=False)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("crucible: error:")]
    assert len(errors) == 1 and "the final loss (step 4) is not finite" in errors[0], proc.stderr
    assert not (run_dir / "model.safetensors").exists()
    assert not [line for line in proc.stdout.splitlines() if line.startswith("done ")]


def test_a_run_of_zero_steps_has_no_loss_and_still_ends_with_exit_0_and_its_initial_weights(tmp_path):
    # steps = 0 (the demo's untrained model, the interop tests' fresh weights): no step, no loss,
    # nothing diverged; the final-loss guard must not read the absent loss as NaN.
    run_dir = tmp_path / "run"
    proc = mpirun(1, BASE + ["training.steps=0", f"job.dump_folder={run_dir}"], check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (run_dir / "model.safetensors").exists()
    assert proc.stdout.splitlines()[-1].startswith("done steps=0 "), proc.stdout


def test_the_done_line_counts_the_skipped_updates(tmp_path):
    proc = mpirun(1, BASE + ["training.steps=5", "debug.skip_steps=\"2,3\"", "training.max_consecutive_skips=0",
                             "training.spike_limit=0", f"job.dump_folder={tmp_path / 'run'}"])
    done = proc.stdout.splitlines()[-1]
    assert done.startswith("done steps=5 ") and " skipped=2 " in done, done
