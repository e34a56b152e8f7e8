"""Stop signals of `crucible train` without the launcher (docs/checkpoints.md, "Signals and exit
codes"): the first SIGINT acts like SIGTERM, a second one exits at once; a stop without a
checkpoint exits 75, not 143; SIGUSR1 to a bare `mpirun` reaches every rank and ends in a
complete checkpoint and 143 (SIGTERM to mpirun does not: it kills the ranks ~1 s later)."""
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import crucible_binary

ENV = dict(os.environ, OMP_NUM_THREADS="1")
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMP_NUM_THREADS": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}
# 200 short steps (tens of ms each) with a constant LR: the signal lands near step 5, long
# before the end even on a loaded machine; the only checkpoint is the one the stop writes.
SETTINGS = ["model.flavor=debug", "training.seq_len=32", "training.local_batch_size=2",
            "training.global_batch_size=8", "training.steps=200", "metrics.peak_gflops=100",
            "lr_scheduler.warmup_steps=2", "lr_scheduler.decay_type=constant", "optimizer.lr=1e-3",
            "checkpoint.interval=1000"]
STOPPED = re.compile(r"^stopped step=(\d+) signal=(\S+) checkpoint=(.*) exit=(\d+)$", re.M)


def train_args(run_dir, *extra):
    args = [crucible_binary(), "train"]
    for item in SETTINGS + [f"job.dump_folder={run_dir}", *extra]:
        args += ["--set", item]
    return args


def start(args, env=ENV):
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)


def wait_for_step(proc, step):
    """Reads stdout until the line of `step` (the handlers are installed long before)."""
    for line in proc.stdout:
        if line.startswith(f"step={step} "):
            return
    raise AssertionError(f"ended before step {step}: exit {proc.wait()}\n{proc.stderr.read()}")


def result(run_dir, stdout):
    losses = [(r["step"], r["loss"]) for r in map(json.loads, open(Path(run_dir) / "metrics.jsonl"))]
    return losses, re.search(r"weights_xxh3=([0-9a-f]+)", stdout).group(1)


def test_first_sigint_checkpoints_and_exits_143(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(train_args(run_dir))
    wait_for_step(proc, 5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, out + err
    stopped = STOPPED.search(out)
    assert stopped and stopped.group(2) == "SIGINT" and stopped.group(4) == "143", out
    step = int(stopped.group(1))
    assert Path(stopped.group(3)) == run_dir / "ckpt" / f"step-{step}"
    assert (run_dir / "ckpt" / f"step-{step}" / "COMPLETE").exists()
    assert "stop requested by SIGINT" in err


def test_second_sigint_exits_at_once(tmp_path):
    # Steps of seconds (seq_len 1024, batch 16), so the second signal lands inside the step the
    # first one asked to finish.
    run_dir = tmp_path / "run"
    proc = start(train_args(run_dir, "training.seq_len=1024", "training.local_batch_size=16",
                            "training.global_batch_size=16"))
    wait_for_step(proc, 1)
    proc.send_signal(signal.SIGINT)
    for line in proc.stderr:  # the handler has taken the first signal
        if "stop requested by SIGINT" in line:
            break
    else:
        raise AssertionError(f"the first SIGINT was not taken as a stop request: exit {proc.wait()}")
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGINT, out
    assert "stopped step=" not in out
    assert not list((run_dir / "ckpt").glob("step-*"))


def test_a_stop_with_checkpoints_disabled_exits_75(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(train_args(run_dir, "checkpoint.enable=false"))
    wait_for_step(proc, 5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, out + err
    stopped = STOPPED.search(out)
    assert stopped and stopped.group(3) == "none" and stopped.group(4) == "75", out
    assert "checkpoint.enable = false" in err
    assert not (run_dir / "ckpt").exists()


def test_sigusr1_to_a_bare_mpirun_checkpoints_exits_143_and_resumes_bit_identical(tmp_path):
    straight = tmp_path / "straight"
    plain = subprocess.run(train_args(straight), capture_output=True, text=True, env=ENV, timeout=600)
    assert plain.returncode == 0, plain.stderr
    run_dir = tmp_path / "run"
    mpirun = ["mpirun", "-np", "2"] + sum((["-x", k] for k in MPI_ENV), [])
    env = dict(os.environ, **MPI_ENV)
    proc = start(mpirun + train_args(run_dir, "parallelism.zero_stage=1"), env=env)
    wait_for_step(proc, 5)
    signalled = time.monotonic()
    proc.send_signal(signal.SIGUSR1)  # to mpirun only: it forwards SIGUSR1 to every rank
    out, err = proc.communicate(timeout=120)
    print(f"SIGUSR1 to mpirun -> exit after {time.monotonic() - signalled:.2f} s")
    assert proc.returncode == 143, out + err
    stopped = STOPPED.search(out)
    assert stopped and stopped.group(2) == "SIGUSR1", out
    step = int(stopped.group(1))
    assert not list((run_dir / "ckpt").glob(".tmp-*"))
    resumed = subprocess.run(mpirun + train_args(run_dir, "parallelism.zero_stage=1"), capture_output=True,
                             text=True, env=env, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert f"phase=resume from={stopped.group(3)} step={step} " in resumed.stdout
    assert result(run_dir, resumed.stdout) == result(straight, plain.stdout)


def test_a_signal_to_one_rank_stops_all_and_is_named_by_rank_0(tmp_path):
    # SIGUSR1 to rank 1 only: rank 0 stops at the same step and names the signal rank 1 received.
    run_dir = tmp_path / "run"
    mpirun = ["mpirun", "-np", "2"] + sum((["-x", k] for k in MPI_ENV), [])
    proc = start(mpirun + train_args(run_dir), env=dict(os.environ, **MPI_ENV))
    wait_for_step(proc, 5)
    ranks = subprocess.run(["pgrep", "-f", f"job.dump_folder={run_dir}"], capture_output=True, text=True)
    pids = [int(p) for p in ranks.stdout.split() if int(p) != proc.pid]
    pids = [p for p in pids if "crucible" in open(f"/proc/{p}/cmdline").read().split("\0")[0]]
    rank1 = [p for p in pids if b"OMPI_COMM_WORLD_RANK=1" in Path(f"/proc/{p}/environ").read_bytes().split(b"\0")]
    assert len(rank1) == 1, pids
    os.kill(rank1[0], signal.SIGUSR1)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, out + err
    stopped = STOPPED.search(out)
    assert stopped and stopped.group(2) == "SIGUSR1", out


@pytest.mark.parametrize("threads", ["1", "2"])
def test_repeated_sigusr1_until_the_exit_is_ignored(tmp_path, threads):
    # mpirun and srun forward SIGUSR1 while crucible launch also signals local ranks directly, and
    # a scheduler's warning may come twice: a late copy must not kill a trainer that is exiting.
    # The flood also lands inside the products on every thread: a handler on the interrupted
    # thread's own stack corrupted oneDNN's heap there (abort, "corrupted size vs. prev_size").
    run_dir = tmp_path / "run"
    proc = start(train_args(run_dir), env=dict(ENV, OMP_NUM_THREADS=threads))
    wait_for_step(proc, 5)
    while proc.poll() is None:
        try:
            proc.send_signal(signal.SIGUSR1)
        except ProcessLookupError:
            break
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, out + err
    assert STOPPED.search(out)
