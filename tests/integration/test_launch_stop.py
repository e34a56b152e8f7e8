"""Stopping a job through `crucible launch` (docs/launch.md, "Stopping a job"): a stop signal to the
launcher reaches the ranks as SIGUSR1 (never as SIGTERM to mpirun, which kills the ranks about a
second later, in the middle of the checkpoint); the launcher waits for the job for a grace measured
from the save times the trainer reports, and exits 143 only when the checkpoint the trainer's
`stopped` line names is complete, else 75. A second SIGTERM kills at once (a second SIGUSR1 does
not); a SIGKILLed launcher leaves no process of the job behind. The Slurm side is in
test_launch_slurm.py."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CRUCIBLE = os.environ.get("CRUCIBLE", str(ROOT / "build" / "crucible"))
FAKE = str(ROOT / "tests" / "integration" / "launch" / "fake_trainer.py")
STOPPED = re.compile(r"^(?:\d+: )?stopped step=(\d+) signal=(\S+) checkpoint=(.*) exit=(\d+)$", re.M)
# 200 short steps with a constant LR; the signal lands near step 5, long before the end; the only
# checkpoint is the one the stop writes.
SETTINGS = ["model.flavor=debug", "training.seq_len=32", "training.local_batch_size=2",
            "training.global_batch_size=8", "training.steps=200", "metrics.peak_gflops=100",
            "lr_scheduler.warmup_steps=2", "lr_scheduler.decay_type=constant", "optimizer.lr=1e-3",
            "checkpoint.interval=1000"]


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "PBS_", "CRUCIBLE_", "OMPI_", "PMI"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    env.update(extra)
    return env


def train(run_dir, *extra):
    args = [CRUCIBLE, "train"]
    for item in SETTINGS + [f"job.dump_folder={run_dir}", *extra]:
        args += ["--set", item]
    return args


def start_launch(args, cmd, env=None):
    return subprocess.Popen([CRUCIBLE, "launch", *args, "--", *cmd], env=env or clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_until(proc, pattern):
    """Reads the launcher's stdout until a line matches; returns the lines read."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if re.search(pattern, line):
            return lines
    raise AssertionError(f"no line matched {pattern!r}: exit {proc.wait()}\n{''.join(lines)}"
                         f"{proc.stderr.read()}")


def attempts(run_dir):
    lines = (Path(run_dir) / "launch" / "attempts.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "attempt"]


def alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def processes():
    """(pid, parent pid, environment) of every process on this machine."""
    table = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        table.append((int(entry.name), parent, environ))
    return table


def job_processes(root_pid, run_dir):
    """Live descendants of root_pid, plus every process whose environment carries the run
    directory the launcher exports to the job (CRUCIBLE_RUN_DIR)."""
    table = processes()
    marker = f"CRUCIBLE_RUN_DIR={run_dir}".encode()
    found = {pid for pid, _, environ in table if marker in environ}
    frontier = {root_pid}
    while frontier:
        frontier = {pid for pid, parent, _ in table if parent in frontier and pid not in found}
        found |= frontier
    return {pid for pid in found if pid != root_pid and alive(pid)}


def wait_gone(pids, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def result(run_dir, stdout):
    losses = [(r["step"], r["loss"]) for r in map(json.loads, open(Path(run_dir) / "metrics.jsonl"))]
    return losses, re.search(r"weights_xxh3=([0-9a-f]+)", stdout).group(1)


@pytest.fixture(scope="module")
def complete_checkpoint(tmp_path_factory):
    """A real, complete checkpoint (crucible train, 2 steps)."""
    run_dir = tmp_path_factory.mktemp("ckpt") / "run"
    args = [CRUCIBLE, "train"]
    for item in ["model.flavor=debug", "training.seq_len=16", "training.steps=2", "checkpoint.interval=2",
                 "metrics.peak_gflops=100", f"job.dump_folder={run_dir}"]:
        args += ["--set", item]
    proc = subprocess.run(args, capture_output=True, text=True, env=clean_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    return run_dir / "ckpt" / "step-2"


def test_sigterm_through_the_launcher_checkpoints_and_resumes_bit_identical(tmp_path):
    """The issue's case: 2 Open MPI ranks (ZeRO-3) under crucible launch, SIGTERM to the launcher
    after a few steps. The checkpoint it names is complete, and resuming from it ends exactly
    where an uninterrupted run does."""
    straight = tmp_path / "straight"
    plain = subprocess.run(train(straight), capture_output=True, text=True, env=clean_env(), timeout=600)
    assert plain.returncode == 0, plain.stderr
    run_dir = tmp_path / "run"
    zero3 = "parallelism.zero_stage=3"
    proc = start_launch(["--run-dir", str(run_dir), "--np", "2", "--mpi", "openmpi"], train(run_dir, zero3))
    read_until(proc, r"^0: step=5 ")
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    stop_seconds = time.monotonic() - signalled
    print(f"SIGTERM to the launcher -> exit {proc.returncode} after {stop_seconds:.2f} s")
    assert proc.returncode == 143, out + err
    stopped = STOPPED.search(out)
    assert stopped and stopped.group(2) == "SIGUSR1", out  # what the ranks were sent
    step, checkpoint = int(stopped.group(1)), Path(stopped.group(3))
    assert checkpoint == run_dir / "ckpt" / f"step-{step}" and (checkpoint / "COMPLETE").exists()
    assert not list((run_dir / "ckpt").glob(".tmp-*"))
    record = attempts(run_dir)[0]
    assert record["exit_code"] == 143 and record["signal"] == signal.SIGTERM
    assert record["stopped_checkpoint"] == str(checkpoint) and record["stop_problem"] == ""
    assert record["action"] == "stop" and record["stop_grace_s"] >= 1

    resumed = subprocess.run([CRUCIBLE, "launch", "--run-dir", str(run_dir), "--np", "2", "--mpi", "openmpi",
                              "--", *train(run_dir, zero3)], capture_output=True, text=True, env=clean_env(),
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert f"0: phase=resume from={checkpoint} step={step} " in resumed.stdout
    assert result(run_dir, resumed.stdout) == result(straight, plain.stdout)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1])
def test_a_stop_without_a_checkpoint_exits_75_and_is_not_retried(tmp_path, sig):
    run_dir = tmp_path / "run"
    proc = start_launch(["--run-dir", str(run_dir), "--np", "2", "--retries", "3"],
                        [sys.executable, FAKE, "--steps", "100000", "--step-seconds", "0.05",
                         "--state", str(tmp_path / "state")])
    read_until(proc, r"^0: step=3 ")
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err
    assert "0: phase=stop signal=SIGUSR1" in out
    records = attempts(run_dir)
    assert len(records) == 1 and records[0]["signal"] == sig and records[0]["exit_code"] == 75
    assert "checkpoint=none" in records[0]["stop_problem"], records[0]
    assert "exit 75" in err and records[0]["stop_problem"] in err


@pytest.mark.parametrize("damage,problem", [
    (None, ""),
    ("missing", "not a folder"),
    ("no COMPLETE", "COMPLETE is missing"),
    ("truncated model", "model.safetensors: "),
    ("edited MANIFEST", "MANIFEST: checksum"),
])
def test_exit_is_143_only_when_the_named_checkpoint_is_complete(tmp_path, complete_checkpoint, damage, problem):
    checkpoint = tmp_path / "ckpt" / "step-7"
    shutil.copytree(complete_checkpoint, checkpoint)
    if damage == "missing":
        shutil.rmtree(checkpoint)
    elif damage == "no COMPLETE":
        (checkpoint / "COMPLETE").unlink()
    elif damage == "truncated model":
        with open(checkpoint / "model.safetensors", "r+b") as f:
            f.truncate(1000)
    elif damage == "edited MANIFEST":
        with open(checkpoint / "MANIFEST", "a") as f:
            f.write("# edited\n")
    run_dir = tmp_path / "run"
    proc = start_launch(["--run-dir", str(run_dir), "--np", "2"],
                        [sys.executable, FAKE, "--steps", "100000", "--step-seconds", "0.05",
                         "--state", str(tmp_path / "state"), "--stop-checkpoint", str(checkpoint)])
    read_until(proc, r"^0: step=3 ")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    record = attempts(run_dir)[0]
    assert record["stopped_checkpoint"] == str(checkpoint)
    if damage is None:
        assert proc.returncode == 143, err
        assert record["exit_code"] == 143 and record["stop_problem"] == ""
    else:
        assert proc.returncode == 75, err
        assert record["exit_code"] == 75 and record["job_exit_code"] == 143
        assert problem in record["stop_problem"], record["stop_problem"]
        assert str(checkpoint) in record["stop_problem"]


def test_the_stop_waits_past_kill_grace_for_a_slow_save(tmp_path, complete_checkpoint):
    # The stop takes 4 s (a save); --kill-grace 1 is only the least the launcher waits.
    run_dir = tmp_path / "run"
    proc = start_launch(["--run-dir", str(run_dir), "--np", "2", "--kill-grace", "1"],
                        [sys.executable, FAKE, "--steps", "100000", "--step-seconds", "0.05",
                         "--state", str(tmp_path / "state"), "--stop-seconds", "4",
                         "--stop-checkpoint", str(complete_checkpoint)])
    read_until(proc, r"^0: step=3 ")
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, out + err
    assert time.monotonic() - signalled >= 4
    assert STOPPED.search(out)


def test_a_stop_longer_than_the_measured_grace_is_killed_and_exits_75(tmp_path):
    # Saves reported at 0.5 s, steps of 0.05 s: the grace is 3 x (0.55 + 0.5) + 10 s (at least,
    # for the gap between step lines that a save adds); a stop that hangs for 300 s is cut there.
    run_dir = tmp_path / "run"
    proc = start_launch(["--run-dir", str(run_dir), "--np", "2"],
                        [sys.executable, FAKE, "--steps", "100000", "--step-seconds", "0.05",
                         "--state", str(tmp_path / "state"), "--save-every", "2", "--save-seconds", "0.5",
                         "--stop-seconds", "300"])
    read_until(proc, r"^0: step=6 ")
    job = job_processes(proc.pid, run_dir)
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=200)
    waited = time.monotonic() - signalled
    record = attempts(run_dir)[0]
    assert proc.returncode == 75, err
    assert 13 <= record["stop_grace_s"] <= 60, record
    assert record["stop_grace_s"] <= waited <= record["stop_grace_s"] + 15, (waited, record)
    assert "grace" in record["stop_problem"], record
    assert not wait_gone(job, 5)


def test_a_second_signal_kills_the_job_at_once(tmp_path):
    run_dir = tmp_path / "run"
    proc = start_launch(["--run-dir", str(run_dir), "--np", "2"],
                        [sys.executable, FAKE, "--steps", "100000", "--step-seconds", "0.05",
                         "--state", str(tmp_path / "state"), "--stop-seconds", "300"])
    read_until(proc, r"^0: step=3 ")
    job = job_processes(proc.pid, run_dir)
    proc.send_signal(signal.SIGTERM)
    read_until(proc, r"^0: phase=stop signal=SIGUSR1")
    second = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 75, err
    assert time.monotonic() - second < 10
    assert not wait_gone(job, 5)


def test_a_repeated_sigusr1_to_the_launcher_changes_nothing(tmp_path, complete_checkpoint):
    # A scheduler's warning may come twice; only a second SIGTERM, SIGINT or SIGHUP kills at once.
    run_dir = tmp_path / "run"
    proc = start_launch(["--run-dir", str(run_dir), "--np", "2"],
                        [sys.executable, FAKE, "--steps", "100000", "--step-seconds", "0.05",
                         "--state", str(tmp_path / "state"), "--stop-seconds", "3",
                         "--stop-checkpoint", str(complete_checkpoint)])
    read_until(proc, r"^0: step=3 ")
    proc.send_signal(signal.SIGUSR1)
    read_until(proc, r"^0: phase=stop signal=SIGUSR1")
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, out + err
    assert STOPPED.search(out)
    assert attempts(run_dir)[0]["signal"] == signal.SIGUSR1


def test_a_stop_during_the_preflight_blames_no_node_and_starts_no_attempt(tmp_path):
    run_dir = tmp_path / "run"
    check = tmp_path / "slow_check.sh"
    check.write_text("#!/bin/sh\nexec sleep 60\n")
    check.chmod(0o755)
    proc = start_launch(["--run-dir", str(run_dir), "--preflight", "--preflight-command", str(check)],
                        [sys.executable, FAKE, "--steps", "3"])
    deadline = time.monotonic() + 60
    while not any(Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"sleep\0")
                  for p in job_processes(proc.pid, run_dir) if alive(p)):
        assert time.monotonic() < deadline and proc.poll() is None, "the health check never started"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 75, err
    assert "stopped by signal 15 before attempt 1" in err
    assert not (run_dir / "launch" / "bad_nodes.txt").exists()
    lines = (run_dir / "launch" / "attempts.jsonl").read_text().splitlines()
    assert all(json.loads(line)["kind"] == "preflight" for line in lines)


@pytest.mark.parametrize("mpi", ["openmpi", "mpich", "none"])
def test_a_sigkilled_launcher_leaves_no_process_of_the_job(tmp_path, mpi):
    # Ranks that print nothing after the kill (as in a long save, eval or collective): a rank
    # that writes would die of the broken pipe anyway.
    run_dir = tmp_path / "run"
    np = "1" if mpi == "none" else "2"
    proc = start_launch(["--run-dir", str(run_dir), "--np", np, "--mpi", mpi],
                        ["sh", "-c", "echo step=3 rank=$CRUCIBLE_RANK; exec sleep 1000"])
    read_until(proc, r"^(0: )?step=3 ")
    deadline = time.monotonic() + 30
    while len(job := job_processes(proc.pid, run_dir)) < int(np) + (mpi != "none"):
        assert time.monotonic() < deadline, job  # mpirun/mpiexec (and Hydra's proxy) and the ranks
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    left = wait_gone(job, 15)
    assert not left, [Path(f"/proc/{p}/cmdline").read_bytes() for p in left if alive(p)]
    assert not job_processes(proc.pid, run_dir)
