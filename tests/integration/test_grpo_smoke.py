"""The GRPO smoke gate (`crucible smoke --grpo`, docs/post-training.md, "GRPO loop"): a fixed
GRPO run whose per-step metrics and final tensors equal tests/golden/smoke_grpo.json bit for bit
on 1, 2 and 4 ranks; a cross-rank sum switched to an average (the test-only
debug.grpo_average_reduction) fails the 2-rank gate naming the metric at step 1, and passes on one
rank, where the average over one rank is the sum."""
from conftest import REPO, run_crucible
from rank_runs import MPI_ENV

GOLDEN = REPO / "tests" / "golden" / "smoke_grpo.json"


def smoke(tmp_path, ranks, *extra):
    return run_crucible("smoke", "--grpo", "--golden", GOLDEN, "--ranks", str(ranks), "--work-dir",
                        tmp_path / f"r{ranks}{len(extra)}", *extra, env=MPI_ENV, check=False)


def test_the_grpo_smoke_passes_on_one_two_and_four_ranks(tmp_path):
    for ranks in (1, 2, 4):
        proc = smoke(tmp_path, ranks)
        assert proc.returncode == 0 and "smoke: PASS 8 steps" in proc.stdout, proc.stdout + proc.stderr


def test_a_sum_switched_to_an_average_fails_the_two_rank_gate_naming_the_metric(tmp_path):
    for name, metric in (("loss_sums", "grpo_loss"), ("entropy", "entropy")):
        proc = smoke(tmp_path / name, 2, "--set", f"debug.grpo_average_reduction={name}")
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert f"smoke: FAIL first difference at step 1: {metric} " in proc.stdout, proc.stdout
        # One rank cannot see it: the average over one rank is the sum.
        proc = smoke(tmp_path / name, 1, "--set", f"debug.grpo_average_reduction={name}")
        assert proc.returncode == 0 and "smoke: PASS" in proc.stdout, proc.stdout
