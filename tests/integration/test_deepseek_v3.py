"""The deepseek_v3 family (model/deepseek_v3.h) against an independent float64 PyTorch reference
written from the DeepSeek-V3 equations (deepseek_reference.py): MLA with and without query
compression, the dense first layer, MoE layers with grouped routing, shared experts, normalised
and unnormalised top-k weights, tied and untied heads.

Tolerances (Crucible runs in fp32): loss within 1e-6 and logits within 5e-6 absolute; each
gradient tensor within 2e-5 of the largest magnitude of that tensor; an expert no token chose
has a gradient of exactly zero (the reference has none). Both sides route independently, with
random balance biases; the experts chosen must agree for the gradients to, and each balance
bias's slot must hold its experts' load share above 1/E as the reference's choices count it.
"""
import json
import re

import numpy as np
import numpy as np_  # `np` is also a rank count below
import pytest

from conftest import STACKS, crucible_binary, python_env, run_crucible
from rank_runs import assert_stopped_rank_times_out
from safetensors_io import read_safetensors, write_safetensors

REFERENCE = "import sys, deepseek_reference; deepseek_reference.main(sys.argv[1:])"

BASE = {"vocab_size": 512, "dim": 64, "n_layers": 3, "n_heads": 4, "ffn_hidden_dim": 160,
        "q_lora_rank": 48, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
        "v_head_dim": 16, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 1, "norm_topk_prob": True, "tie_embeddings": False}

VARIANTS = {
    "compressed-queries-grouped": {},
    "plain-queries-no-shared-unnormalised-tied": {
        "q_lora_rank": 0, "n_shared_experts": 0, "norm_topk_prob": False, "n_group": 1, "topk_group": 1,
        "tie_embeddings": True, "v_head_dim": 24, "routed_scaling_factor": 1.0},
    "all-moe-top3": {"first_k_dense_replace": 0, "num_experts_per_tok": 3, "n_shared_experts": 2},
    # Value heads wider than the query/key heads (40 against 16 + 8): the attention's two widths.
    "wide-values": {"v_head_dim": 40},
    # DeepSeek-V3's sequence-wise balance loss, alpha large enough that its router gradient shows.
    "sequence-balance-loss": {"aux_loss_alpha": 0.1},
}


def model_sets(config):
    out = ["--set", "model.name=deepseek_v3", "--set", "debug.seed=7"]
    for key, value in config.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        out += ["--set", f"model.{key}={text}"]
    return out


@pytest.fixture(scope="module", params=STACKS)
def torch_env(request):
    return python_env(request.param)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_loss_and_every_gradient_match_the_pytorch_reference(tmp_path, variant, torch_env):
    config = {**BASE, **VARIANTS[variant]}
    sets = model_sets(config)
    weights_path = tmp_path / "init.safetensors"
    run_crucible("model", "init", *sets, "--out", weights_path)
    rng = np.random.default_rng(3)
    # Balance biases away from their initial 0, so that they change which experts are chosen.
    weights, meta = read_safetensors(weights_path)
    for name in weights:
        if name.endswith("e_score_correction_bias"):
            weights[name] = rng.normal(0, 0.02, size=weights[name].shape).astype(np.float32)
    write_safetensors(weights_path, weights, meta)
    B, T = 2, 160  # T > 128: the attention kernel's causal row blocks
    tokens = rng.integers(0, 512, size=(B, T), dtype=np.int32)
    targets = rng.integers(0, 512, size=(B, T), dtype=np.int32)
    targets[0, :5] = -1
    targets[1, -3:] = -1
    batch_path = tmp_path / "batch.safetensors"
    write_safetensors(batch_path, {"tokens": tokens, "targets": targets})
    out_path = tmp_path / "out.safetensors"
    run_crucible("model", "grads", *sets, "--weights", weights_path, "--batch", batch_path, "--out", out_path)
    ours, _ = read_safetensors(out_path)

    reference = {**config, "rope_theta": 10000.0, "norm_eps": 1e-5}
    version = torch_env.run(REFERENCE, "grads", weights_path, batch_path, tmp_path / "ref.npz",
                            json.dumps(reference)).strip()
    ref = np.load(tmp_path / "ref.npz")

    if config.get("aux_loss_alpha", 0) > 0:
        aux_error = abs(float(ours["aux_loss"]) - float(ref["aux_loss"]))
        print(f"aux_loss {float(ours['aux_loss']):.6f} vs reference {float(ref['aux_loss']):.6f}")
        assert aux_error < 1e-6 and float(ref["aux_loss"]) > 0.05
        # The routers' gradients hold the balance loss's part: without it they differ.
        plain = tmp_path / "plain.safetensors"
        run_crucible("model", "grads", *model_sets({**config, "aux_loss_alpha": 0}), "--weights", weights_path,
                     "--batch", batch_path, "--out", plain)
        router = "grad.model.layers.1.mlp.gate.weight"
        without = read_safetensors(plain)[0][router]
        assert np.max(np.abs(without - ref[router])) > 1e-2 * np.max(np.abs(ref[router]))
    loss_error = abs(float(ours["loss"]) - float(ref["loss"]))
    logit_error = np.max(np.abs(ours["logits"] - ref["logits"]))
    names = [name for name in read_safetensors(weights_path)[0]]
    errors, unused = {}, []
    for name in names:
        grad = ours["grad." + name]
        if name.endswith("e_score_correction_bias"):
            # Not a gradient: each expert's share of the token slots above 1/E, from the
            # experts the reference chose.
            layer = int(name.split(".")[2])
            chosen = ref[f"experts.{layer}"]
            E = config["n_routed_experts"]
            share = np.bincount(chosen.ravel(), minlength=E) / chosen.size - 1.0 / E
            assert np.max(np.abs(grad - share)) < 1e-7, (name, grad, share)
            continue
        if "grad." + name not in ref.files:  # an expert no token chose
            unused.append(name)
            assert np.all(grad == 0), f"{name}: no token chose it, yet its gradient is not zero"
            continue
        expected = ref["grad." + name]
        scale = np.max(np.abs(expected))
        assert scale > 0, name
        errors[name] = np.max(np.abs(grad - expected)) / scale
    worst = max(errors, key=errors.get)
    print(f"{variant} {torch_env.stack} ({version}): |loss error| {loss_error:.2e}, max |logit error| "
          f"{logit_error:.2e}, worst relative gradient error {errors[worst]:.2e} ({worst}); "
          f"{len(unused) // 3} experts unused")
    assert loss_error < 1e-6
    assert logit_error < 5e-6
    for name, error in errors.items():
        assert error < 2e-5, f"{name}: relative max error {error:.3g}"
    # Most experts were used, and so compared through their gradients.
    assert len(unused) // 3 <= 2


# ---- training ----

from test_distributed import mpirun, result  # noqa: E402

TRAIN = ["model.name=deepseek_v3", "training.seq_len=32", "training.local_batch_size=2",
         "training.global_batch_size=8", "metrics.peak_gflops=100", "lr_scheduler.warmup_steps=2",
         "lr_scheduler.decay_type=constant", "optimizer.lr=1e-3", "model.bias_update_speed=0.01"]


def loads(run_dir):
    return [r["expert_load"] for r in map(json.loads, open(run_dir / "metrics.jsonl"))]


@pytest.mark.parametrize("mode", ["block48", "block32"])
def test_one_two_and_four_ranks_at_every_zero_stage_give_identical_bits(tmp_path, mode):
    # The experts, the router and its balance bias (whose slot holds loads, summed exactly over
    # the ranks like any gradient) through data parallelism and ZeRO unchanged; with block32,
    # the sequence-wise balance loss too (its sum over micro-batches reduced in a fixed order).
    results = {}
    aux = ["model.aux_loss_alpha=0.001"] if mode == "block32" else []
    for np, zero_stage in ((1, 0), (2, 0), (2, 1), (2, 3), (4, 1), (4, 3)):
        run_dir = tmp_path / f"np{np}-z{zero_stage}"
        proc = mpirun(np, TRAIN + aux + ["training.steps=4", f"parallelism.zero_stage={zero_stage}",
                                         f"parallelism.exact_reduction={mode}", f"job.dump_folder={run_dir}"])
        assert "load_cv=" in proc.stdout and ("aux_loss=" in proc.stdout) == bool(aux)
        records = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
        assert all(("aux_loss" in r) == bool(aux) for r in records)
        if aux:  # about alpha x (MoE layers) x 1 when the loads and affinities are near uniform
            assert all(0.0005 < r["aux_loss"] < 0.003 for r in records), [r["aux_loss"] for r in records]
            results.setdefault("aux", []).append([r["aux_loss"] for r in records])
        results[(np, zero_stage)] = result(proc, run_dir), loads(run_dir)
    aux_losses = results.pop("aux", [])
    assert all(a == aux_losses[0] for a in aux_losses), aux_losses
    reference = results[(1, 0)]
    assert all(r == reference for r in results.values()), {k: v[0][1] for k, v in results.items()}
    first = reference[1][0]
    assert [layer["layer"] for layer in first] == [1] and first[0]["max"] > 1 > first[0]["min"]


def test_a_checkpoint_of_two_ranks_resumes_bit_exact_on_one_and_four(tmp_path):
    straight = tmp_path / "straight"
    reference = result(mpirun(1, TRAIN + ["training.steps=8", f"job.dump_folder={straight}"]), straight)
    for resume_ranks, resume_stage in ((1, 0), (4, 3)):
        run_dir = tmp_path / f"resumed{resume_ranks}"
        mpirun(2, TRAIN + ["training.steps=4", "checkpoint.interval=4", f"job.dump_folder={run_dir}",
                           "parallelism.zero_stage=3"])
        proc = mpirun(resume_ranks, TRAIN + ["training.steps=8", "checkpoint.interval=4", f"job.dump_folder={run_dir}",
                                             f"parallelism.zero_stage={resume_stage}"])
        assert "phase=resume" in proc.stdout
        assert result(proc, run_dir) == reference


@pytest.mark.parametrize("mode", ["block48", "block32"])
def test_every_expert_parallel_degree_on_one_two_and_four_ranks_gives_identical_bits(tmp_path, mode):
    # The experts split over 2 or 4 ranks of the data-parallel group, tokens dispatched and
    # combined by all-to-all(v): the owner adds each source rank's weight gradient as its own exact
    # contribution, so every (ranks, EP, ZeRO) point, with 4, 2 or 1 micro-batches a rank, equals
    # one rank. With block32 the sequence-wise balance loss too.
    aux = ["model.aux_loss_alpha=0.001"] if mode == "block32" else []
    results = {}
    for np, ep, zero_stage in ((1, 1, 0), (2, 2, 0), (2, 2, 3), (4, 2, 1), (4, 4, 1), (4, 4, 3)):
        run_dir = tmp_path / f"np{np}-ep{ep}-z{zero_stage}"
        proc = mpirun(np, TRAIN + aux + ["training.steps=4", f"parallelism.zero_stage={zero_stage}",
                                         f"parallelism.expert_parallel_degree={ep}",
                                         f"parallelism.exact_reduction={mode}", f"job.dump_folder={run_dir}"])
        if ep > 1:
            # This rank holds its block of the experts (the debug flavor: one MoE layer of 8).
            held = re.search(r"phase=expert_parallel degree=(\d+) replicas=(\d+) parameters_per_rank=(\d+) "
                             r"parameters=(\d+)", proc.stdout)
            assert held and (int(held.group(1)), int(held.group(2))) == (ep, np // ep), proc.stdout
            expert = 3 * 64 * 128  # gate, up, down of moe_intermediate_size 64 x dim 128
            assert int(held.group(4)) - int(held.group(3)) == (8 - 8 // ep) * expert, held.group(0)
            traffic = re.search(r"phase=expert_parallel_traffic exchanges_per_step=([\d.]+) "
                                r"bytes_received_per_step=(\d+)", proc.stdout)
            # One MoE layer (debug: layers 1.., first dense): per micro-batch the row counts, the
            # dispatch and the combine forward, the gradients' dispatch and combine backward.
            assert float(traffic.group(1)) == 5 * (8 // np // 2), proc.stdout
            assert int(traffic.group(2)) > 0
        results[(np, ep, zero_stage)] = result(proc, run_dir), loads(run_dir)
    reference = results[(1, 1, 0)]
    assert all(r == reference for r in results.values()), {k: v[0][1] for k, v in results.items()}


def test_a_checkpoint_resumes_bit_exact_across_expert_parallel_degrees(tmp_path):
    straight = tmp_path / "straight"
    reference = result(mpirun(1, TRAIN + ["training.steps=8", f"job.dump_folder={straight}"]), straight)
    for resume_ranks, resume_ep, resume_stage in ((1, 1, 0), (4, 4, 3)):
        run_dir = tmp_path / f"resumed{resume_ranks}"
        mpirun(2, TRAIN + ["training.steps=4", "checkpoint.interval=4", f"job.dump_folder={run_dir}",
                           "parallelism.expert_parallel_degree=2", "parallelism.zero_stage=1"])
        proc = mpirun(resume_ranks, TRAIN + ["training.steps=8", "checkpoint.interval=4", f"job.dump_folder={run_dir}",
                                             f"parallelism.expert_parallel_degree={resume_ep}",
                                             f"parallelism.zero_stage={resume_stage}"])
        assert "phase=resume" in proc.stdout
        assert result(proc, run_dir) == reference


@pytest.mark.parametrize("np,ep,zero_stage,batch", [(2, 2, 0, 4), (2, 2, 3, 8), (4, 2, 1, 8), (4, 4, 3, 16)])
def test_the_memory_planned_for_an_expert_parallel_rank_is_what_it_allocates(tmp_path, np, ep, zero_stage, batch):
    # Its block of the experts, its owner buffers (every rank's rows), and under ZeRO-3 the other
    # ranks' gradient contributions: planned before anything is allocated, then allocated.
    settings = [s for s in TRAIN if not s.startswith("training.global_batch_size")]
    run = mpirun(np, settings + [f"training.global_batch_size={batch}", "training.steps=1",
                                 f"parallelism.zero_stage={zero_stage}", f"parallelism.expert_parallel_degree={ep}",
                                 f"job.dump_folder={tmp_path / 'ep'}"])
    planned = int(re.search(r"^phase=memory_check .*model_state_bytes=(\d+)", run.stdout, re.M).group(1))
    allocated = int(re.search(r"^phase=memory .*model_state_bytes=(\d+)", run.stdout, re.M).group(1))
    assert planned == allocated, (planned, allocated)
    activations = int(re.search(r"^phase=memory_check .*activations_bytes=(\d+)", run.stdout, re.M).group(1))
    plain = mpirun(np, settings + [f"training.global_batch_size={batch}", "training.steps=1",
                                   f"parallelism.zero_stage={zero_stage}", f"job.dump_folder={tmp_path / 'dp'}"])
    unsplit = int(re.search(r"^phase=memory .*optimizer_state_bytes=(\d+)", plain.stdout, re.M).group(1))
    held = int(re.search(r"^phase=memory .*optimizer_state_bytes=(\d+)", run.stdout, re.M).group(1))
    # At ZeRO 0 a rank keeps the state of its experts only; at ZeRO 1/3 over fewer replicas.
    if zero_stage == 0:
        assert held < unsplit, (held, unsplit)
    assert activations > int(re.search(r"^phase=memory_check .*activations_bytes=(\d+)", plain.stdout,
                                        re.M).group(1))


def test_a_stopped_rank_of_an_expert_group_aborts_the_job_at_the_deadline_naming_the_group(tmp_path):
    # The tokens' all-to-alls run under the collective deadline like every exchange: rank 0 waits
    # in one (or in a collective over the job) and the job stops, naming the group and its ranks.
    run_dir = tmp_path / "run"
    assert_stopped_rank_times_out(crucible_binary(), run_dir, TRAIN + [
        "training.steps=100000", "parallelism.expert_parallel_degree=2", "comm.train_timeout_seconds=3",
        f"job.dump_folder={run_dir}"], "world = expert_parallel group")


def test_expert_parallelism_refuses_degrees_it_cannot_split_in_one_line_with_exit_two(tmp_path):
    cases = [
        (1, ["model.name=deepseek_v3", "parallelism.expert_parallel_degree=2"],
         "parallelism.expert_parallel_degree = 2 does not divide the ranks"),
        (4, ["model.name=deepseek_v3", "parallelism.expert_parallel_degree=4", "model.n_routed_experts=6",
             "model.n_group=2", "model.topk_group=1"],
         "parallelism.expert_parallel_degree = 4 does not divide model.n_routed_experts = 6"),
        (2, ["parallelism.expert_parallel_degree=2"],
         'parallelism.expert_parallel_degree = 2: model.name = "llama" has no experts to split'),
    ]
    for np, settings, message in cases:
        run_dir = tmp_path / f"run{np}"
        proc = mpirun(np, settings + [f"job.dump_folder={run_dir}"], check=False)
        assert proc.returncode == 2, (settings, proc.stdout, proc.stderr)
        # One line from each rank (mpirun adds its own notice of the exit code after them).
        errors = [line for line in proc.stderr.splitlines() if "error" in line and "mpirun" not in line]
        assert len(errors) == np and all(line.startswith("crucible: error: ") and message in line
                                         for line in errors), (settings, proc.stderr)
        assert not (run_dir / "metrics.jsonl").exists()


def test_a_dead_expert_is_named_and_its_balance_bias_rises_by_the_speed_each_step(tmp_path):
    # Expert 3 of layer 1 starts with a balance bias of -100: never chosen. The detector names it
    # after debug.dead_expert_steps; the balance rule raises its bias by the speed every step
    # (its load is below the mean), in float32 as the rule adds it.
    init = tmp_path / "init.safetensors"
    run_crucible("model", "init", "--set", "model.name=deepseek_v3", "--out", init)
    weights, meta = read_safetensors(init)
    bias = "model.layers.1.mlp.gate.e_score_correction_bias"
    weights[bias] = weights[bias].copy()
    weights[bias][3] = -100.0
    write_safetensors(init, weights, meta)
    run_dir = tmp_path / "run"
    proc = mpirun(2, TRAIN + ["training.steps=12", "debug.dead_expert_steps=10", f"model.init_weights={init}",
                              f"job.dump_folder={run_dir}"])
    dead = [line for line in proc.stderr.splitlines() if "dead expert" in line]
    assert len(dead) == 1, proc.stderr
    assert "dead expert: layer 1 expert 3 received no token for 10 steps (step 10)" in dead[0]
    assert all(layer[0]["min"] == 0 for layer in loads(run_dir))
    trained, _ = read_safetensors(run_dir / "model.safetensors")
    expected = np.float32(-100.0)
    for _ in range(12):
        expected = np.float32(expected + np.float32(0.01))
    assert trained[bias][3] == expected
    # The others moved by the speed each step, up or down (never chosen alike: no tie at the mean).
    others = np.delete(trained[bias], 3)
    assert np.all(np.abs(others) <= 12 * 0.01 + 1e-6) and np.any(others != 0)


def test_the_family_refuses_bad_settings_in_one_line_with_exit_two(tmp_path):
    cases = {
        ("model.name=deepseek_v3", "model.n_routed_experts=6", "model.n_group=4"):
            "model.n_routed_experts (6) must be divisible by model.n_group (4)",
        ("model.name=deepseek_v3", "model.num_experts_per_tok=9"):
            "model.num_experts_per_tok (9) is larger than model.n_routed_experts (8)",
        ("model.name=deepseek_v3", "model.kv_lora_rank=129"):
            "model.kv_lora_rank (129) is larger than model.dim (128)",
        ("model.name=deepseek_v3", "training.device=cuda"):
            "the MLA and mixture-of-experts kernels of model.name = \"deepseek_v3\" have no version",
        ("model.kv_lora_rank=32",): "a key of model.name = \"deepseek_v3\", not of \"llama\"",
    }
    for settings, message in cases.items():
        args = ["train", "--set", f"job.dump_folder={tmp_path / 'run'}"]
        for item in settings:
            args += ["--set", item]
        proc = run_crucible(*args, check=False)
        assert proc.returncode == 2, (settings, proc.stderr)
        assert message in proc.stderr, (settings, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert not (tmp_path / "run" / "metrics.jsonl").exists()
    proc = mpirun(2, ["model.name=deepseek_v3", "parallelism.tensor_parallel_degree=2",
                      f"job.dump_folder={tmp_path / 'tp'}"], check=False)
    assert proc.returncode == 2, proc.stderr
    assert 'model.name = "deepseek_v3" has no tensor-parallel layers yet' in proc.stderr


@pytest.mark.parametrize("optimizer", ["AdamW", "SGD", "Lion", "SophiaG", "Muon", "Mano"])
def test_every_optimizer_trains_the_family_with_the_same_bits_on_one_and_two_ranks(tmp_path, optimizer):
    # Muon and Mano orthogonalise each expert's matrices and the router as separate matrices
    # (ZeRO-1 gives each whole matrix one owner rank); SophiaG's Hessian pass resamples targets
    # from the whole logits. The balance bias follows its own rule under each.
    # With the experts split over the 2 ranks too (expert parallelism).
    runs = {}
    hessian = ["optimizer.sophia_k=2"] if optimizer == "SophiaG" else []  # passes at steps 2, 4, 6
    for np, zero_stage, ep in ((1, 0, 1), (2, 1, 1), (2, 1, 2)):
        run_dir = tmp_path / f"np{np}" if ep == 1 else tmp_path / f"np{np}-ep{ep}"
        proc = mpirun(np, TRAIN + hessian + [f"optimizer.name={optimizer}", "training.steps=6",
                                   "checkpoint.interval=6", f"parallelism.zero_stage={zero_stage}",
                                   f"parallelism.expert_parallel_degree={ep}", f"job.dump_folder={run_dir}"])
        runs[(np, ep)] = result(proc, run_dir)
    assert runs[(1, 1)] == runs[(2, 1)] == runs[(2, 2)], (runs[(1, 1)][0], runs[(2, 1)][0], runs[(2, 2)][0])
    # The checkpoint's optimizer state, put together from the ranks' parts (an expert-parallel
    # rank's experts, Muon's per-tensor diagnostics among them): the same bytes as one rank's.
    state = [(tmp_path / name / "ckpt" / "step-6" / "optimizer.safetensors").read_bytes()
             for name in ("np1", "np2", "np2-ep2")]
    assert state[0] == state[1] == state[2]
    # The optimizer's metrics (SophiaG's clipped fraction, a mean over the updated elements:
    # every rank's shared tensors counted once), the same every step.
    metrics = [[{k: v for k, v in json.loads(line).items() if "/" in k}
                for line in open(tmp_path / name / "metrics.jsonl")] for name in ("np1", "np2", "np2-ep2")]
    assert metrics[0] == metrics[1] == metrics[2], metrics
    runs[1] = runs[(1, 1)]
    losses = [loss for _, loss, _ in runs[1][0]]
    assert all(np_.isfinite(losses)), losses
    trained, _ = read_safetensors(tmp_path / "np1" / "model.safetensors")
    bias = trained["model.layers.1.mlp.gate.e_score_correction_bias"]
    # From 0 by -speed, 0 or +speed a step (the sign of the load above the mean), whatever the optimizer.
    steps = bias / 0.01
    assert np_.all(np_.abs(steps - np_.round(steps)) < 1e-4) and np_.all(np_.abs(steps) <= 6), bias
    assert np_.any(bias != 0), bias
