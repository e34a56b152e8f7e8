"""Checkpoints end to end: bit-exact resume after SIGKILL / SIGTERM (sync and async saves),
corruption detected and survived, disk full, config changes on resume, the "auto" interval.

Every run uses the debug flavor with a small seq_len and OMP_NUM_THREADS=1 (results do not depend
on the thread count; one thread is fastest on a shared 2-core machine)."""
import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import crucible_binary

STEPS = 40
BASE = ["--set", "model.flavor=debug", "--set", "training.seq_len=32",
        "--set", "training.local_batch_size=2", "--set", f"training.steps={STEPS}",
        "--set", "metrics.peak_gflops=100", "--set", "checkpoint.interval=10",
        "--set", "checkpoint.keep_latest_k=0"]
ENV = dict(os.environ, OMP_NUM_THREADS="1")
RNG_SEED = int(os.environ.get("CRUCIBLE_TEST_SEED", time.time_ns() % 100000))
print(f"test_checkpoint: random kill steps drawn with CRUCIBLE_TEST_SEED={RNG_SEED}")


def train_args(run_dir, *extra):
    return [crucible_binary(), "train", *BASE, "--set", f"job.dump_folder={run_dir}", *extra]


def run(run_dir, *extra, preexec_fn=None, timeout=300):
    return subprocess.run(train_args(run_dir, *extra), capture_output=True, text=True, env=ENV,
                          timeout=timeout, preexec_fn=preexec_fn)


def losses(run_dir):
    return {r["step"]: r["loss"] for r in map(json.loads, open(Path(run_dir) / "metrics.jsonl"))}


def weights_hash(stdout):
    match = re.search(r"^done .*weights_xxh3=([0-9a-f]+)", stdout, re.M)
    assert match, stdout
    return match.group(1)


def resumed_from(stdout):
    match = re.search(r"^phase=resume from=(\S+) step=(\d+)", stdout, re.M)
    return (Path(match.group(1)).name, int(match.group(2))) if match else None


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """One uninterrupted 40-step run: the reference losses, weights hash and checkpoints."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    proc = run(run_dir)
    assert proc.returncode == 0, proc.stderr
    return {"dir": run_dir, "losses": losses(run_dir), "hash": weights_hash(proc.stdout)}


def assert_identical_to_straight(run_dir, stdout, straight):
    got = losses(run_dir)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert got == straight["losses"], "losses differ from the uninterrupted run"
    assert weights_hash(stdout) == straight["hash"]


def start_and_wait(run_dir, extra, kill_step):
    """Starts training; returns the process once it printed step=kill_step and at least one
    checkpoint is complete (so the kill lands after the first checkpoint)."""
    proc = subprocess.Popen(train_args(run_dir, *extra), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)
    seen_complete, step = False, 0
    for line in proc.stdout:
        seen_complete = seen_complete or "status=complete" in line
        if line.startswith("step="):
            step = int(line.split()[0].split("=")[1])
        if seen_complete and step >= kill_step:
            return proc, step
    raise AssertionError(f"run ended before step {kill_step}: {proc.wait()} {proc.stderr.read()}")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_sigkill_then_resume_is_bit_exact(tmp_path, straight, mode):
    kill_step = random.Random(RNG_SEED + len(mode)).randint(11, STEPS - 2)
    run_dir = tmp_path / "run"
    extra = ["--set", f"checkpoint.async={'true' if mode == 'async' else 'false'}"]
    proc, step = start_and_wait(run_dir, extra, kill_step)
    proc.kill()
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    resumed = run(run_dir, *extra)
    assert resumed.returncode == 0, resumed.stderr
    name, resume_step = resumed_from(resumed.stdout)
    assert 10 <= resume_step <= step and resume_step % 10 == 0, (kill_step, step, name)
    assert_identical_to_straight(run_dir, resumed.stdout, straight)


@pytest.mark.parametrize("mode,sig", [("sync", signal.SIGTERM), ("async", signal.SIGTERM),
                                      ("async", signal.SIGUSR1)])
def test_stop_signal_checkpoints_exits_143_and_resumes_bit_exact(tmp_path, straight, mode, sig):
    kill_step = random.Random(RNG_SEED + sig).randint(11, STEPS - 2)
    run_dir = tmp_path / "run"
    extra = ["--set", f"checkpoint.async={'true' if mode == 'async' else 'false'}"]
    proc, _ = start_and_wait(run_dir, extra, kill_step)
    proc.send_signal(sig)
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    stopped = re.search(r"^stopped step=(\d+) signal=(\S+)", rest, re.M)
    assert stopped, rest
    stop_step = int(stopped.group(1))
    assert (run_dir / "ckpt" / f"step-{stop_step}" / "COMPLETE").exists()
    assert (run_dir / "ckpt" / "latest").read_text().strip() == f"step-{stop_step}"
    resumed = run(run_dir, *extra)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed_from(resumed.stdout)[1] == stop_step
    assert_identical_to_straight(run_dir, resumed.stdout, straight)


def test_second_sigterm_exits_at_once_without_a_complete_checkpoint(tmp_path):
    # Long steps (seq_len 1024, batch 16: seconds each) so the second signal surely lands inside
    # the step that the first one asked to finish.
    run_dir = tmp_path / "run"
    slow = ["--set", "training.seq_len=1024", "--set", "training.local_batch_size=16",
            "--set", "checkpoint.interval=1"]
    proc = subprocess.Popen(train_args(run_dir, *slow), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=ENV)
    for line in proc.stdout:  # the first step and its checkpoint are done
        if "status=complete" in line:
            break
    proc.send_signal(signal.SIGTERM)
    for line in proc.stderr:  # the handler has taken the first signal
        if "stop requested" in line:
            break
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGTERM, out
    assert "stopped step=" not in out
    ckpt = run_dir / "ckpt"
    # Every folder named step-<n> is complete; a save cut short would only have a .tmp- name.
    for folder in ckpt.glob("step-*"):
        assert (folder / "COMPLETE").exists(), folder
    assert (ckpt / "step-1" / "COMPLETE").exists()


def corrupt_and_resume(tmp_path, straight, corrupt):
    """Copies the straight run, damages its newest checkpoint (step-40), resumes."""
    run_dir = tmp_path / "run"
    shutil.copytree(straight["dir"], run_dir)
    corrupt(run_dir / "ckpt")
    proc = run(run_dir)
    assert proc.returncode == 0, proc.stderr
    return run_dir, proc


def test_truncated_file_is_named_and_resume_falls_back(tmp_path, straight):
    def truncate(ckpt):
        path = ckpt / "step-40" / "model.safetensors"
        os.truncate(path, path.stat().st_size // 2)
    run_dir, proc = corrupt_and_resume(tmp_path, straight, truncate)
    assert re.search(r"step-40 is unusable: model\.safetensors: \d+ bytes, MANIFEST says", proc.stderr)
    assert resumed_from(proc.stdout) == ("step-30", 30)
    assert_identical_to_straight(run_dir, proc.stdout, straight)
    # The damaged checkpoint is kept as evidence, moved aside when step 40 was saved again.
    assert (run_dir / "ckpt" / "step-40.replaced-1" / "model.safetensors").exists()


def test_flipped_byte_is_named_and_resume_falls_back(tmp_path, straight):
    def flip(ckpt):
        path = ckpt / "step-40" / "optimizer.safetensors"
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    run_dir, proc = corrupt_and_resume(tmp_path, straight, flip)
    assert "step-40 is unusable: optimizer.safetensors: checksum" in proc.stderr
    assert resumed_from(proc.stdout) == ("step-30", 30)
    assert_identical_to_straight(run_dir, proc.stdout, straight)


def test_missing_complete_is_named_and_resume_falls_back(tmp_path, straight):
    run_dir, proc = corrupt_and_resume(tmp_path, straight,
                                       lambda ckpt: (ckpt / "step-40" / "COMPLETE").unlink())
    assert "step-40 is unusable: COMPLETE is missing" in proc.stderr
    assert resumed_from(proc.stdout) == ("step-30", 30)
    assert_identical_to_straight(run_dir, proc.stdout, straight)


def test_missing_latest_is_named_and_the_newest_good_checkpoint_is_used(tmp_path, straight):
    def two_faults(ckpt):  # no `latest`, and the newest checkpoint damaged as well
        (ckpt / "latest").unlink()
        (ckpt / "step-40" / "state.json").write_text("{}")
    run_dir, proc = corrupt_and_resume(tmp_path, straight, two_faults)
    assert re.search(r"ckpt/latest is missing", proc.stderr)
    assert "step-40 is unusable: state.json:" in proc.stderr
    assert resumed_from(proc.stdout) == ("step-30", 30)
    assert_identical_to_straight(run_dir, proc.stdout, straight)


def test_no_verifiable_checkpoint_is_an_error_that_deletes_nothing(tmp_path, straight):
    run_dir = tmp_path / "run"
    shutil.copytree(straight["dir"], run_dir)
    for folder in (run_dir / "ckpt").glob("step-*"):
        (folder / "COMPLETE").unlink()
    proc = run(run_dir)
    assert proc.returncode == 65
    assert "none of the 4 checkpoints verifies" in proc.stderr
    assert len(list((run_dir / "ckpt").glob("step-*"))) == 4


def try_mount_tmpfs(path, size):
    path.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                            capture_output=True, text=True)
    return result.returncode == 0


@pytest.mark.parametrize("how", ["tmpfs", "file_size_limit"])
def test_disk_full_keeps_the_previous_checkpoint_and_exits_74(tmp_path, straight, how):
    mount = tmp_path / "small"
    if how == "tmpfs":
        if not try_mount_tmpfs(mount, "16m"):
            pytest.skip("mounting a tmpfs is not permitted here; the file-size-limit case covers it")
        # 16 MiB: the step-10 checkpoint (10.7 MB) fits, step 20's does not.
        try:
            run_dir = mount / "run"
            proc = run(run_dir)
            shutil.copytree(run_dir, tmp_path / "copy")
        finally:
            subprocess.run(["umount", str(mount)], check=False)
        expected_error, kept = "No space left on device", "step-10"
    else:
        # A 5 MB file-size limit (optimizer.safetensors is 7.1 MB). The trainer ignores SIGXFSZ,
        # so the write fails with EFBIG instead of the signal killing the process.
        run_dir = tmp_path / "copy"
        shutil.copytree(straight["dir"], run_dir)
        for step in (20, 30, 40):
            shutil.rmtree(run_dir / "ckpt" / f"step-{step}")
        (run_dir / "ckpt" / "latest").write_text("step-10\n")
        limit = 5 * 1000 * 1000
        proc = run(run_dir, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
        expected_error, kept = "File too large", "step-10"
    assert proc.returncode == 74, (proc.returncode, proc.stderr)
    assert expected_error in proc.stderr and "step-20 was not saved" in proc.stderr, proc.stderr
    assert f"the previous checkpoint is intact (latest: {kept})" in proc.stderr
    copy = tmp_path / "copy"
    assert (copy / "ckpt" / "latest").read_text().strip() == kept
    assert not (copy / "ckpt" / "step-20").exists()
    assert not list((copy / "ckpt").glob(".tmp-*")), "the failed save left its temporary folder"
    # The kept checkpoint is intact: resuming from it reproduces the uninterrupted run.
    resumed = run(copy)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed_from(resumed.stdout) == (kept, 10)
    assert_identical_to_straight(copy, resumed.stdout, straight)


def test_config_change_that_breaks_resume_is_a_clear_error(tmp_path, straight):
    run_dir = tmp_path / "run"
    shutil.copytree(straight["dir"], run_dir)
    proc = run(run_dir, "--set", "training.seq_len=64", "--set", "debug.seed=3",
               "--set", "metrics.log_freq=5")
    assert proc.returncode == 2
    assert "training.seq_len: 32 -> 64" in proc.stderr and "debug.seed: 0 -> 3" in proc.stderr
    assert "log_freq" not in proc.stderr.split("break resume:")[1]
    # The run's recorded config is still the one that can resume.
    assert "seq_len = 32" in (run_dir / "config.toml").read_text()


def test_harmless_config_change_is_allowed_and_listed(tmp_path, straight):
    run_dir = tmp_path / "run"
    shutil.copytree(straight["dir"], run_dir)
    shutil.rmtree(run_dir / "ckpt" / "step-40")
    proc = run(run_dir, "--set", "metrics.log_freq=5")
    assert proc.returncode == 0, proc.stderr
    assert "config changed (allowed): metrics.log_freq: 1 -> 5" in proc.stderr
    assert_identical_to_straight(run_dir, proc.stdout, straight)


def test_resume_none_and_explicit_path(tmp_path, straight):
    run_dir = tmp_path / "run"
    shutil.copytree(straight["dir"], run_dir)
    fresh = subprocess.run(train_args(run_dir, "--resume", "none"), capture_output=True, text=True, env=ENV)
    assert fresh.returncode == 0 and resumed_from(fresh.stdout) is None
    assert weights_hash(fresh.stdout) == straight["hash"]
    # step-40 existed: the fresh run's step 40 moved it aside instead of deleting it.
    assert (run_dir / "ckpt" / "step-40.replaced-1" / "COMPLETE").exists()
    explicit = subprocess.run(train_args(run_dir, "--resume", str(run_dir / "ckpt" / "step-20")),
                              capture_output=True, text=True, env=ENV)
    assert explicit.returncode == 0, explicit.stderr
    assert resumed_from(explicit.stdout) == ("step-20", 20)
    assert_identical_to_straight(run_dir, explicit.stdout, straight)
    (run_dir / "ckpt" / "step-20" / "COMPLETE").unlink()
    bad = subprocess.run(train_args(run_dir, "--resume", str(run_dir / "ckpt" / "step-20")),
                         capture_output=True, text=True, env=ENV)
    assert bad.returncode == 65 and "COMPLETE is missing" in bad.stderr


def test_retention_keeps_latest_k_and_every_n(tmp_path):
    run_dir = tmp_path / "run"
    proc = run(run_dir, "--set", "checkpoint.interval=5", "--set", "checkpoint.keep_latest_k=2",
               "--set", "checkpoint.keep_every_n=20", "--set", "training.steps=30")
    assert proc.returncode == 0, proc.stderr
    kept = sorted(int(p.name[5:]) for p in (run_dir / "ckpt").glob("step-*"))
    assert kept == [20, 25, 30]


def test_auto_interval_uses_young_daly_and_attempts_evidence(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "launch").mkdir(parents=True)
    # Two failures in 36 s of attempts: MTBF 18 s.
    attempts = [{"attempt": 1, "wall_s": 12.0, "exit_code": 1},
                {"attempt": 2, "wall_s": 20.0, "exit_code": 74},
                {"attempt": 3, "wall_s": 4.0, "exit_code": 143}]
    (run_dir / "launch" / "attempts.jsonl").write_text("".join(json.dumps(a) + "\n" for a in attempts))
    proc = run(run_dir, "--set", "checkpoint.interval=auto", "--set", "training.steps=30")
    assert proc.returncode == 0, proc.stderr
    lines = [dict(kv.split("=", 1) for kv in line.split()) for line in proc.stdout.splitlines()
             if line.startswith("phase=checkpoint_interval")]
    assert lines and lines[0]["cost_source"] == "assumed"
    assert lines[0]["mtbf_source"].startswith("attempts.jsonl(failures=2")
    assert abs(float(lines[0]["mtbf_h"]) - 18 / 3600) < 1e-4
    for fields in lines:
        cost, mtbf_s = float(fields["cost_s"]), float(fields["mtbf_h"]) * 3600
        assert abs(float(fields["interval_s"]) / (2 * cost * mtbf_s) ** 0.5 - 1) < 1e-3
    assert any(f["cost_source"] == "measured" for f in lines), "interval not revised after a save"
    saves = re.findall(r"^phase=checkpoint step=(\d+) mode=\w+ reason=interval", proc.stdout, re.M)
    assert saves, proc.stdout


def writer_record(pid, **override):
    """The WRITER record crucible keeps in a temporary checkpoint folder, for process `pid`."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = {"host": os.uname().nodename,
              "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
              "pid_namespace": os.readlink("/proc/self/ns/pid"), "pid": str(pid),
              "start_time": stat[stat.rindex(")") + 2:].split()[19]}
    fields.update(override)
    return "".join(f"{k}={v}\n" for k, v in fields.items())


def test_temporary_folders_of_killed_saves_are_removed_at_the_next_save(tmp_path):
    """A save killed part way leaves ckpt/.tmp-step-<n>.<pid>/ (as large as a checkpoint); the next
    save removes it when its writer ran on this host and is gone, and keeps it when the writer
    may be alive (a running process, another host)."""
    run_dir = tmp_path / "run"
    ckpt = run_dir / "ckpt"
    dead = subprocess.Popen(["sleep", "600"])
    dead_record = writer_record(dead.pid)
    dead.kill()
    dead.wait()
    live = subprocess.Popen(["sleep", "600"])
    try:
        folders = {"stale": (f".tmp-step-30.{dead.pid}", dead_record),
                   "live": (f".tmp-step-20.{live.pid}", writer_record(live.pid)),
                   "elsewhere": (".tmp-step-10.4242", writer_record(live.pid, host="node-17"))}
        for name, record in folders.values():
            (ckpt / name).mkdir(parents=True)
            (ckpt / name / "model.safetensors").write_bytes(b"\0" * 100000)
            (ckpt / name / "WRITER").write_text(record)
        proc = run(run_dir, "--set", "training.steps=10")
        assert proc.returncode == 0, proc.stderr
        removed = [l for l in proc.stderr.splitlines() if "removed stale temporary checkpoint folder" in l]
        assert len(removed) == 1 and f"{ckpt / folders['stale'][0]} (97.8 KiB): its writer, pid {dead.pid} " \
            in removed[0] and removed[0].endswith("is not running"), proc.stderr
        assert not (ckpt / folders["stale"][0]).exists()
        assert (ckpt / folders["live"][0] / "model.safetensors").exists()
        assert (ckpt / folders["elsewhere"][0] / "model.safetensors").exists()
        assert "written on host node-17" in proc.stderr
        assert not (ckpt / "step-10" / "WRITER").exists()
    finally:
        live.kill()
        live.wait()
