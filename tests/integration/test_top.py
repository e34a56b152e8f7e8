"""crucible top: the live view of a real running `crucible train`, driven inside tmux, and --once."""
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time

import pytest

from conftest import crucible_binary, run_crucible

SMALL = ["model.flavor=debug", "training.seq_len=16", "training.local_batch_size=2", "metrics.peak_gflops=100"]
STEPS = 200000  # far more than the test lets it run: the job is stopped at the end


def settings(*items):
    return sum((["--set", item] for item in (*SMALL, *items)), [])


def last_step(run_dir):
    """The last whole step line of metrics.jsonl."""
    step = None
    with open(run_dir / "metrics.jsonl") as f:
        for line in f:
            if line.endswith("\n"):
                step = json.loads(line)["step"]
    return step


def wait_for(predicate, what, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def running_job(tmp_path):
    """A crucible train of a tiny model running in the background, past its first checkpoint."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([crucible_binary(), "train", *settings(f"job.dump_folder={run_dir}",
                                                                    f"training.steps={STEPS}",
                                                                    "checkpoint.interval=20",
                                                                    "checkpoint.async=false")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        wait_for(lambda: (run_dir / "ckpt" / "latest").exists() or proc.poll() is not None,
                 "the first checkpoint", timeout=60)
        assert proc.poll() is None, proc.stderr.read()
        yield run_dir, proc
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()


class Tmux:
    """A private tmux server (its own socket) with one 120x40 session running `command`."""

    def __init__(self, socket_path, command):
        self.base = ["tmux", "-u", "-S", str(socket_path)]
        subprocess.run([*self.base, "new-session", "-d", "-x", "120", "-y", "40", "-s", "top", command],
                       check=True, env=dict(os.environ, LANG="C.UTF-8", LC_ALL="C.UTF-8"))

    def capture(self):
        proc = subprocess.run([*self.base, "capture-pane", "-p", "-t", "top"], capture_output=True, text=True)
        return proc.stdout if proc.returncode == 0 else ""

    def keys(self, *keys):
        subprocess.run([*self.base, "send-keys", "-t", "top", *keys], check=True)

    def close(self):
        subprocess.run([*self.base, "kill-server"], capture_output=True)


def shown_step(screen):
    match = re.search(r"^step\s+(\d+) / (\d+)", screen, re.M)
    return (int(match.group(1)), int(match.group(2))) if match else None


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_top_shows_the_current_step_of_a_running_job_updates_and_quits_on_q(running_job, tmp_path):
    run_dir, job = running_job
    exit_file = tmp_path / "top.exit"
    command = (f"{shlex.quote(crucible_binary())} top {shlex.quote(str(run_dir))} --interval 0.2 "
               f"--stall-seconds 1.5; echo $? > {shlex.quote(str(exit_file))}")
    tmux = Tmux(tmp_path / "tmux.sock", command)
    try:
        # Frozen job: the view settles on exactly the last step line, then calls it stalled.
        job.send_signal(signal.SIGSTOP)
        time.sleep(0.3)  # a line being written when the job stopped is finished by now, or never
        frozen = last_step(run_dir)
        screen = wait_for(lambda: (s := tmux.capture()) and "STALLED" in s and s, "the stall to show")
        assert shown_step(screen) == (frozen, STEPS), screen
        assert re.search(r"^stalled for\s+\d", screen, re.M), screen
        assert re.search(r"^checkpoint\s+step \d+, ", screen, re.M), screen
        assert re.search(r"^tokens/s\s+\d", screen, re.M), screen
        assert re.search(r"^ETA\s+\S", screen, re.M), screen
        assert "crucible top  crucible  " in screen, screen  # job.name's default
        assert re.search("[▁▂▃▄▅▆▇█]{5}", screen), screen  # the loss sparkline

        # Running again: the shown step moves past the frozen one, and the stall clears.
        job.send_signal(signal.SIGCONT)
        later = wait_for(lambda: (s := tmux.capture()) and (shown := shown_step(s)) and shown[0] > frozen
                         and "STALLED" not in s and shown[0], "the shown step to increase")
        assert later <= last_step(run_dir)
        even_later = wait_for(lambda: (shown := shown_step(tmux.capture())) and shown[0] > later and shown[0],
                              "the shown step to increase again")
        assert even_later <= last_step(run_dir)

        tmux.keys("q")
        assert wait_for(lambda: exit_file.exists() and exit_file.read_text().strip(),
                        "crucible top to exit on q", timeout=10) == "0"
    finally:
        tmux.close()


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_top_waits_for_a_run_that_has_not_started_and_ctrl_c_quits(tmp_path):
    run_dir = tmp_path / "later"
    exit_file = tmp_path / "top.exit"
    command = (f"{shlex.quote(crucible_binary())} top {shlex.quote(str(run_dir))} --interval 0.1; "
               f"echo $? > {shlex.quote(str(exit_file))}")
    tmux = Tmux(tmp_path / "tmux.sock", command)
    try:
        wait_for(lambda: f"waiting for the run directory {run_dir}" in tmux.capture(), "the waiting line")
        run_dir.mkdir()
        wait_for(lambda: "waiting for metrics.jsonl" in tmux.capture(), "the wait for metrics.jsonl")
        (run_dir / "metrics.jsonl").write_text('{"step": 7, "loss": 2.5, "tok_per_s": 10, "step_seconds": 0.1}\n'
                                               '{"step": 8, "lo')  # a half-written line: not shown
        # No config.toml yet: training.steps is unknown.
        screen = wait_for(lambda: (s := tmux.capture()) and re.search(r"^step\s+7 / \?", s, re.M) and s,
                          "the step from metrics.jsonl")
        assert "config.toml not written yet" in screen, screen
        tmux.keys("C-c")
        assert wait_for(lambda: exit_file.exists() and exit_file.read_text().strip(),
                        "crucible top to exit on Ctrl-C", timeout=10) == "0"
    finally:
        tmux.close()


def test_top_once_prints_one_plain_frame_of_the_run(running_job):
    run_dir, job = running_job
    job.send_signal(signal.SIGSTOP)
    time.sleep(0.3)
    proc = run_crucible("top", run_dir, "--once", "--width", "100")
    step = last_step(run_dir)
    lines = proc.stdout.splitlines()
    assert lines[0] == f"crucible top  crucible  {run_dir}", proc.stdout
    assert f"step         {step} / {STEPS}" in proc.stdout, proc.stdout
    assert "attempt      - (not started by crucible launch)" in proc.stdout, proc.stdout
    assert "\x1b" not in proc.stdout  # plain text, no terminal control
    assert all(len(line) <= 100 for line in lines), proc.stdout
    assert proc.stderr == ""


def test_top_once_names_a_run_that_does_not_exist_or_has_no_metrics_yet(tmp_path):
    missing = tmp_path / "nope"
    proc = run_crucible("top", missing, "--once", check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and str(missing) in lines[0] and "no such run directory" in lines[0], lines

    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_crucible("top", empty, "--once", check=False)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and f"{empty}/metrics.jsonl does not exist yet" in lines[0], lines


def test_top_live_view_needs_a_terminal(tmp_path):
    proc = run_crucible("top", tmp_path, check=False)  # stdout is a pipe here
    assert proc.returncode == 2
    assert "use --once" in proc.stderr
