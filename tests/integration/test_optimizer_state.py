"""The optimizer state of a matrices-only optimizer (Muon) with AdamW on the other groups: each state
is kept by the tensors of its own group only (StateSpec::carried_by, optim/optimizer.h). So
optimizer.safetensors has momentum_buffer.* for the hidden matrices and exp_avg.* / exp_avg_sq.*
for the embedding, norms and head, and nothing else, in the same bytes for every rank count and
ZeRO stage; a checkpoint written before (every state for every tensor, zeros in the other group's)
resumes bit-exactly, and one whose extra entry is not zero is refused naming it; the phase=memory
line counts what the state really is."""
import ctypes
import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import crucible_binary
from rank_runs import mpirun_train, steps_and_digest
from safetensors_io import read_safetensors, write_safetensors

TINY = ["model.vocab_size=256", "model.dim=32", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2",
        "model.ffn_hidden_dim=96", "training.seq_len=16", "training.local_batch_size=1",
        "training.global_batch_size=8", "metrics.peak_gflops=10", "lr_scheduler.warmup_steps=1",
        "lr_scheduler.decay_type=constant", "optimizer.lr=0.01", "optimizer.name=Muon"]
MATRICES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MUON_STATE = {"momentum_buffer": 0, "ns_max_abs": 1, "ns_orthogonality": 1}  # name: floats per tensor (0: numel)
ADAMW_STATE = {"exp_avg": 0, "exp_avg_sq": 0}


def train(np_, run_dir, settings, check=True):
    return mpirun_train([crucible_binary(), "train"], np_, run_dir, TINY + settings, check=check)


def is_matrix(name):
    return any(f".{m}." in name for m in MATRICES)


def table(run_dir):
    """The parameter table: {name: shape}, from the run's final weights."""
    weights, _ = read_safetensors(run_dir / "model.safetensors")
    return {name: list(w.shape) for name, w in weights.items()}


def expected_entries(params):
    """{"<state>.<param>": shape} that optimizer.safetensors must hold."""
    entries = {}
    for name, shape in params.items():
        for state, floats in (MUON_STATE if is_matrix(name) else ADAMW_STATE).items():
            entries[f"{state}.{name}"] = [floats] if floats else shape
    return entries


@pytest.mark.parametrize("layouts", [[(1, 0), (2, 0), (2, 1), (2, 3), (4, 0), (4, 1), (4, 3)]])
def test_each_tensor_keeps_only_its_groups_state_in_the_same_bytes_on_every_layout(tmp_path, layouts):
    reference_dir = tmp_path / "np1"
    reference = steps_and_digest(train(1, reference_dir, ["training.steps=3", "checkpoint.interval=3"]),
                                 reference_dir, ("loss",))
    optimizer_file = reference_dir / "ckpt/step-3/optimizer.safetensors"
    state, _ = read_safetensors(optimizer_file)
    params = table(reference_dir)
    assert {name: list(v.shape) for name, v in state.items()} == expected_entries(params)
    assert not [n for n in state if n.startswith("exp_avg") and is_matrix(n)]
    assert not [n for n in state if n.startswith("momentum_buffer") and not is_matrix(n)]
    assert np.any(state["exp_avg.model.embed_tokens.weight"] != 0)  # trained, not zeros
    digest = hashlib.sha256(optimizer_file.read_bytes()).hexdigest()
    for np_, stage in layouts[1:]:
        run_dir = tmp_path / f"np{np_}-z{stage}"
        proc = train(np_, run_dir, ["training.steps=3", "checkpoint.interval=3", f"parallelism.zero_stage={stage}"])
        assert steps_and_digest(proc, run_dir, ("loss",)) == reference, (np_, stage)
        written = run_dir / "ckpt/step-3/optimizer.safetensors"
        assert hashlib.sha256(written.read_bytes()).hexdigest() == digest, (np_, stage)


def xxh3_128(data):
    """The MANIFEST's checksum (common/hash.h: XXH3-128, high then low 64 bits in hex)."""
    class Hash128(ctypes.Structure):
        _fields_ = [("low64", ctypes.c_uint64), ("high64", ctypes.c_uint64)]
    library = ctypes.CDLL("libxxhash.so.0")
    library.XXH3_128bits.restype = Hash128
    library.XXH3_128bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    h = library.XXH3_128bits(data, len(data))
    return f"{h.high64:016x}{h.low64:016x}"


def rewrite_in_old_layout(checkpoint, params, nonzero=None):
    """optimizer.safetensors as the code before per-group state wrote it: every state name for every
    tensor, zeros where the tensor's optimizer keeps none (or 1.0 in entry `nonzero`); MANIFEST and
    COMPLETE follow, so the checkpoint still verifies."""
    path = checkpoint / "optimizer.safetensors"
    state, metadata = read_safetensors(path)
    tensors = dict(state)
    for name, shape in params.items():
        for state_name, floats in {**MUON_STATE, **ADAMW_STATE}.items():
            entry = f"{state_name}.{name}"
            if entry not in tensors:
                tensors[entry] = np.zeros([floats] if floats else shape, dtype=np.float32)
                if entry == nonzero:
                    tensors[entry].flat[0] = 1.0
    write_safetensors(path, dict(sorted(tensors.items())), metadata)
    refresh_manifest(checkpoint)
    return len(tensors) - len(state)


def refresh_manifest(checkpoint):
    """MANIFEST and COMPLETE after optimizer.safetensors was rewritten: the checkpoint verifies."""
    path = checkpoint / "optimizer.safetensors"
    manifest = (checkpoint / "MANIFEST").read_text().splitlines()
    data = path.read_bytes()
    manifest = [f"{xxh3_128(data)} {len(data)} optimizer.safetensors" if line.endswith(" optimizer.safetensors")
                else line for line in manifest]
    (checkpoint / "MANIFEST").write_text("\n".join(manifest) + "\n")
    complete = (checkpoint / "COMPLETE").read_text()
    manifest_hash = xxh3_128((checkpoint / "MANIFEST").read_bytes())
    (checkpoint / "COMPLETE").write_text(re.sub(r"manifest_xxh3=\w+", f"manifest_xxh3={manifest_hash}", complete))


def test_a_checkpoint_with_every_state_for_every_tensor_resumes_bit_exactly_unless_an_extra_is_not_zero(tmp_path):
    settings = ["training.steps=6", "checkpoint.interval=3", "checkpoint.keep_latest_k=0"]
    straight = tmp_path / "straight"
    reference = steps_and_digest(train(1, straight, settings), straight, ("loss", "grad_norm"))
    params = table(straight)

    old = tmp_path / "old"
    shutil.copytree(straight, old)
    shutil.rmtree(old / "ckpt/step-6")
    (old / "ckpt/latest").write_text("step-3\n")
    (old / "metrics.jsonl").write_text("".join((straight / "metrics.jsonl").read_text().splitlines(True)[:3]))
    refused = tmp_path / "refused"
    shutil.copytree(old, refused)
    matrices = sum(map(is_matrix, params))
    assert rewrite_in_old_layout(old / "ckpt/step-3", params) == 2 * matrices + 3 * (len(params) - matrices)
    proc = train(2, old, settings + ["parallelism.zero_stage=1"])
    assert "phase=resume from=" in proc.stdout and "step=3" in proc.stdout
    assert steps_and_digest(proc, old, ("loss", "grad_norm")) == reference
    assert ((old / "ckpt/step-6/optimizer.safetensors").read_bytes()
            == (straight / "ckpt/step-6/optimizer.safetensors").read_bytes())

    entry = "exp_avg.model.layers.1.mlp.down_proj.weight"
    rewrite_in_old_layout(refused / "ckpt/step-3", params, nonzero=entry)
    proc = train(1, refused, settings, check=False)
    assert proc.returncode == 65, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("crucible: error:")]
    assert len(errors) == 1 and entry in errors[0] and "non-zero" in errors[0], proc.stderr


@pytest.mark.parametrize("optimizer, entry", [
    (["optimizer.name=Muon"], "momentum_buffer.model.layers.0.mlp.up_proj.weight"),
    (["optimizer.name=SophiaG", "optimizer.sophia_k=2", "optimizer.lr=0.003"], "hessian.model.norm.weight"),
])
def test_a_non_finite_optimizer_state_is_refused_at_load_naming_it_and_the_checkpoint_before(tmp_path, optimizer,
                                                                                           entry):
    # A NaN in a state the checkpoint verifies with (MANIFEST and COMPLETE rewritten for it): a
    # SophiaG Hessian used to resume with 100% clipping, a Muon momentum to diverge at once and name
    # this very checkpoint to roll back to.
    run_dir = tmp_path / "run"
    settings = optimizer + ["checkpoint.interval=3", "checkpoint.keep_latest_k=0"]
    train(1, run_dir, settings + ["training.steps=6"])
    path = run_dir / "ckpt/step-6/optimizer.safetensors"
    state, metadata = read_safetensors(path)
    state = {name: np.array(values) for name, values in state.items()}
    state[entry].flat[1] = np.nan
    write_safetensors(path, state, metadata)
    refresh_manifest(run_dir / "ckpt/step-6")
    proc = train(1, run_dir, settings + ["training.steps=8"], check=False)
    assert proc.returncode == 65, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("crucible: error:")]
    assert len(errors) == 1, proc.stderr
    step3 = run_dir / "ckpt" / "step-3"
    assert f"optimizer.safetensors: tensor '{entry}' holds 1 non-finite value" in errors[0], errors[0]
    assert f"roll back to {step3} (--resume {step3})" in errors[0], errors[0]
    assert not [line for line in proc.stdout.splitlines() if line.startswith("step=7 ")]


def rank0_state_bytes(params, world):
    """Rank 0's optimizer state under ZeRO-1 on `world` ranks: the matrices AssignMatrixOwners
    (optim/matrix_owners.h) gives it, whole (Muon's buffer and 2 floats), and AdamW's two buffers
    of the other tensors' elements inside its flat range (shards of 16384-element chunks)."""
    sizes = [int(np.prod(shape)) for shape in params.values()]  # table order: the file's
    offsets = np.cumsum([0] + sizes)
    matrices = [t for t, name in enumerate(params) if is_matrix(name)]
    load, owner = [0] * world, {}
    for t in sorted(matrices, key=lambda t: -sizes[t]):  # stable: equal sizes in table order
        owner[t] = load.index(min(load))
        load[owner[t]] += sizes[t]
    chunk = 16384
    shard = -(-(-(-offsets[-1] // chunk)) // world) * chunk
    expected = 0
    for t, size in enumerate(sizes):
        if t in owner:
            expected += 4 * (size + 2) if owner[t] == 0 else 0
        else:
            expected += 4 * 2 * max(0, min(offsets[t] + size, shard) - offsets[t])
    return expected


def test_the_memory_report_counts_each_tensors_own_state(tmp_path):
    run_dir = tmp_path / "np1"
    proc = train(1, run_dir, ["training.steps=1"])
    params = table(run_dir)
    expected = 0
    for name, shape in params.items():
        numel = int(np.prod(shape))
        expected += 4 * (numel + 2) if is_matrix(name) else 4 * 2 * numel  # Muon's 3 states; AdamW's 2
    memory_line = re.compile(r"^phase=memory .*optimizer_state_bytes=(\d+)", re.M)
    reported = int(memory_line.search(proc.stdout).group(1))
    assert reported == expected
    everything = sum(4 * (3 * int(np.prod(s)) + 2) for s in params.values())  # every name for every tensor
    assert reported < 0.7 * everything
    assert rank0_state_bytes(params, 1) == expected
    # Two ranks at ZeRO-1: rank 0 holds its matrices whole and AdamW's elements of its range (the
    # embedding, 8192 of the first shard's 16384 x 2, whole; the head, at the end, not at all).
    proc = train(2, tmp_path / "np2", ["training.steps=1", "parallelism.zero_stage=1"])
    assert int(memory_line.search(proc.stdout).group(1)) == rank0_state_bytes(params, 2)
