"""Tensor parallelism in `crucible train` (docs/parallelism.md): every (data-parallel,
tensor-parallel, ZeRO) layout on 1, 2 and 4 ranks gives the one process's logged metrics and
final weights bit for bit; a checkpoint written at one degree resumes at another bit-exactly; a
rank stopped inside a tensor-parallel group aborts the job at the collective deadline naming the
group; what cannot be cut is refused in one line with exit 2."""
import json
import os
import re
import subprocess

import pytest

from conftest import REPO, crucible_binary, run_crucible
from rank_runs import assert_stopped_rank_times_out

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMP_NUM_THREADS": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}
# The debug flavor with 4 KV heads (4 chunks cut heads, KV heads, the FFN and the vocabulary),
# short sequences, the default exact reduction (block48); checkpoints only where a test asks.
BASE = ["model.flavor=debug", "model.n_kv_heads=4", "training.seq_len=32", "training.local_batch_size=2",
        "training.global_batch_size=8", "metrics.peak_gflops=10", "lr_scheduler.warmup_steps=2",
        "lr_scheduler.decay_type=constant",
        "optimizer.lr=3e-3", "training.steps=4", "parallelism.tensor_parallel_chunks=4",
        "checkpoint.enable=false"]
# What a step logs that is timing or memory use, not arithmetic.
TIMING = {"mfu", "reduce_wait_s", "step_seconds", "tok_per_s", "rss_peak_bytes"}


def train(np, settings, timeout=300, check=True):
    args = ["mpirun", "-np", str(np)] + sum((["-x", k] for k in MPI_ENV), []) if np > 1 else []
    args += [crucible_binary(), "train"]
    for item in settings:
        args += ["--set", item]
    proc = subprocess.run(args, capture_output=True, text=True, env=dict(os.environ, **MPI_ENV),
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{np} ranks exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def logged(proc, run_dir):
    records = [{k: v for k, v in json.loads(line).items() if k not in TIMING}
               for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    digest = re.search(r"weights_xxh3=([0-9a-f]+)", proc.stdout).group(1)
    return records, digest


@pytest.mark.parametrize("zero_stage", [0, 1, 3])
def test_every_layout_of_one_to_four_ranks_logs_the_one_process_metrics_and_weights(tmp_path, zero_stage):
    settings = BASE + [f"parallelism.zero_stage={zero_stage}"]
    one = tmp_path / "one"
    reference = logged(train(1, settings + [f"job.dump_folder={one}"]), one)
    records, _ = reference
    assert len(records) == 4
    assert abs(records[0]["loss"] - 7.6) < 0.1  # ln(2048) = 7.62: not divided by any degree
    for np, tp in [(2, 2), (2, 1), (4, 4), (4, 2)]:
        run_dir = tmp_path / f"np{np}-tp{tp}"
        proc = train(np, settings + [f"parallelism.tensor_parallel_degree={tp}", f"job.dump_folder={run_dir}"])
        assert f"phase=tensor_parallel degree={tp} chunks=4 data_parallel={np // tp}" in proc.stdout
        assert len([l for l in proc.stdout.splitlines() if l.startswith("step=")]) == 4  # rank 0 alone
        assert logged(proc, run_dir) == reference, (np, tp, zero_stage)


@pytest.mark.parametrize("exact_reduction", ["block32", "fixed128"])
def test_every_exact_format_gives_the_one_process_bits_at_every_layout(tmp_path, exact_reduction):
    """The block formats (block48, the default of the tests above, and block32) round each block
    of the gradient onto its own grid, so which values share a block decides the bits. The
    blocks start at every chunk of every tensor (ParameterTable::LayoutFreeRuns), which every
    degree holds whole: a rank's part of o_proj and down_proj (cut along their columns) is laid
    out otherwise at each degree. fixed128 rounds no block."""
    settings = BASE + [f"parallelism.exact_reduction={exact_reduction}"]
    one = tmp_path / "one"
    reference = logged(train(1, settings + ["parallelism.zero_stage=1", f"job.dump_folder={one}"]), one)
    default = tmp_path / "block48"
    # The format is in effect: the weights differ from the default format's.
    assert logged(train(1, BASE + [f"job.dump_folder={default}"]), default)[1] != reference[1]
    for np, tp, zero_stage in [(2, 2, 1), (4, 2, 3), (4, 4, 0), (2, 1, 1)]:
        run_dir = tmp_path / f"np{np}-tp{tp}-zero{zero_stage}"
        proc = train(np, settings + [f"parallelism.tensor_parallel_degree={tp}",
                                     f"parallelism.zero_stage={zero_stage}", f"job.dump_folder={run_dir}"])
        assert logged(proc, run_dir) == reference, (np, tp, zero_stage)


@pytest.mark.parametrize("np,tp,zero_stage", [(1, 1, 1), (2, 2, 1), (4, 4, 1), (4, 2, 1), (4, 2, 3)])
def test_sequence_parallelism_logs_the_one_process_metrics_and_weights(tmp_path, np, tp, zero_stage):
    """parallelism.sequence_parallel = true splits the residual stream and the norms into row
    blocks over the group (at degree 1: the 4 chunks on one rank); the bits do not move."""
    settings = BASE + [f"parallelism.zero_stage={zero_stage}"]
    one = tmp_path / "one"
    reference = logged(train(1, settings + [f"job.dump_folder={one}"]), one)
    run_dir = tmp_path / "sp"
    proc = train(np, settings + [f"parallelism.tensor_parallel_degree={tp}", "parallelism.sequence_parallel=true",
                                 f"job.dump_folder={run_dir}"])
    assert (f"phase=tensor_parallel degree={tp} chunks=4 data_parallel={np // tp} sequence_parallel=on"
            in proc.stdout), proc.stdout
    assert logged(proc, run_dir) == reference, (np, tp, zero_stage)


def test_sequence_parallelism_reports_the_activation_memory_it_saves(tmp_path):
    def memory(sequence_parallel):
        run_dir = tmp_path / f"sp-{sequence_parallel}"
        proc = train(2, BASE + ["training.steps=1", "parallelism.tensor_parallel_degree=2",
                                f"parallelism.sequence_parallel={str(sequence_parallel).lower()}",
                                f"job.dump_folder={run_dir}"])
        return next(l for l in proc.stdout.splitlines() if l.startswith("phase=memory "))
    plain, split = memory(False), memory(True)
    assert "sequence_parallel=" not in plain
    saved = int(re.search(r" activations_saved_bytes=(\d+)", split).group(1))
    mine = int(re.search(r" activation_bytes=(\d+)", split).group(1))
    assert saved > 0 and mine > 0, split
    # The saving is against the same layout without sequence parallelism: what that run allocates.
    assert "activations_without_sequence_parallel=" + re.search(r" activations=([^ ]+ [^ ]+)", plain).group(1) \
        in split, (plain, split)


@pytest.mark.parametrize("written,resumed", [((2, 2), (1, 1)), ((2, 2), (4, 4)), ((1, 1), (2, 2)),
                                             ((4, 2), (2, 1)), ((2, 2, "sp"), (4, 4))])
def test_a_checkpoint_resumes_at_another_degree_bit_exactly(tmp_path, written, resumed):
    """(ranks, tensor-parallel degree) that write the checkpoint of step 3, and that resume it to
    step 6, against six steps straight on one process (ZeRO-1 throughout); "sp" writes with
    sequence parallelism, which leaves the checkpoint's layout as it is."""
    settings = BASE + ["training.steps=6", "checkpoint.enable=true", "checkpoint.interval=3",
                       "checkpoint.keep_latest_k=0"]
    straight = tmp_path / "straight"
    reference = logged(train(1, settings + [f"job.dump_folder={straight}"]), straight)
    first = tmp_path / "first"
    np, tp = written[:2]
    sp = ["parallelism.sequence_parallel=true"] if written[2:] == ("sp",) else []
    train(np, settings + sp + ["training.steps=3", f"parallelism.tensor_parallel_degree={tp}",
                               f"job.dump_folder={first}"])
    np, tp = resumed
    proc = train(np, settings + [f"parallelism.tensor_parallel_degree={tp}", f"job.dump_folder={first}"])
    assert "phase=resume" in proc.stdout
    assert logged(proc, first) == reference
    # The weights file is the whole model's, the same bytes from any layout.
    assert (first / "model.safetensors").read_bytes() == (straight / "model.safetensors").read_bytes()


def test_tensor_parallelism_halves_the_parameter_state_of_each_rank(tmp_path):
    def memory(np, tp):
        proc = train(np, BASE + ["training.steps=1", f"parallelism.tensor_parallel_degree={tp}",
                                 f"job.dump_folder={tmp_path / f'tp{tp}'}"])
        line = next(l for l in proc.stdout.splitlines() if l.startswith("phase=memory "))
        return int(re.search(r"optimizer_state_bytes=(\d+)", line).group(1))
    # The norms are whole on every rank: a little more than half.
    one, two = memory(1, 1), memory(2, 2)
    assert 0.5 * one < two < 0.52 * one, (one, two)


@pytest.mark.parametrize("np,tp,zero_stage", [(2, 2, 1), (4, 2, 0), (4, 2, 3), (4, 4, 1)])
def test_the_memory_planned_before_allocating_is_this_ranks_part(tmp_path, np, tp, zero_stage):
    """The memory check plans rank 0's parts of the table, not the whole model: its model state is
    what rank 0 then allocates, and the whole model's plan would be larger."""
    proc = train(np, BASE + ["training.steps=1", f"parallelism.tensor_parallel_degree={tp}",
                             f"parallelism.zero_stage={zero_stage}", f"job.dump_folder={tmp_path / 'run'}"])
    planned = int(re.search(r"^phase=memory_check .*model_state_bytes=(\d+)", proc.stdout, re.M).group(1))
    allocated = int(re.search(r"^phase=memory .*model_state_bytes=(\d+)", proc.stdout, re.M).group(1))
    assert planned == allocated, (planned, allocated)
    whole = train(np // tp, BASE + ["training.steps=1", f"parallelism.zero_stage={zero_stage}",
                                    f"job.dump_folder={tmp_path / 'whole'}"])
    unsplit = int(re.search(r"^phase=memory_check .*model_state_bytes=(\d+)", whole.stdout, re.M).group(1))
    assert planned < 0.6 * unsplit, (planned, unsplit)


def test_a_stopped_rank_in_a_tensor_parallel_group_aborts_the_job_naming_the_group(tmp_path):
    run_dir = tmp_path / "run"
    # Rank 0 may be waiting in a tensor-parallel exchange or in a collective over the job (the
    # gradient norm's): either way the message names the group and its ranks.
    assert_stopped_rank_times_out(crucible_binary(), run_dir, BASE + [
        "training.steps=100000", "parallelism.tensor_parallel_degree=2", "comm.train_timeout_seconds=3",
        f"job.dump_folder={run_dir}"], "tensor_parallel group|world = tensor_parallel group")


def test_a_tensor_parallel_group_across_hosts_is_warned_of_by_the_job_itself(tmp_path):
    """Whatever started it: rank 1 runs in a UTS namespace of its own, so its host name is
    another; rank 0 warns once for the group, and a group on one host gets no warning."""
    if subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode != 0:
        pytest.skip("this machine cannot create a UTS namespace (unshare --uts), so no second host name")
    settings = BASE + ["training.steps=1", "parallelism.tensor_parallel_degree=2"]
    one_host = train(2, settings + [f"job.dump_folder={tmp_path / 'one'}"])
    assert "spans" not in one_host.stderr, one_host.stderr
    command = [crucible_binary(), "train"] + sum((["--set", item] for item in settings + [
        f"job.dump_folder={tmp_path / 'two'}"]), [])
    quoted = " ".join("'" + part + "'" for part in command)
    proc = subprocess.run(["mpirun"] + sum((["-x", k] for k in MPI_ENV), []) + ["-np", "1"] + command +
                          [":", "-np", "1", "unshare", "--uts", "sh", "-c", f"hostname node-b && exec {quoted}"],
                          capture_output=True, text=True, env=dict(os.environ, **MPI_ENV), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    warnings = [l for l in proc.stderr.splitlines() if "spans 2 hosts" in l]
    assert len(warnings) == 1, proc.stderr
    assert warnings[0].startswith("[rank 0] warning: tensor_parallel group: job ranks 0-1 spans 2 hosts (")
    assert "node-b" in warnings[0] and "parallelism.tensor_parallel_degree = 2" in warnings[0]


@pytest.mark.parametrize("np,settings,message", [
    (3, ["parallelism.tensor_parallel_degree=2"],
     "parallelism.tensor_parallel_degree = 2: parallelism degrees (data_parallel=-1, expert_parallel=1, "
     "tensor_parallel=2) do not divide the job's 3 ranks"),
    (1, ["model.n_kv_heads=2"], "model.n_kv_heads = 2 is not divisible by the 4 tensor-parallel chunks"),
    (1, ["parallelism.tensor_parallel_chunks=3"], "not a power of two"),
    (1, ["optimizer.name=Muon"], "choose an elementwise optimizer"),
    (1, ["debug.portable_exact=true"], "debug.portable_exact has no portable tensor-parallel kernels"),
    (1, ["parallelism.sequence_parallel=true", "training.seq_len=30"],
     "parallelism.sequence_parallel = true: training.seq_len = 30 does not divide into the 4 tensor-parallel "
     "chunks"),
    (1, ["parallelism.sequence_parallel=true", "parallelism.tensor_parallel_chunks=1"],
     "parallelism.sequence_parallel = true splits the rows of a tensor-parallel model, and this run has none"),
])
def test_what_tensor_parallelism_cannot_cut_is_refused_in_one_line(tmp_path, np, settings, message):
    proc = train(np, BASE + settings + [f"job.dump_folder={tmp_path / 'run'}"], check=False)
    assert proc.returncode == 2, proc.stderr
    errors = [l for l in proc.stderr.splitlines() if message in l]
    assert errors, proc.stderr
    assert not os.path.exists(tmp_path / "run" / "metrics.jsonl")


GOLDEN_TP = REPO / "tests" / "golden" / "smoke-tp.json"


@pytest.mark.parametrize("ranks,tp", [(1, 1), (2, 2), (4, 4), (4, 2)])
def test_the_tensor_parallel_smoke_gate_passes_at_every_degree_against_one_golden(tmp_path, ranks, tp):
    proc = run_crucible("smoke", "--tp", tp, "--ranks", ranks, "--golden", GOLDEN_TP, "--work-dir", tmp_path)
    assert "smoke: PASS" in proc.stdout, proc.stdout
    assert f"ranks={ranks} tensor_parallel={tp}" in proc.stdout


def test_the_smoke_gate_passes_with_sequence_parallelism_against_the_same_golden(tmp_path):
    proc = run_crucible("smoke", "--tp", 2, "--ranks", 2, "--golden", GOLDEN_TP, "--work-dir", tmp_path,
                        "--set", "parallelism.sequence_parallel=true")
    assert "smoke: PASS" in proc.stdout, proc.stdout


def test_the_smoke_gate_catches_the_loss_divided_by_the_data_parallel_size_under_tp2(tmp_path):
    """The reference team's bug: at TP = 2 the logged loss was the true one divided by the DP size;
    the gradients were right. debug.fake_loss_divisor emulates it on 4 ranks (DP 2 x TP 2)."""
    proc = run_crucible("smoke", "--tp", 2, "--ranks", 4, "--golden", GOLDEN_TP, "--work-dir", tmp_path,
                        "--set", "debug.fake_loss_divisor=2", check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "smoke: FAIL first difference at step 1: loss " in proc.stdout, proc.stdout


def test_launch_passes_the_degree_and_its_dry_run_shows_the_groups(tmp_path):
    proc = run_crucible("launch", "--run-dir", tmp_path / "run", "--np", 4, "--ppn", 4, "--oversubscribe",
                        "--tp", 2, "--dry-run", "--", "crucible", "train")
    assert "--set parallelism.tensor_parallel_degree=2" in proc.stdout, proc.stdout
    assert "tensor parallel: degree 2, 2 group(s), data-parallel degree 2" in proc.stdout
    assert "  group 0: ranks 0-1 on " in proc.stdout and "  group 1: ranks 2-3 on " in proc.stdout
    refused = run_crucible("launch", "--run-dir", tmp_path / "run", "--np", 3, "--oversubscribe", "--tp", 2,
                           "--dry-run", "--", "crucible", "train", check=False)
    assert refused.returncode == 2 and "--tp 2 does not divide the 3 ranks" in refused.stderr, refused.stderr
