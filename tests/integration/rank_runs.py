"""Training runs under mpirun for the tests that hold an optimizer to the bits of one rank across
rank counts, ZeRO stages and resumes (test_whole_matrix_zero.py, test_sophia.py), and a rank
stopped in the middle of a 2-rank run (test_distributed.py, test_tensor_parallel.py,
test_deepseek_v3.py)."""
import json
import os
import re
import shutil
import signal
import subprocess
import time

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMP_NUM_THREADS": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def mpirun_train(command, np, run_dir, items, check=True):
    """`command` (a list: a program and its subcommand) on `np` ranks with --set for each item and
    job.dump_folder=run_dir; asserts exit 0 when `check`."""
    args = ["mpirun", "-np", str(np)]
    for key in MPI_ENV:
        args += ["-x", key]
    args += command
    for item in items + [f"job.dump_folder={run_dir}"]:
        args += ["--set", item]
    proc = subprocess.run(args, capture_output=True, text=True, env=dict(os.environ, **MPI_ENV), timeout=120)
    if check:
        assert proc.returncode == 0, f"mpirun -np {np} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def steps_and_digest(proc, run_dir, fields):
    """(step, *fields) of every metrics.jsonl record, and the final weights' xxh3 of the done line."""
    steps = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    digest = re.search(r"weights_xxh3=([0-9a-f]+)", proc.stdout).group(1)
    return [(s["step"],) + tuple(s[f] for f in fields) for s in steps], digest


def resume_runs(train, tmp_path, layouts):
    """train(np, run_dir, settings) six steps straight on one rank (checkpoints at 3 and 6), three
    on two ranks at ZeRO-1 (its checkpoint of step 3, where it stops), and a copy of that run
    directory resumed to step 6 on each (np, stage) of `layouts`. Returns (the straight run's
    proc, its directory), the two-rank run's directory and [(np, stage, proc, run_dir)]."""
    settings = ["training.steps=6", "checkpoint.interval=3", "checkpoint.keep_latest_k=0"]
    straight = tmp_path / "straight"
    straight_proc = train(1, straight, settings)
    written = tmp_path / "written"
    train(2, written, ["training.steps=3", "checkpoint.interval=3", "checkpoint.keep_latest_k=0",
                       "parallelism.zero_stage=1"])
    resumed = []
    for np, stage in layouts:
        run_dir = tmp_path / f"resumed-np{np}"
        shutil.copytree(written, run_dir)
        resumed.append((np, stage, train(np, run_dir, settings + [f"parallelism.zero_stage={stage}"]), run_dir))
    return (straight_proc, straight), written, resumed


def stop_one_rank(binary, run_dir, items):
    """`binary train` on 2 ranks with --set for each item (which must include
    job.dump_folder=run_dir); once step 2 is printed, SIGSTOPs the higher-numbered rank's process.
    Returns (the mpirun process after it exited, its stderr, seconds from the stop to the exit)."""
    args = ["mpirun", "-np", "2"] + sum((["-x", k] for k in MPI_ENV), []) + [binary, "train"]
    for item in items:
        args += ["--set", item]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, **MPI_ENV), start_new_session=True)
    try:
        for line in proc.stdout:
            if line.startswith("step=2 "):
                break
        ranks = subprocess.run(["pgrep", "-f", f"job.dump_folder={run_dir}"], capture_output=True, text=True)
        pids = [int(p) for p in ranks.stdout.split() if int(p) != proc.pid]
        pids = [p for p in pids if "crucible" in open(f"/proc/{p}/cmdline").read().split("\0")[0]]
        assert len(pids) == 2, pids
        os.kill(max(pids), signal.SIGSTOP)  # one rank hangs
        stopped_at = time.time()
        _, stderr = proc.communicate(timeout=60)
        return proc, stderr, time.time() - stopped_at
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def assert_stopped_rank_times_out(binary, run_dir, items, group):
    """stop_one_rank with comm.train_timeout_seconds=3 among `items`: the job must fail within the
    deadline and 15 s, its message naming a collective timeout at a step in the group that the
    regular expression `group` matches (the group's name before ": job ranks 0-1"). Returns the
    stderr."""
    proc, stderr, elapsed = stop_one_rank(binary, run_dir, items)
    assert proc.returncode != 0
    assert re.search(r"collective timeout: .* at step \d+, (" + group + r"): job ranks 0-1 ", stderr), stderr
    assert elapsed < 3 + 15, elapsed
    return stderr
