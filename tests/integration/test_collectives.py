"""The communicators under a real MPI launcher: the GoogleTest program of tests/mpi/ (built by
CMake next to crucible as test_mpi) run by mpirun on 2, 3 and 4 ranks: all-to-all and
all-to-allv of every size (empty blocks included) and element type, operations in flight
together, the groups a 2 x 2 mesh splits from the world, the collective deadline, and a
tensor-parallel Llama against the whole model at degree 2 and 4 (tests/mpi/tensor_parallel_test.cc,
in every mesh: a mesh without tensor_parallel runs it at degree 1)."""
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from conftest import crucible_binary

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMP_NUM_THREADS": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def mpi_test_program():
    path = Path(crucible_binary()).resolve().parent / "test_mpi"
    assert path.exists(), f"{path} not found: build it (cmake --build build)"
    return str(path)


def mpirun(np, *args, mesh="", timeout=120, extra_env=None):
    env = dict(os.environ, **MPI_ENV, CRUCIBLE_TEST_MESH=mesh, **(extra_env or {}))
    command = ["mpirun", "-np", str(np)]
    for key in list(MPI_ENV) + ["CRUCIBLE_TEST_MESH"] + list(extra_env or {}):
        command += ["-x", key]
    return subprocess.run(command + [mpi_test_program(), "--gtest_color=no", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


def passed_on_every_rank(proc, np):
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    # Every rank ran the same tests, none skipped, and they all passed: the count is each rank's
    # own "Running N tests", so a test added to tests/mpi/ needs no change here.
    running = re.findall(r"^\[==========\] Running (\d+) tests? from ", proc.stdout, re.M)
    passed = re.findall(r"^\[  PASSED  \] (\d+) tests?\.$", proc.stdout, re.M)
    assert len(running) == np and len(set(running)) == 1 and int(running[0]) > 0, proc.stdout
    assert passed == running, proc.stdout


@pytest.mark.parametrize("np", [2, 3])
def test_all_to_all_moves_every_block_to_its_rank(np):
    passed_on_every_rank(mpirun(np), np)


def test_a_filtered_run_counts_the_tests_each_rank_ran():
    # The count comes from the program's output: two of its tests, not a fixed number.
    proc = mpirun(2, "--gtest_filter=AllToAll.*")
    passed_on_every_rank(proc, 2)
    assert re.findall(r"^\[  PASSED  \] (\d+) tests?\.$", proc.stdout, re.M) == ["2", "2"], proc.stdout


@pytest.mark.parametrize("np,mesh", [(4, "data_parallel=2,tensor_parallel=2"),
                                     (4, "data_parallel=-1,tensor_parallel=2"),
                                     (2, "data_parallel=1,tensor_parallel=2"),
                                     (4, "data_parallel=1,tensor_parallel=4"),
                                     # Expert parallelism's: replicas, the experts' groups, none.
                                     (4, "data_parallel=2,expert_parallel=2,tensor_parallel=1"),
                                     (4, "data_parallel=1,expert_parallel=4,tensor_parallel=1")])
def test_a_mesh_splits_the_world_into_the_groups_of_its_layout(np, mesh):
    passed_on_every_rank(mpirun(np, mesh=mesh), np)


def test_degrees_that_do_not_multiply_to_the_world_stop_every_rank_with_exit_2():
    proc = mpirun(4, mesh="data_parallel=3,tensor_parallel=2")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert ("test_mpi: parallelism degrees (data_parallel=3, tensor_parallel=2) multiply to 6 ranks, "
            "but the job has 4") in proc.stderr


def test_a_rank_left_alone_in_an_all_to_all_aborts_the_job_at_the_deadline():
    start = time.monotonic()
    proc = mpirun(2, "--gtest_also_run_disabled_tests", "--gtest_filter=Deadline.*",
                  extra_env={"CRUCIBLE_TEST_TIMEOUT": "2"})
    elapsed = time.monotonic() - start
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert re.search(r"crucible: error: collective timeout: rank 0 on host \S+ waited 2 s in test all-to-all "
                     r"at step 7, world( = \w+ group)?: job ranks 0-1 \(comm.train_timeout_seconds = 2\); another rank is dead or hung", proc.stderr), \
        proc.stderr
    assert elapsed < 60, f"the job took {elapsed:.0f} s to end: the other rank was not aborted"
