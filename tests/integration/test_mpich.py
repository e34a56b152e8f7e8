"""MPICH: crucible built against MPICH (`make build-mpich`, -DCRUCIBLE_MPI=mpich) and run by
MPICH's own launcher (mpiexec.mpich, Hydra) trains bit-identically to a single process of the
Open MPI build, for 1, 2 and 4 ranks and ZeRO stages 0, 1 and 3; a stopped rank ends the job with
the collective timeout; the communicator tests of tests/mpi/ pass; `crucible launch` with
CRUCIBLE_MPI=mpich runs MPICH's launcher even where mpirun/mpiexec are Open MPI's (Debian with
both installed)."""
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO, crucible_binary

MPIEXEC = shutil.which("mpiexec.mpich")
pytestmark = pytest.mark.skipif(
    MPIEXEC is None,
    reason="mpiexec.mpich not found: install the Debian packages mpich and libmpich-dev "
           "(scripts/install-deps.sh installs them)")

# Hydra passes the whole environment to the ranks; nothing Open MPI-specific is needed, and it
# runs as root without flags.
MPI_ENV = {"OMP_NUM_THREADS": "1"}
BASE = ["model.flavor=debug", "training.seq_len=32", "training.local_batch_size=2", "training.global_batch_size=8",
        "metrics.peak_gflops=10", "lr_scheduler.warmup_steps=2", "lr_scheduler.decay_type=constant",
        "optimizer.lr=1e-3"]
STEPS = 5


def clean_env(**extra):
    """This environment without scheduler or MPI-launcher variables (a test run under mpirun or
    srun must not make the ranks think they belong to that job)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "PBS_", "CRUCIBLE_", "OMPI_", "PMI", "PMIX_", "HYDRA_", "MPIR_"))}
    env.update(MPI_ENV)
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def mpich_crucible():
    """The MPICH-built binary: CRUCIBLE_MPICH, else build-mpich/crucible brought up to date with
    `make build-mpich` (a stale binary would compare old kernels with new ones)."""
    path = os.environ.get("CRUCIBLE_MPICH")
    if not path:
        proc = subprocess.run(["make", "-s", "build-mpich"], cwd=REPO, capture_output=True, text=True)
        assert proc.returncode == 0, f"make build-mpich failed\n{proc.stdout}\n{proc.stderr}"
        path = str(REPO / "build-mpich" / "crucible")
    assert Path(path).exists(), f"{path} not found: make build-mpich"
    libraries = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
    assert re.search(r"libmpich\.so", libraries), libraries
    assert not re.search(r"libmpi\.so", libraries), f"{path} links Open MPI's libmpi:\n{libraries}"
    return path


def mpiexec(binary, np, settings, timeout=300):
    args = [MPIEXEC, "-n", str(np), binary, "train"]
    for item in settings:
        args += ["--set", item]
    proc = subprocess.run(args, capture_output=True, text=True, env=clean_env(), timeout=timeout)
    assert proc.returncode == 0, f"mpiexec.mpich -n {np} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def result(stdout, run_dir):
    steps = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    digest = re.search(r"^done .*weights_xxh3=([0-9a-f]+)", stdout, re.M)
    assert digest, stdout
    return [(r["step"], r["loss"], r["grad_norm"]) for r in steps], digest.group(1)


def openmpi_single_process(run_dir, settings):
    """The reference: one process of the Open MPI build, started without any MPI launcher."""
    args = [crucible_binary(), "train"]
    for item in settings + [f"job.dump_folder={run_dir}"]:
        args += ["--set", item]
    proc = subprocess.run(args, capture_output=True, text=True, env=clean_env(), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return result(proc.stdout, run_dir)


@pytest.mark.parametrize("zero_stage", [0, 1, 3])
def test_mpich_ranks_match_the_openmpi_single_process_bit_for_bit(mpich_crucible, tmp_path, zero_stage):
    settings = BASE + [f"training.steps={STEPS}", f"parallelism.zero_stage={zero_stage}"]
    reference = openmpi_single_process(tmp_path / "openmpi", settings)
    assert len(reference[0]) == STEPS
    for np in (1, 2, 4):
        run_dir = tmp_path / f"mpich{np}"
        proc = mpiexec(mpich_crucible, np, settings + [f"job.dump_folder={run_dir}", "metrics.per_rank=true"])
        # One job of np ranks (not np single-rank jobs): rank 0 alone prints, every rank keeps
        # its own metrics.
        assert len([l for l in proc.stdout.splitlines() if l.startswith("step=")]) == STEPS, proc.stdout
        if np > 1:
            for rank in range(np):
                assert (run_dir / f"metrics-rank{rank}.jsonl").exists(), sorted(os.listdir(run_dir))
        assert result(proc.stdout, run_dir) == reference, f"{np} MPICH rank(s), ZeRO {zero_stage}"


def test_mpich_all_to_all_and_a_split_mesh(mpich_crucible):
    """The communicator tests of tests/mpi/ (test_collectives.py runs them under Open MPI)."""
    program = Path(mpich_crucible).parent / "test_mpi"
    assert program.exists(), f"{program} not found: make build-mpich"
    for np, mesh in [(3, ""), (4, "data_parallel=2,tensor_parallel=2")]:
        proc = subprocess.run([MPIEXEC, "-n", str(np), str(program), "--gtest_color=no"], capture_output=True,
                              text=True, env=clean_env(CRUCIBLE_TEST_MESH=mesh), timeout=120)
        assert proc.returncode == 0, f"{np} ranks, mesh '{mesh}': exit {proc.returncode}\n{proc.stdout[-6000:]}"
        # Every rank ran the same tests and passed them all (the count from the program's own
        # output, so a test added to tests/mpi/ needs no change here). MPICH's mpiexec forwards
        # each rank's writes as they come, not whole lines, so the ranks' lines interleave (CI saw
        # "[==========] [==========] Running 7 tests"): count gtest's markers, each one write,
        # not anchored lines; the exit code above says no rank failed.
        running = re.findall(r"Running (\d+) tests? from ", proc.stdout)
        assert len(running) == np and len(set(running)) == 1 and int(running[0]) > 0, proc.stdout
        assert proc.stdout.count("[  PASSED  ] ") == np, proc.stdout
        assert "[  FAILED  ]" not in proc.stdout, proc.stdout


def running(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_hung_mpich_rank_aborts_the_job_after_the_collective_timeout(mpich_crucible, tmp_path):
    run_dir = tmp_path / "run"
    args = [MPIEXEC, "-n", "2", mpich_crucible, "train"]
    # ZeRO 0: the test is about the timeout; the ZeRO stages have their own test above.
    for item in BASE + ["training.steps=1000", "parallelism.zero_stage=0", "comm.train_timeout_seconds=3",
                        f"job.dump_folder={run_dir}"]:
        args += ["--set", item]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
                            start_new_session=True)
    pids = []
    try:
        for line in proc.stdout:
            if line.startswith("step=2 "):
                break
        else:
            proc.wait(timeout=60)
            pytest.fail(f"the job ended before step 2 (exit {proc.returncode}):\n{proc.stderr.read()}")
        ranks = subprocess.run(["pgrep", "-f", f"job.dump_folder={run_dir}"], capture_output=True, text=True)
        pids = [int(p) for p in ranks.stdout.split() if int(p) != proc.pid]
        pids = [p for p in pids if open(f"/proc/{p}/cmdline").read().split("\0")[0] == mpich_crucible]
        assert len(pids) == 2, pids
        os.kill(max(pids), signal.SIGSTOP)  # one rank hangs
        stopped_at = time.time()
        stdout, stderr = proc.communicate(timeout=60)
        elapsed = time.time() - stopped_at
        # Hydra ends every rank, the stopped one included (each rank has its own process group,
        # so nothing below would catch one left behind).
        deadline = time.time() + 5
        while any(running(p) for p in pids) and time.time() < deadline:
            time.sleep(0.1)
        left = [p for p in pids if running(p)]
    finally:
        for pid in [proc.pid] + pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    report = f"exit {proc.returncode} after {elapsed:.1f} s\nstdout:\n{stdout[-2000:]}\nstderr:\n{stderr}"
    assert proc.returncode != 0, report
    assert "collective timeout" in stderr and "at step" in stderr, report
    assert elapsed < 3 + 15, report
    assert not left, f"ranks still running after the job ended: {left}"


def test_crucible_launch_with_mpich_runs_hydra_and_ends_bit_identical(mpich_crucible, tmp_path):
    settings = BASE + [f"training.steps={STEPS}", "parallelism.zero_stage=0"]  # the launcher, not ZeRO
    reference = openmpi_single_process(tmp_path / "openmpi", settings)
    run_dir = tmp_path / "run"
    train = [mpich_crucible, "train"] + sum((["--set", s] for s in settings + [f"job.dump_folder={run_dir}"]), [])
    env = clean_env(CRUCIBLE_MPI="mpich")
    dry = subprocess.run([mpich_crucible, "launch", "--run-dir", str(run_dir), "--np", "2", "--dry-run", "--", *train],
                         capture_output=True, text=True, env=env, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert "mpi:         mpich" in dry.stdout
    command = shlex.split(dry.stdout.split("command:\n", 1)[1].splitlines()[0])
    launcher = shutil.which(command[0], path=env.get("PATH"))
    assert launcher, command
    # Hydra, whatever mpiexec on PATH is (Open MPI's on a Debian default with both installed).
    assert re.search(r"mpich|hydra", os.path.realpath(launcher)), (command[0], os.path.realpath(launcher))
    assert command[1:5] == ["-n", "2", "-prepend-pattern", "[%g,%r]<hydra>:"], command

    proc = subprocess.run([mpich_crucible, "launch", "--run-dir", str(run_dir), "--np", "2", "--", *train],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The launcher passes rank 0's lines through labelled "0: ...".
    lines = [l.split(": ", 1)[1] for l in proc.stdout.splitlines() if l.startswith("0: ")]
    assert len([l for l in lines if l.startswith("step=")]) == STEPS, proc.stdout
    assert result("\n".join(lines), run_dir) == reference
    record = [json.loads(l) for l in (run_dir / "launch" / "attempts.jsonl").read_text().splitlines()
              if json.loads(l).get("kind") == "attempt"]
    assert len(record) == 1 and record[0]["argv"][0] == command[0], record


def test_a_binary_started_by_the_other_mpis_launcher_says_so(mpich_crucible, tmp_path):
    """Open MPI's mpirun starting the MPICH build would run N unconnected one-rank jobs writing the
    same run directory; each rank sees the launcher's world size and refuses instead."""
    env = clean_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    args = ["mpirun", "--oversubscribe", "-np", "2", mpich_crucible, "train"]
    for item in BASE + ["training.steps=2", f"job.dump_folder={tmp_path / 'run'}"]:
        args += ["--set", item]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0
    assert "built against another MPI" in proc.stderr, proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
