"""Data parallelism over MPI: bit-identical results for any number of ranks and ZeRO stage,
resume on a different world size, the silent-data-corruption check, collective timeouts."""
import json
import math
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import crucible_binary
from rank_runs import assert_stopped_rank_times_out

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMP_NUM_THREADS": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}
BASE = ["model.flavor=debug", "training.seq_len=32", "training.local_batch_size=2", "training.global_batch_size=8",
        "metrics.peak_gflops=10", "lr_scheduler.warmup_steps=2", "lr_scheduler.decay_type=constant",
        "optimizer.lr=1e-3"]


def mpirun(np, settings, timeout=300, check=True):
    args = ["mpirun", "-np", str(np)]
    for key in MPI_ENV:
        args += ["-x", key]
    args.append(crucible_binary())
    args.append("train")
    for item in settings:
        args += ["--set", item]
    env = dict(os.environ, **MPI_ENV)
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"mpirun -np {np} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def result(proc, run_dir):
    losses = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    digest = re.search(r"weights_xxh3=([0-9a-f]+)", proc.stdout).group(1)
    return [(r["step"], r["loss"], r["grad_norm"]) for r in losses], digest


@pytest.mark.parametrize("zero_stage", [0, 1, 3])
def test_one_two_and_four_ranks_give_identical_losses_and_weights(tmp_path, zero_stage):
    results = {}
    for np in (1, 2, 4):
        run_dir = tmp_path / f"np{np}"
        proc = mpirun(np, BASE + ["training.steps=6", f"parallelism.zero_stage={zero_stage}",
                                  f"job.dump_folder={run_dir}", "metrics.per_rank=true"])
        results[np] = result(proc, run_dir)
        # Only rank 0 prints progress lines.
        assert len([l for l in proc.stdout.splitlines() if l.startswith("step=")]) == 6
        if np > 1:  # every rank's own metrics, whose loss shares add up to the global loss
            shares = [json.loads(open(run_dir / f"metrics-rank{r}.jsonl").readline()) for r in range(np)]
            total = sum(s["local_loss_sum"] for s in shares) / sum(s["local_valid_tokens"] for s in shares)
            assert abs(total - results[np][0][0][1]) < 1e-9
        first_loss = results[np][0][0][1]
        assert abs(first_loss - math.log(2048)) < 0.1, first_loss  # not divided by the DP size
    assert results[1] == results[2] == results[4]


def test_every_stage_with_accumulation_tied_head_and_overlap_on_or_off_matches_one_process(tmp_path):
    # Four micro-batches per rank on two ranks, a tied head (the embedding unit gets gradient at
    # the start and the end of the backward pass), overlapped or blocking reductions.
    settings = BASE + ["training.steps=4", "training.local_batch_size=1", "model.tie_embeddings=true"]
    straight = tmp_path / "straight"
    reference = result(mpirun(1, settings + ["parallelism.zero_stage=0", f"job.dump_folder={straight}"]),
                       straight)
    for zero_stage in (0, 1, 3):
        for overlap in ("true", "false"):
            run_dir = tmp_path / f"z{zero_stage}-{overlap}"
            proc = mpirun(2, settings + [f"parallelism.zero_stage={zero_stage}", f"job.dump_folder={run_dir}",
                                         f"parallelism.overlap_grad_reduce={overlap}"])
            assert f"overlap={'on' if overlap == 'true' else 'off'}" in proc.stdout
            assert result(proc, run_dir) == reference, (zero_stage, overlap)


@pytest.mark.parametrize("mode", ["block48", "block32"])
def test_each_compact_exact_format_gives_identical_bits_on_one_two_and_four_ranks_at_every_stage(tmp_path, mode):
    # Two micro-batches per rank on two ranks (so the local sums and the wire both see several
    # contributions); the narrow wire must carry every reduction (wide_reductions=0).
    settings = BASE + ["training.steps=4", "training.local_batch_size=1", f"parallelism.exact_reduction={mode}"]
    results = {}
    for np in (1, 2, 4):
        for zero_stage in (0, 1, 3):
            run_dir = tmp_path / f"np{np}-z{zero_stage}"
            proc = mpirun(np, settings + [f"parallelism.zero_stage={zero_stage}", f"job.dump_folder={run_dir}"])
            assert f"exact_reduction={mode}" in proc.stdout
            assert f"phase=exact_reduction format={mode} wide_reductions=0" in proc.stdout, proc.stdout
            results[(np, zero_stage)] = result(proc, run_dir)
    for zero_stage in (0, 1, 3):  # the blocking reductions too
        run_dir = tmp_path / f"np2-z{zero_stage}-blocking"
        proc = mpirun(2, settings + [f"parallelism.zero_stage={zero_stage}", f"job.dump_folder={run_dir}",
                                     "parallelism.overlap_grad_reduce=false"])
        assert "wide_reductions=0" in proc.stdout
        results[(2, zero_stage, "blocking")] = result(proc, run_dir)
    reference = results[(1, 0)]
    assert all(r == reference for r in results.values()), {k: v[1] for k, v in results.items()}
    # The format is a different grid from fixed128's: the same run there gives other bits.
    fixed = tmp_path / "fixed128"
    proc = mpirun(2, BASE + ["training.steps=4", "training.local_batch_size=1", f"job.dump_folder={fixed}",
                             "parallelism.exact_reduction=fixed128"])
    assert result(proc, fixed)[1] != reference[1]


@pytest.mark.parametrize("write_stage,resume_stage", [(1, 1), (3, 3), (3, 0)])
def test_checkpoint_of_two_ranks_resumes_bit_exact_on_one_and_four(tmp_path, write_stage, resume_stage):
    straight = tmp_path / "straight"
    reference = result(mpirun(1, BASE + ["training.steps=8", f"job.dump_folder={straight}"]), straight)
    for resume_ranks in (1, 4):
        run_dir = tmp_path / f"resumed{resume_ranks}"
        mpirun(2, BASE + ["training.steps=4", "checkpoint.interval=4", f"job.dump_folder={run_dir}",
                          f"parallelism.zero_stage={write_stage}"])
        proc = mpirun(resume_ranks, BASE + ["training.steps=8", "checkpoint.interval=4", f"job.dump_folder={run_dir}",
                                            f"parallelism.zero_stage={resume_stage}"])
        assert "phase=resume" in proc.stdout
        assert result(proc, run_dir) == reference


@pytest.mark.parametrize("mode", ["block48", "block32"])
def test_a_checkpoint_in_a_compact_format_resumes_bit_exact_on_other_rank_counts_and_stages(tmp_path, mode):
    settings = BASE + [f"parallelism.exact_reduction={mode}"]
    straight = tmp_path / "straight"
    reference = result(mpirun(1, settings + ["training.steps=8", f"job.dump_folder={straight}"]), straight)
    for resume_ranks, resume_stage in ((1, 0), (4, 1)):
        run_dir = tmp_path / f"resumed{resume_ranks}"
        mpirun(2, settings + ["training.steps=4", "checkpoint.interval=4", f"job.dump_folder={run_dir}",
                              "parallelism.zero_stage=3"])
        proc = mpirun(resume_ranks, settings + ["training.steps=8", "checkpoint.interval=4",
                                                f"job.dump_folder={run_dir}", f"parallelism.zero_stage={resume_stage}"])
        assert "phase=resume" in proc.stdout
        assert result(proc, run_dir) == reference


def memory_report(proc):
    line = next(l for l in proc.stdout.splitlines() if l.startswith("phase=memory "))
    reported = int(re.search(r"model_state_bytes=(\d+)", line).group(1))
    peaks = [int(v) for v in re.search(r"rss_bytes_per_rank=([\d,]+)", proc.stdout).group(1).split(",")]
    return reported, peaks


def test_memory_per_rank_follows_the_zero_formula(tmp_path):
    """The memory report against the formula of docs/distributed.md, and the formula against the
    ranks' measured peak memory: ZeRO-3 on 2 ranks holds half the weights, gradients and optimizer
    state of ZeRO-0, no full accumulator, and a few unit-sized buffers."""
    small = ["model.flavor=small", "training.seq_len=32", "training.local_batch_size=1", "metrics.peak_gflops=10",
             "training.steps=2", "checkpoint.enable=false"]
    P = 25795072  # small
    chunk, world = 1 << 14, 2
    shard = -(-(-(-P // chunk)) // world) * chunk
    padded = shard * world
    vocab, dim, layers, ffn, kv_dim = 8192, 512, 6, 1376, 256  # 4 of 8 heads of 64 for keys, values
    layer = 2 * dim + 2 * dim * dim + 2 * kv_dim * dim + 3 * dim * ffn
    units = [vocab * dim] + [layer] * layers + [dim + vocab * dim]
    piece = min(1 << 19, max(units))
    formula = {
        0: (4 + 4 + 16) * padded + 8 * P,                 # weights, grads, accumulator; AdamW m, v
        1: (4 + 4 + 16) * padded + 8 * min(shard, P)      # optimizer state of the shard only
           + 8 * 16 * min(piece, shard),                  # overlapped reduce-scatter receive buffers
        3: (4 + 4 + 16) * shard + 8 * min(shard, P)        # shards of weights, grads, sums; state
           + 3 * 4 * max(units) + 4 * (units[0] + max(units[1:]))  # gathered units, unit gradients
           + 4 * 16 * (piece + min(piece, shard)),        # reduction pieces in flight
    }
    measured = {}
    for zero_stage in (0, 1, 3):
        proc = mpirun(world, small + [f"parallelism.zero_stage={zero_stage}",
                                      f"job.dump_folder={tmp_path / str(zero_stage)}"])
        assert f"params={P} " in proc.stdout
        reported, peaks = memory_report(proc)
        assert reported == formula[zero_stage], (zero_stage, reported, formula[zero_stage])
        measured[zero_stage] = peaks[1]  # rank 1: rank 0 also gathers the full weights at the end
        # Model state is most of a rank's peak; the rest is code, MPI and activations.
        assert formula[zero_stage] < peaks[1] < formula[zero_stage] + 400 * 2**20, (zero_stage, peaks)
    saved = formula[0] - formula[3]
    assert measured[0] - measured[3] > 0.8 * saved, measured


# ZeRO-0/1 compare their replicas before a step (the step that showed the fault has printed);
# ZeRO-3 has no replica: the ranks compare what they gathered, at the end of a check step,
# before its update.
@pytest.mark.parametrize("zero_stage,interval,detected_after,printed",
                         [(0, 2, 4, 4), (1, 1, 3, 3), (3, 1, 3, 2), (3, 2, 4, 3)])
def test_consistency_check_names_the_corrupted_rank(tmp_path, zero_stage, interval, detected_after, printed):
    proc = mpirun(2, BASE + ["training.steps=8", f"parallelism.zero_stage={zero_stage}",
                             f"parallelism.consistency_check_steps={interval}", "debug.corrupt_rank=1",
                             "debug.corrupt_step=3", f"job.dump_folder={tmp_path / 'run'}"], check=False)
    assert proc.returncode != 0
    match = re.search(r"silent data corruption: rank (\d+) on host (\S+) .* at step (\d+)", proc.stderr)
    assert match, proc.stderr
    assert match.group(1) == "1" and int(match.group(3)) == detected_after
    steps = [l for l in proc.stdout.splitlines() if l.startswith("step=")]
    assert len(steps) == printed


def test_a_hung_rank_aborts_the_job_after_the_collective_timeout(tmp_path):
    run_dir = tmp_path / "run"
    # Two ranks of data parallelism: the data-parallel group is the whole job.
    assert_stopped_rank_times_out(crucible_binary(), run_dir, BASE + [
        "training.steps=1000", "comm.train_timeout_seconds=3", f"job.dump_folder={run_dir}"],
        "world = data_parallel group")


@pytest.mark.parametrize("zero_stage", [1, 3])
def test_a_rank_with_an_empty_shard_checkpoints_and_resumes(tmp_path, zero_stage):
    # 3 ranks and a model of two norm chunks: rank 2's ZeRO-1 shard is empty.
    tiny = ["model.flavor=debug", "model.dim=32", "model.n_layers=1", "model.n_heads=2", "model.n_kv_heads=2",
            "model.vocab_size=256", "model.ffn_hidden_dim=64", "training.seq_len=16", "training.local_batch_size=2",
            "training.global_batch_size=6", "metrics.peak_gflops=10", "checkpoint.interval=3"]
    straight = tmp_path / "straight"
    reference = result(mpirun(1, tiny + ["training.steps=6", f"job.dump_folder={straight}"]), straight)
    run_dir = tmp_path / "run"
    mpirun(3, tiny + ["training.steps=3", f"job.dump_folder={run_dir}", f"parallelism.zero_stage={zero_stage}"])
    proc = mpirun(3, tiny + ["training.steps=6", f"job.dump_folder={run_dir}", f"parallelism.zero_stage={zero_stage}"])
    assert "phase=resume" in proc.stdout
    assert result(proc, run_dir) == reference


def test_sigterm_under_zero3_checkpoints_and_resumes_bit_exact_on_four_ranks(tmp_path):
    """SIGTERM to one rank of a 2-rank ZeRO-3 job: the ranks agree on the step, rank 0 gathers the
    shards and writes the checkpoint, all exit 143; 4 ranks resume and end as one process does."""
    settings = BASE + ["training.steps=400", "checkpoint.interval=1000", "parallelism.zero_stage=3"]
    straight = tmp_path / "straight"
    reference = result(mpirun(1, settings + [f"job.dump_folder={straight}"]), straight)
    run_dir = tmp_path / "run"
    args = ["mpirun", "-np", "2"] + sum((["-x", k] for k in MPI_ENV), []) + [crucible_binary(), "train"]
    for item in settings + [f"job.dump_folder={run_dir}"]:
        args += ["--set", item]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, **MPI_ENV), start_new_session=True)
    for line in proc.stdout:
        if line.startswith("step=10 "):  # 390 steps (seconds) left to deliver the signal
            ranks = subprocess.run(["pgrep", "-f", f"job.dump_folder={run_dir}"], capture_output=True, text=True)
            pids = [int(p) for p in ranks.stdout.split() if int(p) != proc.pid]
            pids = [p for p in pids if "crucible" in open(f"/proc/{p}/cmdline").read().split("\0")[0]]
            os.kill(max(pids), signal.SIGTERM)
            break
    out, err = proc.communicate(timeout=120)
    stopped = re.search(r"stopped step=(\d+) signal=SIGTERM", out)
    assert proc.returncode == 143 and stopped, out + err
    proc = mpirun(4, settings + [f"job.dump_folder={run_dir}"])
    assert f"step={stopped.group(1)}" in proc.stdout.split("phase=resume from=")[1].split("\n")[0]
    assert result(proc, run_dir) == reference


@pytest.mark.parametrize("zero_stage", [1, 3])
def test_weights_that_go_non_finite_on_sharded_ranks_stop_every_rank_with_exit_3(tmp_path, zero_stage):
    # lr / (1 - beta1) overflows float32 in AdamW's first update: every rank's shard goes non-finite.
    run_dir = tmp_path / "run"
    proc = mpirun(2, BASE + ["training.steps=4", "optimizer.lr=3e38", "optimizer.weight_decay=0",
                             "lr_scheduler.warmup_steps=0", "checkpoint.interval=1",
                             f"parallelism.zero_stage={zero_stage}", f"job.dump_folder={run_dir}"], check=False)
    assert proc.returncode == 3, proc.stderr
    errors = [l for l in proc.stderr.splitlines() if l.startswith("crucible: error:")]
    assert len(errors) == 2, proc.stderr  # every rank names the same first tensor
    assert all("step 1: the optimizer update made the weights non-finite, first in "
               "model.embed_tokens.weight (element 0 = nan)" in e for e in errors), errors
    assert not (run_dir / "ckpt" / "step-1").exists() and not (run_dir / "model.safetensors").exists()


def mpmd(first, second, timeout=120, binaries=None):
    """One job of two ranks that got different --set overrides (mpirun -np 1 A : -np 1 B)."""
    binaries = binaries or [crucible_binary(), crucible_binary()]
    args = ["mpirun"] + sum((["-x", k] for k in MPI_ENV), [])
    for i, (binary, settings) in enumerate(zip(binaries, (first, second))):
        args += ([":"] if i else []) + ["-np", "1", binary, "train"] + sum((["--set", s] for s in settings), [])
    return subprocess.run(args, capture_output=True, text=True, env=dict(os.environ, **MPI_ENV), timeout=timeout)


@pytest.mark.parametrize("key,rank0,rank1", [("training.seq_len", "32", "64"), ("optimizer.lr", "0.001", "0.002")])
def test_ranks_given_different_configs_stop_at_start_naming_the_key_and_both_values(tmp_path, key, rank0, rank1):
    run_dir = tmp_path / "run"
    common = [s for s in BASE if not s.startswith(key + "=")] + ["training.steps=4", f"job.dump_folder={run_dir}"]
    proc = mpmd(common + [f"{key}={rank0}"], common + [f"{key}={rank1}"])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [l for l in proc.stderr.splitlines() if l.startswith("crucible: error:")]
    assert len(errors) == 2, proc.stderr  # every rank stops
    assert any(f"{key} is {rank0} on rank 0 but {rank1} on rank 1" in e for e in errors), errors
    assert "step=" not in proc.stdout
    assert not run_dir.exists()  # nothing was written


def test_ranks_running_different_crucible_binaries_stop_at_start(tmp_path):
    other = tmp_path / "crucible-other"
    other.write_bytes(open(crucible_binary(), "rb").read() + b"\0")  # runs the same, other bits
    other.chmod(0o755)
    settings = BASE + ["training.steps=4", f"job.dump_folder={tmp_path / 'run'}"]
    proc = mpmd(settings, settings, binaries=[crucible_binary(), str(other)])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert re.search(r"rank 1 runs crucible \S+ \(binary xxh3 [0-9a-f]+\) but rank 0 runs crucible \S+ "
                     r"\(binary xxh3 [0-9a-f]+\)", proc.stderr), proc.stderr
    assert "step=" not in proc.stdout


@pytest.mark.parametrize("zero_stage", [0, 1, 3])
def test_the_memory_planned_before_allocating_is_what_the_ranks_allocate(tmp_path, zero_stage):
    proc = mpirun(2, BASE + ["training.steps=1", f"parallelism.zero_stage={zero_stage}",
                             f"job.dump_folder={tmp_path / 'run'}"])
    planned = re.search(r"^phase=memory_check .*model_state_bytes=(\d+)", proc.stdout, re.M)
    allocated = re.search(r"^phase=memory .*model_state_bytes=(\d+)", proc.stdout, re.M)
    assert planned and allocated, proc.stdout
    assert int(planned.group(1)) == int(allocated.group(1))
    assert re.search(r"^phase=memory_check host=\S+ ranks_on_host=2 ", proc.stdout, re.M), proc.stdout


def test_ranks_that_share_a_host_are_refused_when_together_they_ask_for_more_than_it_has(tmp_path):
    available = next(int(l.split()[1]) * 1024 for l in open("/proc/meminfo") if l.startswith("MemAvailable:"))
    # ZeRO-0 keeps about 32 bytes per parameter on each rank, and the debug dims give 256 parameters per
    # vocabulary entry: a vocabulary for about 0.6 of the machine per rank, so 2 ranks ask for 1.2 of it.
    vocab = int(0.6 * available / (32 * 256))
    run_dir = tmp_path / "run"
    proc = mpirun(2, BASE + ["training.steps=1", "parallelism.zero_stage=0", "checkpoint.enable=false",
                             f"model.vocab_size={vocab}", f"job.dump_folder={run_dir}"], check=False, timeout=120)
    assert proc.returncode == 2, proc.stderr
    errors = [l for l in proc.stderr.splitlines() if l.startswith("crucible: error:")]
    assert errors and all("(2 ranks; rank 0:" in e and f"model.vocab_size = {vocab}" in e for e in errors), errors
    assert not run_dir.exists()


def test_a_peak_below_the_achieved_rate_is_reported_once_for_the_job(tmp_path):
    proc = mpirun(2, [s for s in BASE if not s.startswith("metrics.peak_gflops=")]
                  + ["metrics.peak_gflops=0.001", "training.steps=3", f"job.dump_folder={tmp_path / 'run'}"])
    warnings = [l for l in proc.stderr.splitlines() if "MFU is not reported" in l]
    assert len(warnings) == 1 and "step 1:" in warnings[0], proc.stderr
    assert all(l.endswith("mfu=nan") for l in proc.stdout.splitlines() if l.startswith("step=")), proc.stdout
