"""The promise `make demo` shows (scripts/demo.sh): a rank dies partway (the demo switch
debug.kill_rank / debug.kill_step: SIGKILL, as a node that dies, in a run that did not resume),
`crucible launch` classifies the failure and relaunches, the trainer resumes from its newest
complete checkpoint, and the run ends with the weights of a run that never failed, here one
process with the same global batch."""
import json
import os
import re
import subprocess
from pathlib import Path

from test_launch_stop import clean_env  # the environment of a job outside any scheduler

ROOT = Path(__file__).resolve().parents[2]
CRUCIBLE = os.environ.get("CRUCIBLE", str(ROOT / "build" / "crucible"))
HASH = re.compile(r"weights_xxh3=([0-9a-f]+)")
SETTINGS = ["model.flavor=debug", "training.seq_len=32", "training.local_batch_size=2",
            "training.global_batch_size=8", "training.steps=24", "lr_scheduler.warmup_steps=2",
            "optimizer.lr=1e-3", "checkpoint.interval=8"]


def train(run_dir, *extra):
    args = [CRUCIBLE, "train"]
    for item in SETTINGS + [f"job.dump_folder={run_dir}", *extra]:
        args += ["--set", item]
    return args


def test_a_killed_rank_is_relaunched_and_the_run_ends_with_the_uninterrupted_weights(tmp_path):
    straight = subprocess.run(train(tmp_path / "straight"), capture_output=True, text=True,
                              env=clean_env(), timeout=600)
    assert straight.returncode == 0, straight.stderr
    run_dir = tmp_path / "run"
    launched = subprocess.run(
        [CRUCIBLE, "launch", "--run-dir", str(run_dir), "--np", "2", "--mpi", "openmpi", "--retries", "2",
         "--backoff-base", "1", "--", *train(run_dir, "debug.kill_rank=1", "debug.kill_step=13")],
        capture_output=True, text=True, env=clean_env(), timeout=600)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    out = launched.stdout + launched.stderr
    assert "fault: rank 1 kills itself (SIGKILL) before step 13" in out, out
    records = [json.loads(line) for line in (run_dir / "launch" / "attempts.jsonl").read_text().splitlines()]
    attempts = [r for r in records if r["kind"] == "attempt"]
    # The first attempt died at step 12 with a verdict (not success), the second resumed from the
    # checkpoint of step 8 (not step 0: the switch does nothing in a resumed run) and finished.
    assert len(attempts) == 2, attempts
    assert attempts[0]["exit_code"] != 0 and attempts[0]["verdict"] not in ("success", "config_error")
    assert attempts[0]["last_step"] == 12 and attempts[0]["action"] == "retry", attempts[0]
    assert attempts[1]["exit_code"] == 0 and attempts[1]["verdict"] == "success"
    assert f"phase=resume from={run_dir / 'ckpt' / 'step-8'} step=8 " in out, out
    assert HASH.findall(out)[-1] == HASH.findall(straight.stdout + straight.stderr)[-1]


def test_the_kill_switch_is_ignored_by_a_resumed_run(tmp_path):
    """Without a launcher: the fresh run dies before step 13; run again, it resumes from step 8
    and passes step 13."""
    args = train(tmp_path / "run", "debug.kill_rank=0", "debug.kill_step=13")
    first = subprocess.run(args, capture_output=True, text=True, env=clean_env(), timeout=600)
    assert first.returncode == -9, (first.returncode, first.stderr)
    assert "step=12 " in first.stdout and "step=13 " not in first.stdout
    second = subprocess.run(args, capture_output=True, text=True, env=clean_env(), timeout=600)
    assert second.returncode == 0, second.stderr
    assert "phase=resume" in second.stdout and "step=24 " in second.stdout
