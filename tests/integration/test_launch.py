"""crucible launch with real processes on this machine: the hang watchdog, retries and backoff,
failover decisions that need no cluster, a faked PBS job, bad input. See docs/launch.md."""
import json
import os
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
OPENMPI_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
CPUS = len(os.sched_getaffinity(0))  # what a local job's ranks are checked against


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "PBS_", "CRUCIBLE_", "OMPI_", "PMI"))}
    env.update(OPENMPI_ROOT)
    env.update(extra)
    return env


def launch(args, cmd, env=None, timeout=120, **kw):
    return subprocess.run([CRUCIBLE, "launch", *args, "--", *cmd], env=env or clean_env(),
                          capture_output=True, text=True, timeout=timeout, **kw)


def attempts(run_dir):
    path = Path(run_dir) / "launch" / "attempts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()
            if json.loads(line).get("kind") == "attempt"]


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead; only its parent has not collected it yet.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def marked_processes(launch_id):
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"CRUCIBLE_LAUNCH_ID={launch_id}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def test_silent_rank_is_killed_within_timeout_and_nothing_survives(tmp_path):
    state = tmp_path / "state"
    timeout = 3.0
    proc = subprocess.Popen(
        [CRUCIBLE, "launch", "--run-dir", str(tmp_path / "run"), "--np", "2", "--timeout", str(timeout),
         "--", sys.executable, FAKE, "--steps", "1000", "--state", str(state), "--orphan",
         "--fail-rank", "1", "--fail-at-step", "4", "--fail-signal", "STOP"],
        env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    last_line = time.monotonic()
    for line in proc.stdout:  # the job's lines, live
        last_line = time.monotonic()
    proc.wait(timeout=60)
    ended = time.monotonic()
    stderr = proc.stderr.read()
    assert proc.returncode == 124, stderr
    assert ended - last_line <= timeout + 2.0, f"killed {ended - last_line:.2f} s after the last line"
    pids = [int(p.read_text()) for p in state.glob("pid-*")]
    orphans = [int(p.read_text()) for p in state.glob("orphan-*")]
    assert len(pids) == 2 and len(orphans) == 2
    assert not [pid for pid in pids + orphans if alive(pid)], "a process of the job survived"
    record = attempts(tmp_path / "run")[0]
    assert record["verdict"] == "hang" and record["timed_out"] and record["exit_code"] == 124
    assert not marked_processes(record["launch_id"])
    log = (tmp_path / "run" / "launch" / "attempt-1.log").read_text()
    assert [l for l in log.splitlines() if l.startswith("0: step=")][-1].startswith("0: step=3 ")


def test_output_passes_through_line_by_line_with_rank_labels(tmp_path):
    proc = launch(["--run-dir", str(tmp_path), "--np", "2"],
                  ["sh", "-c", 'echo "step=1 rank $CRUCIBLE_RANK of $WORLD_SIZE"; echo "to stderr" >&2'])
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["0: step=1 rank 0 of 2", "1: step=1 rank 1 of 2"]
    assert "0: to stderr" in proc.stderr and "1: to stderr" in proc.stderr
    assert "crucible-rank:" not in proc.stdout + proc.stderr  # announcements stay in the log
    log = (tmp_path / "launch" / "attempt-1.log").read_text()
    assert "crucible-rank: rank=1" in log


PIECES = str(ROOT / "tests" / "integration" / "launch" / "pieces.py")
PIECES_STDOUT = ["0: step=1 loss=2.5", "0: step=2 loss=2.0", "1: rank 1 ends without a newline",
                 "1: rank 1 says hello"]


# Open MPI's --tag-output and Hydra label every chunk a rank writes, not every line (seen on CI:
# a `stopped` line cut by a stray label); srun's lines are tested in test_launch_slurm.py.
@pytest.mark.parametrize("mpi", ["openmpi", "mpich"])
def test_a_line_written_in_pieces_passes_through_whole(tmp_path, mpi):
    if mpi == "mpich" and not (shutil.which("mpiexec.hydra") or shutil.which("mpiexec.mpich")):
        pytest.skip("MPICH's Hydra is not installed")
    proc = launch(["--run-dir", str(tmp_path), "--np", "2"], [sys.executable, PIECES],
                  env=clean_env(CRUCIBLE_MPI=mpi))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(proc.stdout.splitlines()) == PIECES_STDOUT, proc.stdout
    assert sorted(l for l in proc.stderr.splitlines() if l.startswith(("0: ", "1: "))) == [
        "0: warning: slow", "1: e1"], proc.stderr
    log = (tmp_path / "launch" / "attempt-1.log").read_text().splitlines()
    assert [l for l in log if l.startswith("0: step=")] == ["0: step=1 loss=2.5", "0: step=2 loss=2.0"]
    assert attempts(tmp_path)[0]["last_step"] == 2


def test_retries_back_off_then_succeed(tmp_path):
    base, cap = 0.4, 0.6
    proc = launch(["--run-dir", str(tmp_path / "run"), "--retries", "4", "--backoff-base", str(base),
                   "--backoff-cap", str(cap)],
                  [sys.executable, FAKE, "--steps", "3", "--fail-at-step", "2", "--fail-attempts", "3",
                   "--fail-code", "1"])
    assert proc.returncode == 0, proc.stderr
    records = attempts(tmp_path / "run")
    assert [r["exit_code"] for r in records] == [1, 1, 1, 0]
    assert [r["action"] for r in records] == ["retry", "retry", "retry", "done"]
    assert [r["backoff_seconds"] for r in records] == [0.4, 0.6, 0.6, 0.0]
    starts = [time.mktime(time.strptime(r["started"], "%Y-%m-%dT%H:%M:%S")) for r in records]
    log_times = [(tmp_path / "run" / "launch" / f"attempt-{k}.log").stat().st_mtime for k in (1, 2, 3, 4)]
    assert log_times == sorted(log_times)
    # Every attempt reached step 1 (two in a row without a step would be a config error).
    assert [r["first_step"] for r in records] == [1, 1, 1, 1]
    assert "summary" in proc.stderr


def test_retries_never_after_a_usage_or_data_error(tmp_path):
    for code in (2, 65):
        run_dir = tmp_path / f"run{code}"
        proc = launch(["--run-dir", str(run_dir), "--retries", "3", "--backoff-base", "0"],
                      [sys.executable, FAKE, "--exit", str(code)])
        assert proc.returncode == code
        assert len(attempts(run_dir)) == 1


def test_plain_retries_stop_at_a_config_error_verdict(tmp_path):
    # Without --auto-retry too: two attempts in a row that reach no step= line are a config error,
    # and a config error is never retried, so the action agrees with the verdict.
    run_dir = tmp_path / "run"
    proc = launch(["--run-dir", str(run_dir), "--retries", "3", "--backoff-base", "0"],
                  [sys.executable, FAKE, "--exit", "1"])
    assert proc.returncode == 1
    records = attempts(run_dir)
    assert [(r["verdict"], r["action"]) for r in records] == [("no_progress", "retry"),
                                                              ("config_error", "stop")]


def hostfile(tmp_path, *hosts):
    path = tmp_path / "hosts"
    path.write_text("".join(h + "\n" for h in hosts))
    return str(path)


def test_config_error_stops_after_two_attempts_without_touching_spares(tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(["--run-dir", str(run_dir), "--hostfile", hostfile(tmp_path, "localhost", "spare1"),
                   "--nodes", "1", "--auto-retry", "--backoff-base", "0.1"],
                  [sys.executable, FAKE, "--exit", "1"])
    assert proc.returncode == 1
    records = attempts(run_dir)
    assert [r["verdict"] for r in records] == ["no_progress", "config_error"]
    assert [r["action"] for r in records] == ["retry", "stop"]
    assert all(r["nodes"] == ["localhost"] and r["spares"] == ["spare1"] for r in records)
    assert not (run_dir / "launch" / "bad_nodes.txt").exists()


def test_usage_exit_is_a_config_error_at_once(tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(["--run-dir", str(run_dir), "--hostfile", hostfile(tmp_path, "localhost", "spare1"),
                   "--nodes", "1", "--auto-retry"], [sys.executable, FAKE, "--exit", "2"])
    assert proc.returncode == 2
    assert [r["verdict"] for r in attempts(run_dir)] == ["config_error"]


def test_disk_full_retries_in_place_without_blaming_a_node(tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(["--run-dir", str(run_dir), "--hostfile", hostfile(tmp_path, "localhost", "spare1"),
                   "--nodes", "1", "--auto-retry", "--backoff-base", "0.1"],
                  [sys.executable, FAKE, "--steps", "4", "--state", str(tmp_path / "state"),
                   "--fail-at-step", "3", "--fail-code", "74",
                   "--fail-message", "crucible: error: cannot write ckpt/step-3: No space left on device"])
    assert proc.returncode == 0, proc.stderr
    records = attempts(run_dir)
    assert [r["verdict"] for r in records] == ["disk_io", "success"]
    assert records[1]["nodes"] == ["localhost"] and records[1]["first_step"] == 3
    assert not (run_dir / "launch" / "bad_nodes.txt").exists()


def test_a_diverged_run_is_stopped_not_retried_and_blames_no_node(tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(["--run-dir", str(run_dir), "--auto-retry", "--backoff-base", "0"],
                  [sys.executable, FAKE, "--steps", "5", "--fail-at-step", "2", "--fail-code", "3"])
    assert proc.returncode == 3
    records = attempts(run_dir)
    assert len(records) == 1 and records[0]["verdict"] == "diverged", records
    assert records[0]["action"] == "stop" and records[0]["blamed_node"] == ""
    assert not (run_dir / "launch" / "bad_nodes.txt").exists()


def test_unknown_failure_with_one_node_and_no_spare_stops_with_a_summary(tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(["--run-dir", str(run_dir), "--auto-retry", "--backoff-base", "0"],
                  [sys.executable, FAKE, "--steps", "5", "--fail-at-step", "2", "--fail-code", "7"])
    assert proc.returncode == 7
    records = attempts(run_dir)
    assert len(records) == 1 and records[0]["verdict"] == "unknown"
    assert "no spares left" in records[0]["detail"]
    assert "summary" in proc.stderr and "unknown" in proc.stderr


def test_failure_evidence_is_the_error_line_not_the_mpirun_banner(tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(["--run-dir", str(run_dir), "--np", "2", "--mpi", "openmpi"],
                  [CRUCIBLE, "train", "--set", "model.flavor=debug", "--set", "data.no_such_key=1",
                   "--set", f"job.dump_folder={run_dir}"])
    assert proc.returncode == 2, proc.stderr
    assert "Primary job" in (run_dir / "launch" / "attempt-1.log").read_text()  # the banner is there
    record = attempts(run_dir)[0]
    assert record["verdict"] == "config_error"
    assert "unknown key 'data.no_such_key'" in record["evidence"], record["evidence"]


def test_pbs_job_from_a_faked_environment(tmp_path):
    nodefile = tmp_path / "PBS_NODEFILE"
    nodefile.write_text("localhost\nlocalhost\n")  # one host, two MPI slots
    env = clean_env(PBS_JOBID="4242.pbs01", PBS_NODEFILE=str(nodefile), PBS_O_WORKDIR=str(tmp_path))
    run_dir = tmp_path / "run"
    dry = launch(["--run-dir", str(run_dir), "--mpi", "openmpi", "--dry-run"], ["hostname"], env=env)
    assert dry.returncode == 0, dry.stderr
    assert "scheduler:   pbs job 4242.pbs01" in dry.stdout
    assert "ranks:       2 (2 per node)" in dry.stdout
    assert f"mpiexec --hostfile {run_dir}/launch/hostfile-1 --np 2 --map-by ppr:2:node" in dry.stdout
    proc = launch(["--run-dir", str(run_dir), "--mpi", "openmpi"],
                  [sys.executable, FAKE, "--steps", "2", "--state", str(tmp_path / "state")], env=env)
    assert proc.returncode == 0, proc.stderr
    record = attempts(run_dir)[0]
    assert record["scheduler"] == "pbs" and record["job_id"] == "4242.pbs01"
    assert record["argv"][0] == "mpiexec" and "--hostfile" in record["argv"]
    assert sorted(record["rank_nodes"]) == ["0", "1"]
    assert (run_dir / "launch" / "hostfile-1").read_text() == "localhost slots=2\n"
    assert "0: step=2" in proc.stdout


def test_dry_run_prints_command_and_environment_and_runs_nothing(tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(["--run-dir", str(run_dir), "--np", "2", "--dry-run"], ["echo", "it's"])
    assert proc.returncode == 0, proc.stderr
    assert "CRUCIBLE_RUN_DIR=" + str(run_dir) in proc.stdout
    assert "crucible-rank -- echo 'it'\\''s'" in proc.stdout
    assert "mpirun --np 2" in proc.stdout
    assert not run_dir.exists()


@pytest.mark.parametrize("args,cmd,message", [
    ([], [], "no command after '--'"),
    (["--no-such-option"], ["true"], "no-such-option"),
    (["--hostfile", "/nonexistent/hosts"], ["true"], "cannot read host file /nonexistent/hosts"),
    (["--nodes", "5"], ["true"], "5 node(s) needed, but the allocation"),
    (["--spares", "1"], ["true"], "--spares needs --auto-retry"),
    (["--timeout", "nan"], ["true"], "--timeout: nan is not a finite number"),
    (["--retries", "-1"], ["true"], "--retries: -1 is out of range"),
    (["--np", "0"], ["true"], "--np: 0 is out of range"),
    (["--mpi", "none", "--np", "2"], ["true"], "--mpi none runs the command once, without an MPI launcher"),
    (["--np", "100000"], ["true"], f"--np 100000 puts 100000 rank(s) on each of 1 node(s), more than the {CPUS}"),
    (["--ppn", str(CPUS + 1)], ["true"], f"--ppn {CPUS + 1} puts {CPUS + 1} rank(s) on each of 1 node(s)"),
])
def test_bad_input_is_a_clear_usage_error(tmp_path, args, cmd, message):
    proc = launch(["--run-dir", str(tmp_path / "run"), *args], cmd)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_more_ranks_than_cpus_are_refused_naming_both_unless_oversubscribed(tmp_path):
    proc = launch(["--run-dir", str(tmp_path / "run"), "--np", "100000"], ["true"])
    assert proc.returncode == 2 and f"this machine's {CPUS} CPUs" in proc.stderr, proc.stderr
    assert "--oversubscribe" in proc.stderr, proc.stderr
    dry = launch(["--run-dir", str(tmp_path / "run"), "--np", str(CPUS + 1), "--oversubscribe", "--dry-run"],
                 ["true"])
    assert dry.returncode == 0 and f"mpirun --np {CPUS + 1} " in dry.stdout, dry.stdout + dry.stderr


def test_no_mpi_chosen_by_the_environment_is_named_as_such(tmp_path):
    proc = launch(["--run-dir", str(tmp_path / "run"), "--np", "2"], ["true"], env=clean_env(CRUCIBLE_MPI="none"))
    assert proc.returncode == 2, proc.stderr
    assert "CRUCIBLE_MPI=none runs the command once, without an MPI launcher" in proc.stderr, proc.stderr
    assert "found on PATH" not in proc.stderr, proc.stderr


def test_invalid_regex_in_a_pattern_file_is_a_usage_error(tmp_path):
    patterns = tmp_path / "site_patterns.txt"
    patterns.write_text("# site patterns\nib-down   port (?<host>\\S+ link down\n")
    proc = launch(["--run-dir", str(tmp_path / "run"), "--bad-node-patterns", str(patterns)], ["true"])
    assert proc.returncode == 2
    assert f"{patterns}:2: invalid regex in pattern 'ib-down'" in proc.stderr
    env = clean_env(CRUCIBLE_BAD_NODE_PATTERNS=str(patterns))
    assert launch(["--run-dir", str(tmp_path / "run")], ["true"], env=env).returncode == 2


def test_preflight_blames_the_node_that_fails_and_keeps_the_job_off_it(tmp_path):
    run_dir = tmp_path / "run"
    check = tmp_path / "check.sh"
    check.write_text("#!/bin/sh\necho \"disk check failed on $CRUCIBLE_NODE\" >&2\nexit 1\n")
    check.chmod(0o755)
    proc = launch(["--run-dir", str(run_dir), "--preflight", "--preflight-command", str(check)],
                  [sys.executable, FAKE, "--steps", "1"])
    assert proc.returncode == 1
    lines = [json.loads(l) for l in (run_dir / "launch" / "attempts.jsonl").read_text().splitlines()]
    assert lines[0]["kind"] == "preflight" and "disk check failed" in lines[0]["failed"]["localhost"]
    assert not [l for l in lines if l["kind"] == "attempt"]  # no training attempt was spent
    ok = launch(["--run-dir", str(tmp_path / "ok"), "--preflight"], [sys.executable, FAKE, "--steps", "1"])
    assert ok.returncode == 0, ok.stderr
    assert "missing-program" in launch(["--run-dir", str(tmp_path / "missing"), "--preflight"],
                                       ["missing-program"]).stderr
