"""Muon, Mano and Mano_v2 through `crucible train` (src/optim/muon.cc, mano.cc; docs/optimizers.md): bad
settings are one-line errors naming the key with exit 2, an unknown optimizer name lists them, and
a tiny run with each trains (the loss falls) and writes each tensor's state under its optimizer's
names in optimizer.safetensors."""
import json
import struct
import subprocess

import pytest

from conftest import crucible_binary

TINY = ["model.vocab_size=256", "model.dim=32", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2",
        "model.ffn_hidden_dim=96", "training.seq_len=16", "training.local_batch_size=1",
        "training.global_batch_size=4", "metrics.peak_gflops=10", "lr_scheduler.warmup_steps=1",
        "lr_scheduler.decay_type=constant", "optimizer.lr=0.02"]


def crucible_train(run_dir, settings):
    args = [crucible_binary(), "train"]
    for item in TINY + settings + [f"job.dump_folder={run_dir}"]:
        args += ["--set", item]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("setting,message", [
    ("optimizer.ns_steps=0", "optimizer.ns_steps = 0 is out of range"),
    ("optimizer.ns_precision=fp8", "optimizer.ns_precision: expected fp32 or bf16"),
    ("optimizer.muon_scale=adam", "optimizer.muon_scale: expected moonlight or keller"),
    ("optimizer.name=Adam", "choose one of AdamW, Lion, Mano, Mano_v2, Muon, SGD"),
])
def test_bad_settings_are_one_line_errors_with_exit_2(tmp_path, setting, message):
    proc = crucible_train(tmp_path / "run", ["optimizer.name=Muon", setting])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and message in errors[0], proc.stderr


def safetensors_names(path):
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    return set(json.loads(data[8:8 + size])) - {"__metadata__"}


@pytest.mark.parametrize("optimizer,names", [
    ("Muon", {"momentum_buffer", "ns_max_abs", "ns_orthogonality", "exp_avg", "exp_avg_sq"}),
    ("Mano", {"momentum_buffer", "mano_steps", "update_rms", "exp_avg", "exp_avg_sq"}),
    ("Mano_v2", {"momentum_buffer", "mano_steps", "update_rms", "exp_avg", "exp_avg_sq"}),
])
def test_a_tiny_run_trains_and_checkpoints_each_optimizers_state(tmp_path, optimizer, names):
    run_dir = tmp_path / "run"
    proc = crucible_train(run_dir, [f"optimizer.name={optimizer}", "training.steps=8", "checkpoint.interval=8"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    losses = [json.loads(line)["loss"] for line in open(run_dir / "metrics.jsonl")]
    assert losses[-1] < losses[0], losses
    saved = safetensors_names(run_dir / "ckpt/step-8/optimizer.safetensors")
    assert {name.split(".")[0] for name in saved} == names
    assert "momentum_buffer.model.layers.0.self_attn.q_proj.weight" in saved
    # The diagnostics of every update, the largest over the matrices (docs/optimizers.md).
    records = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    if optimizer == "Muon":
        for r in records:  # five quintic steps leave singular values in about 0.7..1.2
            assert 0.5 < r["muon/ns_max_abs"] < 2 and 0 < r["muon/ns_orthogonality"] < 1, r
    else:
        for r in records:  # 0.2 sqrt(size_d) U has RMS 0.2 per matrix
            assert abs(r["mano/update_rms"] - 0.2) < 1e-3, r
