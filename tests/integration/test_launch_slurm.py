"""crucible launch on a real Slurm cluster: one slurmctld and four slurmd daemons (n1..n4) on this
machine, started and stopped by this module (tests/integration/slurm/). Skipped only when the
machine cannot run Slurm at all (packages missing or not root), with the reason."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CRUCIBLE = os.environ.get("CRUCIBLE", str(ROOT / "build" / "crucible"))
FAKE = str(ROOT / "tests" / "integration" / "launch" / "fake_trainer.py")
SLURM = ROOT / "tests" / "integration" / "slurm"


def attempts(run_dir):
    lines = (Path(run_dir) / "launch" / "attempts.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "attempt"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    folder = tmp_path_factory.mktemp("slurm")
    start = subprocess.run([str(SLURM / "start-cluster.sh"), str(folder), "4"], capture_output=True,
                           text=True, timeout=120)
    if start.returncode == 3:
        subprocess.run([str(SLURM / "stop-cluster.sh"), str(folder)], timeout=60)
        pytest.skip(start.stderr.strip())
    try:
        assert start.returncode == 0, start.stderr + "".join(
            p.read_text()[-2000:] for p in (folder / "log").glob("*.log"))
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLURM_", "PBS_", "CRUCIBLE_", "OMPI_", "PMI"))}
        env.update(SLURM_CONF=start.stdout.strip(), OMPI_ALLOW_RUN_AS_ROOT="1",
                   OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", CRUCIBLE_MPI="none")
        yield folder, env
    finally:
        subprocess.run([str(SLURM / "stop-cluster.sh"), str(folder)], timeout=60)
        for pid_file in (folder / "pids").glob("*.pid"):
            pid = int(pid_file.read_text().strip() or 0)
            assert not pid or not Path(f"/proc/{pid}").exists(), f"{pid_file.name} still running"


@pytest.fixture(scope="module")
def walltime_job(cluster):
    """Submitted first, so its minute of wall time runs while the other tests do."""
    folder, env = cluster
    work = folder / "walltime"
    work.mkdir()
    script = work / "job.sh"
    script.write_text(f"""#!/bin/bash
#SBATCH -N 1 -t 1 -o {work}/slurm-%j.out
exec {CRUCIBLE} launch --run-dir {work}/run --resubmit -- \\
    {sys.executable} {FAKE} --steps 100000 --step-seconds 0.5 --state {work}/state \\
    --finish-when-resubmitted 3
""")
    submit = subprocess.run(["sbatch", str(script)], env=env, cwd=work, capture_output=True, text=True,
                            timeout=30)
    assert submit.returncode == 0, submit.stderr
    return work, submit.stdout.split()[-1]


@pytest.fixture(scope="module")
def warned_job(cluster):
    """A job that asks Slurm for SIGUSR1 to its batch shell (the launcher, by exec) 90 s before
    its 2-minute limit: docs/launch.md's recipe for a clean stop at walltime. The job's stand-in
    trainer names a real, complete checkpoint when it stops."""
    folder, env = cluster
    work = folder / "warned"
    work.mkdir()
    made = subprocess.run([CRUCIBLE, "train", "--set", "model.flavor=debug", "--set", "training.seq_len=16",
                           "--set", "training.steps=1", "--set", "checkpoint.interval=1",
                           "--set", "metrics.peak_gflops=100", "--set", f"job.dump_folder={work}/made"],
                          env=dict(env, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    checkpoint = work / "made" / "ckpt" / "step-1"
    script = work / "job.sh"
    script.write_text(f"""#!/bin/bash
#SBATCH -N 1 -t 2 --signal=B:USR1@90 -o {work}/slurm-%j.out
exec {CRUCIBLE} launch --run-dir {work}/run --resubmit -- \\
    {sys.executable} {FAKE} --steps 100000 --step-seconds 0.5 --state {work}/state \\
    --finish-when-resubmitted 3 --stop-checkpoint {checkpoint}
""")
    submit = subprocess.run(["sbatch", str(script)], env=env, cwd=work, capture_output=True, text=True,
                            timeout=30)
    assert submit.returncode == 0, submit.stderr
    return work, submit.stdout.split()[-1], checkpoint


def test_failover_swaps_the_named_node_for_the_spare(cluster, walltime_job, warned_job, tmp_path):
    folder, env = cluster
    run_dir, state = tmp_path / "run", tmp_path / "state"
    # 4 nodes allocated, 3 active: n4 is the spare. Rank 1 (on n2) is SIGKILLed at step 6.
    proc = subprocess.run(
        ["salloc", "-N", "4", "--time=5", CRUCIBLE, "launch", "--run-dir", str(run_dir), "--nodes", "3",
         "--auto-retry", "--backoff-base", "0.2", "--preflight", "--",
         sys.executable, FAKE, "--steps", "12", "--state", str(state), "--fail-node", "n2",
         "--fail-at-step", "6", "--fail-signal", "KILL"],
        env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = attempts(run_dir)
    assert len(records) == 2, proc.stderr
    first, second = records
    assert first["nodes"] == ["n1", "n2", "n3"] and first["spares"] == []
    assert first["verdict"] == "bad_node" and first["blamed_node"] == "n2"
    assert first["evidence"] == "srun: error: n2: task 1: Killed"
    assert first["action"] == "swap" and first["detail"] == "n2->n4"
    assert first["argv"][:2] == ["srun", "--nodelist=n1,n2,n3"]
    # The ranks of the second attempt really ran on the new node list.
    assert second["argv"][:2] == ["srun", "--nodelist=n1,n4,n3"]
    # srun numbers ranks in Slurm's node order, so n4 hosts rank 2 now.
    assert sorted(second["rank_nodes"].values()) == ["n1", "n3", "n4"]
    assert sorted((state / f"node-2-{r}").read_text().strip() for r in range(3)) == ["n1", "n3", "n4"]
    assert second["verdict"] == "success"
    # Resumed, not restarted. When srun aborts a step it can drop the last lines the surviving
    # ranks wrote (seen in CI under load: the launcher saw step=1, the job had reached step 5), so
    # the launcher's last_step is a lower bound of where the job got to.
    assert second["first_step"] > 1 and second["first_step"] >= first["last_step"] + 1
    bad = (run_dir / "launch" / "bad_nodes.txt").read_text()
    assert bad.startswith("n2\tnamed\tattempt=1\tverdict=bad_node\treplaced_by=n4")
    assert "summary" in proc.stderr


def test_walltime_ends_the_job_and_resubmit_queues_the_follow_on(cluster, walltime_job):
    folder, env = cluster
    work, job = walltime_job
    run_dir = work / "run"
    deadline = time.time() + 240
    records = []
    while time.time() < deadline:
        if (run_dir / "launch" / "attempts.jsonl").exists():
            records = attempts(run_dir)
            if any(r["verdict"] == "success" for r in records):
                break
        time.sleep(1)
    outputs = "".join(p.read_text() for p in work.glob("slurm-*.out"))
    assert len(records) == 2, outputs
    first, second = records
    assert first["job_id"] == job
    assert first["verdict"] == "walltime", outputs
    assert "DUE TO TIME LIMIT" in first["evidence"] or first["time_left_seconds"] is not None
    assert first["action"] == "resubmit"
    follow_on = first["resubmitted_job"]
    assert first["job_chain"] == [job]
    assert second["job_id"] == follow_on and second["verdict"] == "success"
    assert second["first_step"] == first["last_step"] + 1 or second["first_step"] > first["last_step"]
    state = subprocess.run(["scontrol", "show", "job", "-o", job], env=env, capture_output=True, text=True)
    assert "JobState=TIMEOUT" in state.stdout or "Reason=TimeLimit" in state.stdout or state.returncode != 0


TRAIN_SETTINGS = ["--set", "model.flavor=debug", "--set", "model.dim=32", "--set", "model.n_layers=1",
                  "--set", "model.n_heads=2", "--set", "model.n_kv_heads=2", "--set", "model.vocab_size=256",
                  "--set", "model.ffn_hidden_dim=64", "--set", "training.seq_len=16",
                  "--set", "training.local_batch_size=2", "--set", "training.global_batch_size=6",
                  "--set", "training.steps=300", "--set", "checkpoint.interval=20",
                  "--set", "checkpoint.async=false", "--set", "metrics.peak_gflops=100",
                  # ZeRO-3 across the virtual nodes: parameters gathered layer by layer over the
                  # network, shards of 3 ranks (one of them empty), regrouped on resume.
                  "--set", "parallelism.zero_stage=3"]


def rank_pid(run_dir, rank):
    """The pid of the `crucible train` process of data-parallel rank `rank` in run_dir."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (len(argv) > 1 and argv[0].endswith(b"crucible") and argv[1] == b"train"
                and f"job.dump_folder={run_dir}".encode() in argv
                and f"SLURM_PROCID={rank}".encode() in environ):
            return int(proc.name)
    return None


def test_crucible_train_fails_over_and_ends_bit_identical(cluster, walltime_job, tmp_path):
    """crucible train as 3 data-parallel MPI ranks (srun --mpi=pmix, one per node; ZeRO-3) under
    --auto-retry on 3 of 4 nodes; rank 1 is SIGKILLed mid-run; its node is swapped for the spare,
    the 3 ranks resume on the new node list from the last checkpoint, and the final weights equal
    those of an uninterrupted single-process run, bit for bit."""
    folder, env = cluster
    env = dict(env, OMP_NUM_THREADS="1", CRUCIBLE_MPI="openmpi")
    reference = tmp_path / "reference"
    plain = subprocess.run([CRUCIBLE, "train", *TRAIN_SETTINGS, "--set", f"job.dump_folder={reference}"],
                           env=env, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr

    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        ["salloc", "-N", "4", "--time=10", CRUCIBLE, "launch", "--run-dir", str(run_dir), "--nodes", "3",
         "--auto-retry", "--backoff-base", "0.2", "--timeout", "60", "--",
         CRUCIBLE, "train", *TRAIN_SETTINGS, "--set", f"job.dump_folder={run_dir}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed_at = None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if killed_at is None and line.startswith("0: step="):
            step = int(line.split()[1].split("=")[1])
            pid = rank_pid(run_dir, 1) if step >= 50 else None
            if pid:
                os.kill(pid, 9)
                killed_at = step
    stderr = proc.stderr.read()
    assert proc.wait(timeout=300) == 0, stderr
    assert killed_at is not None, "training ended before it could be interrupted"
    first, second = attempts(run_dir)
    assert first["verdict"] == "bad_node" and first["blamed_node"] == "n2", first  # rank 1 ran on n2
    assert first["evidence"].startswith("srun: error: n2: task 1: "), first["evidence"]
    assert first["detail"] == "n2->n4"
    assert sorted(second["rank_nodes"].values()) == ["n1", "n3", "n4"]
    # Resumed from the newest complete checkpoint before the kill, not from step 1.
    assert second["first_step"] > 1 and (second["first_step"] - 1) % 20 == 0
    assert second["first_step"] - 1 <= killed_at
    assert any("phase=resume" in line for line in lines)
    done = [line for line in lines if "done steps=300" in line]
    assert done and plain.stdout.split("weights_xxh3=")[1].split()[0] in done[-1]
    assert (run_dir / "model.safetensors").read_bytes() == (reference / "model.safetensors").read_bytes()


def test_real_mpi_ranks_talk_across_the_virtual_nodes(cluster, walltime_job, tmp_path):
    """Open MPI ranks started by srun --mpi=pmix (the launcher's Slurm x Open MPI command) on 3 of
    the 4 nodes: one rank per node, and an allreduce over all of them."""
    folder, env = cluster
    program = tmp_path / "mpi_hello"
    compiled = subprocess.run(["mpicc", str(ROOT / "tests/integration/launch/mpi_hello.c"), "-o", str(program)],
                              capture_output=True, text=True, timeout=120)
    assert compiled.returncode == 0, compiled.stderr
    env = dict(env, CRUCIBLE_MPI="openmpi")
    proc = subprocess.run(["salloc", "-N", "4", "--time=5", CRUCIBLE, "launch", "--run-dir", str(tmp_path / "run"),
                           "--nodes", "3", "--timeout", "60", "--", str(program)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = sorted(l for l in proc.stdout.splitlines() if "mpi_rank=" in l)
    assert len(lines) == 3
    assert all("mpi_size=3 allreduce=3" in l for l in lines)
    assert sorted(l.split("node=")[1].split()[0] for l in lines) == ["n1", "n2", "n3"]
    record = attempts(tmp_path / "run")[0]
    assert "--mpi=pmix" in record["argv"] and "--nodelist=n1,n2,n3" in record["argv"]


def test_srun_passes_lines_written_in_pieces_through_whole(cluster, tmp_path):
    """srun --label: each rank's line whole and labelled with its rank, though written in pieces
    (the same program as test_launch.py's Open MPI and Hydra test)."""
    folder, env = cluster
    proc = subprocess.run(["salloc", "-N", "2", "--time=5", CRUCIBLE, "launch", "--run-dir", str(tmp_path / "run"),
                           "--nodes", "2", "--timeout", "60", "--", sys.executable,
                           str(ROOT / "tests/integration/launch/pieces.py")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(l for l in proc.stdout.splitlines() if l.startswith(("0: ", "1: "))) == [
        "0: step=1 loss=2.5", "0: step=2 loss=2.0", "1: rank 1 ends without a newline",
        "1: rank 1 says hello"], proc.stdout
    assert sorted(l for l in proc.stderr.splitlines() if l.startswith(("0: ", "1: "))) == [
        "0: warning: slow", "1: e1"], proc.stderr


def launcher_pid(run_dir):
    """The pid of the `crucible launch --run-dir run_dir` process (salloc's child)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) > 3 and argv[0].endswith(b"crucible") and argv[1] == b"launch" \
                and str(run_dir).encode() in argv:
            return int(proc.name)
    return None


def test_sigterm_through_the_launcher_under_srun_checkpoints_and_resumes_bit_identical(cluster, tmp_path):
    """SIGTERM to `crucible launch` running 3 ranks of crucible train under srun (--mpi=pmix, one
    per node, ZeRO-3): the launcher sends SIGUSR1 through srun instead (srun cancels its step on
    SIGTERM), waits for the checkpoint and exits 143; the named checkpoint is complete and the
    resume ends bit-identical to an uninterrupted single-process run."""
    folder, env = cluster
    env = dict(env, OMP_NUM_THREADS="1", CRUCIBLE_MPI="openmpi")
    settings = TRAIN_SETTINGS + ["--set", "checkpoint.interval=1000"]  # the stop's is the only one
    reference = tmp_path / "reference"
    plain = subprocess.run([CRUCIBLE, "train", *settings, "--set", f"job.dump_folder={reference}"],
                           env=env, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr

    run_dir = tmp_path / "run"
    launch = ["salloc", "-N", "3", "--time=10", CRUCIBLE, "launch", "--run-dir", str(run_dir), "--nodes", "3",
              "--timeout", "120", "--", CRUCIBLE, "train", *settings, "--set", f"job.dump_folder={run_dir}"]
    proc = subprocess.Popen(launch, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    signalled = None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if signalled is None and line.startswith("0: step=") and int(line.split()[1].split("=")[1]) >= 10:
            pid = launcher_pid(run_dir)
            if pid:
                os.kill(pid, signal.SIGTERM)
                signalled = time.monotonic()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=300) == 143, "".join(lines) + stderr
    print(f"SIGTERM to the launcher under srun -> exit after {time.monotonic() - signalled:.2f} s")
    stopped = [l for l in lines if l.startswith("0: stopped step=")]
    assert stopped and "signal=SIGUSR1" in stopped[0], "".join(lines) + stderr
    step = int(stopped[0].split()[2].split("=")[1])
    checkpoint = run_dir / "ckpt" / f"step-{step}"
    assert f"checkpoint={checkpoint} exit=143" in stopped[0]
    assert (checkpoint / "COMPLETE").exists() and not list((run_dir / "ckpt").glob(".tmp-*"))
    first = attempts(run_dir)[0]
    assert first["exit_code"] == 143 and first["signal"] == signal.SIGTERM
    assert first["stopped_checkpoint"] == str(checkpoint) and first["stop_problem"] == ""
    assert first["argv"][0] == "srun" and "--mpi=pmix" in first["argv"]

    resumed = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"0: phase=resume from={checkpoint} step={step} " in resumed.stdout
    done = [l for l in resumed.stdout.splitlines() if "done steps=300" in l]
    assert done and plain.stdout.split("weights_xxh3=")[1].split()[0] in done[-1]
    losses = lambda d: [(r["step"], r["loss"]) for r in map(json.loads, open(d / "metrics.jsonl"))]
    assert losses(run_dir) == losses(reference)
    assert (run_dir / "model.safetensors").read_bytes() == (reference / "model.safetensors").read_bytes()


def test_a_walltime_warning_to_the_launcher_stops_cleanly_and_resubmits(cluster, warned_job):
    """`#SBATCH --signal=B:USR1@90` + `exec crucible launch`: the launcher gets SIGUSR1 ahead of the
    limit, stops the job (143: the named checkpoint is complete), calls it walltime and queues the
    follow-on job, which finishes."""
    folder, env = cluster
    work, job, checkpoint = warned_job
    run_dir = work / "run"
    deadline = time.time() + 300
    records = []
    while time.time() < deadline:
        if (run_dir / "launch" / "attempts.jsonl").exists():
            records = attempts(run_dir)
            if any(r["verdict"] == "success" for r in records):
                break
        time.sleep(1)
    outputs = "".join(p.read_text() for p in work.glob("slurm-*.out"))
    assert len(records) == 2, outputs
    first, second = records
    assert first["job_id"] == job and first["signal"] == signal.SIGUSR1, outputs
    assert first["exit_code"] == 143 and first["stopped_checkpoint"] == str(checkpoint), first
    assert first["verdict"] == "walltime" and first["time_left_seconds"] <= 120, first
    assert first["action"] == "resubmit"
    assert second["job_id"] == first["resubmitted_job"] and second["verdict"] == "success"
