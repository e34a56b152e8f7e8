"""The run-directory lock: one crucible train per run directory at a time."""
import json
import os
import signal
import socket
import subprocess

from conftest import crucible_binary, run_crucible

SMALL = ["model.flavor=debug", "training.seq_len=16", "training.local_batch_size=2", "metrics.peak_gflops=100"]
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMP_NUM_THREADS": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def settings(*items):
    return sum((["--set", item] for item in (*SMALL, *items)), [])


def start_run(run_dir, *items):
    """Starts crucible train in the background; returns it once it has printed its first step."""
    proc = subprocess.Popen([crucible_binary(), "train", *settings(f"job.dump_folder={run_dir}", *items)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, **ONE_THREAD))
    for line in proc.stdout:
        if line.startswith("step=1 "):
            return proc
    raise AssertionError(f"the first run ended before its first step: {proc.wait()} {proc.stderr.read()}")


def test_a_second_run_on_the_same_folder_is_refused_and_the_first_finishes_untouched(tmp_path):
    run_dir = tmp_path / "run"
    first = start_run(run_dir, "training.steps=40", "checkpoint.interval=10")
    first.send_signal(signal.SIGSTOP)  # still holding the lock, whatever the machine's load
    try:
        second = run_crucible("train", *settings(f"job.dump_folder={run_dir}", "training.steps=40",
                                                 "checkpoint.interval=10"), env=ONE_THREAD, check=False)
    finally:
        first.send_signal(signal.SIGCONT)
        rest, errors = first.communicate(timeout=600)
    assert second.returncode == 2, second.stderr
    lines = [l for l in second.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, lines
    assert str(run_dir) in lines[0] and "in use by another crucible train" in lines[0], lines
    assert f"host {socket.gethostname()}" in lines[0] and f"pid {first.pid}" in lines[0], lines
    assert second.stdout.count("step=") == 0  # it trained nothing

    assert first.returncode == 0, errors
    assert rest.splitlines()[-1].startswith("done steps=40 ")
    steps = [json.loads(line)["step"] for line in open(run_dir / "metrics.jsonl")]
    assert steps == list(range(1, 41))  # every line whole, each step once
    checkpoints = sorted(os.listdir(run_dir / "ckpt"))
    assert not [c for c in checkpoints if "replaced" in c or c.startswith(".")], checkpoints
    assert checkpoints == ["latest", "step-20", "step-30", "step-40", "train.lock"], checkpoints
    assert (run_dir / "train.lock").read_text() == ""  # released at the end
    assert (run_dir / "ckpt" / "train.lock").read_text() == ""


def test_a_second_run_with_its_own_run_directory_but_the_same_checkpoint_folder_is_refused(tmp_path):
    shared = tmp_path / "shared-ckpt"  # absolute: outside both run directories
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    items = ("training.steps=40", "checkpoint.interval=10", f"checkpoint.folder={shared}")
    first = start_run(first_dir, *items)
    first.send_signal(signal.SIGSTOP)  # still holding the lock, whatever the machine's load
    try:
        second = run_crucible("train", *settings(f"job.dump_folder={second_dir}", *items), env=ONE_THREAD,
                              check=False)
    finally:
        first.send_signal(signal.SIGCONT)
        rest, errors = first.communicate(timeout=600)
    assert second.returncode == 2, second.stderr
    lines = [l for l in second.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, lines
    assert f"{shared} is in use by another crucible train" in lines[0], lines
    assert f"host {socket.gethostname()}" in lines[0] and f"pid {first.pid}" in lines[0], lines
    assert "checkpoint.folder" in lines[0], lines
    assert second.stdout.count("step=") == 0  # it neither resumed nor trained

    assert first.returncode == 0, errors
    assert rest.splitlines()[-1].startswith("done steps=40 ")
    checkpoints = sorted(os.listdir(shared))
    assert checkpoints == ["latest", "step-20", "step-30", "step-40", "train.lock"], checkpoints
    assert (shared / "train.lock").read_text() == ""  # released at the end


def test_the_lock_of_a_killed_run_is_taken_over_and_said_so(tmp_path):
    run_dir = tmp_path / "run"
    first = start_run(run_dir, "training.steps=100000")
    first.send_signal(signal.SIGKILL)  # no clean-up: the kernel drops the flock, the record stays
    first.wait()
    record = json.loads((run_dir / "train.lock").read_text())
    assert record["pid"] == first.pid and record["host"] == socket.gethostname()

    proc = run_crucible("train", *settings(f"job.dump_folder={run_dir}", "training.steps=3"), env=ONE_THREAD)
    taken = [l for l in proc.stderr.splitlines() if "train.lock" in l]
    # One line for each lock it held: the run directory's and the checkpoint folder's.
    assert sorted(l.split()[3] for l in taken) == [str(run_dir / "ckpt" / "train.lock"),
                                                   str(run_dir / "train.lock")], proc.stderr
    assert all(f"pid {first.pid}" in l and "no longer running" in l for l in taken), proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("done steps=3 ")


def test_a_two_rank_job_refused_by_the_lock_exits_2_on_every_rank_at_once(tmp_path):
    run_dir = tmp_path / "run"
    first = start_run(run_dir, "training.steps=100000")
    try:
        args = ["mpirun", "-np", "2"] + sum((["-x", k] for k in MPI_ENV), []) + [crucible_binary(), "train"]
        args += settings(f"job.dump_folder={run_dir}", "training.steps=3", "comm.train_timeout_seconds=60")
        second = subprocess.run(args, capture_output=True, text=True, env=dict(os.environ, **MPI_ENV), timeout=50)
    finally:
        first.kill()
        first.wait()
    assert second.returncode == 2, second.stderr
    errors = [l for l in second.stderr.splitlines() if l.startswith("crucible: error:")]
    assert any(f"pid {first.pid}" in e and str(run_dir) in e for e in errors), second.stderr
    assert len(errors) == 2, second.stderr  # rank 1 says why it stops too
