"""A whole-matrix optimizer under ZeRO-1/3 across ranks (distributed/sharded_optimizer.h): each
tensor is updated whole by its owner rank, its gradient (and under ZeRO-3 its weight) pieces moved
there from the flat-range holders and the updated pieces back. The optimizers: a toy registered
only in tests/mpi/train/main.cc (test_mpi_train, `crucible train` with that one more optimizer),
and the real Muon and Mano (with AdamW on the embeddings, head and norms; test_mpi_train links
every optimizer of src/optim/, so it trains them as `crucible train` does) on fewer layouts,
trained on a Llama of 41k parameters, whose tensors the 16384-element shards cut, and on 4 ranks
a rank whose shard holds nothing. Every rank count, stage and overlap setting must give the losses,
gradient norms and final weights of one rank, checkpoints the same optimizer.safetensors bytes,
and a resume on another rank count and stage the bits of the uninterrupted run."""
import hashlib
import json
import re
from pathlib import Path

import pytest

from conftest import crucible_binary
from rank_runs import mpirun_train, resume_runs, steps_and_digest

TINY = ["model.vocab_size=256", "model.dim=32", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2",
        "model.ffn_hidden_dim=96", "training.seq_len=16", "training.local_batch_size=1",
        "training.global_batch_size=8", "metrics.peak_gflops=10", "lr_scheduler.warmup_steps=1",
        "lr_scheduler.decay_type=constant", "optimizer.lr=0.01"]
TOY = "ToyRowNormalizedMomentum"
# Muon and Mano: fewer layouts (every rank count and stage once) to keep make test fast.
LAYOUTS = {TOY: [(2, 0, "true"), (2, 1, "true"), (2, 1, "false"), (2, 3, "true"), (2, 3, "false"),
                 (4, 1, "true"), (4, 3, "true"), (4, 3, "false")],
           "Muon": [(2, 0, "true"), (2, 1, "true"), (4, 3, "false")],
           "Mano": [(2, 0, "true"), (2, 3, "true"), (4, 1, "true")]}


def train_program():
    path = Path(crucible_binary()).resolve().parent / "test_mpi_train"
    assert path.exists(), f"{path} not found: build it (cmake --build build)"
    return str(path)


def train(np, run_dir, settings, optimizer=TOY):
    return mpirun_train([train_program()], np, run_dir, TINY + [f"optimizer.name={optimizer}"] + settings)


def result(proc, run_dir):
    """Per step (step, loss, grad_norm, the optimizer's metrics), and the final weights' xxh3."""
    steps, digest = steps_and_digest(proc, run_dir, ("loss", "grad_norm"))
    metrics = [sorted((k, v) for k, v in json.loads(line).items() if "/" in k)
               for line in open(run_dir / "metrics.jsonl")]
    return steps, metrics, digest


def file_digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("optimizer", [TOY, "Muon", "Mano"])
def test_every_rank_count_stage_and_overlap_gives_the_bits_of_one_rank(tmp_path, optimizer):
    reference = result(train(1, tmp_path / "np1", ["training.steps=4"], optimizer), tmp_path / "np1")
    assert len(reference[0]) == 4
    for np, stage, overlap in LAYOUTS[optimizer]:
        run_dir = tmp_path / f"np{np}-z{stage}-{overlap}"
        proc = train(np, run_dir, ["training.steps=4", f"parallelism.zero_stage={stage}",
                                   f"parallelism.overlap_grad_reduce={overlap}"], optimizer)
        assert f"ranks={np} zero_stage={stage}" in proc.stdout
        assert result(proc, run_dir) == reference, (np, stage, overlap)
        # The memory check before allocating plans at least what rank 0 then holds (an owner's
        # tensors may exceed an even share by up to the largest one).
        planned = re.search(r"^phase=memory_check .*model_state_bytes=(\d+)", proc.stdout, re.M)
        allocated = re.search(r"^phase=memory .*model_state_bytes=(\d+)", proc.stdout, re.M)
        assert planned and allocated, proc.stdout
        assert int(planned.group(1)) >= int(allocated.group(1)), (np, stage, overlap, proc.stdout)


@pytest.mark.parametrize("optimizer", [TOY, "Muon", "Mano"])
def test_a_two_rank_zero1_checkpoint_resumes_bit_exact_on_four_ranks_zero3_and_on_one(tmp_path, optimizer):
    def train_with(np, run_dir, settings):
        return train(np, run_dir, settings, optimizer)
    (straight_proc, straight), written, resumed = resume_runs(train_with, tmp_path, [(4, 3), (1, 1)])
    reference = result(straight_proc, straight)
    # Two ranks at ZeRO-1 saved step 3 (and stopped there): the optimizer state every owner
    # gathered to rank 0 is the file one rank writes.
    for name in ("optimizer.safetensors", "model.safetensors"):
        assert file_digest(written / "ckpt/step-3" / name) == file_digest(straight / "ckpt/step-3" / name), name
    for np, stage, proc, run_dir in resumed:
        assert "phase=resume from=" in proc.stdout and "step=3" in proc.stdout
        assert result(proc, run_dir) == reference, (np, stage)
        assert (file_digest(run_dir / "ckpt/step-6/optimizer.safetensors")
                == file_digest(straight / "ckpt/step-6/optimizer.safetensors")), (np, stage)
