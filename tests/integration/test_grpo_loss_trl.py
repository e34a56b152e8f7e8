"""The GRPO objective of src/rl/grpo_loss.h against TRL 1.16.0's own loss code and against a small
PyTorch reference written from the published equations, on one fixed batch of rollouts (8
completions in 2 groups of 4, 7 positions, ragged masks and one empty completion): the advantages,
the loss, its gradient with respect to every token's log-probability and TRL's metrics, for every
loss_type TRL offers and the variants around them (reward scaling, KL with and without the bias
correction, delta, sequence-level importance sampling).

How TRL is called: trl 1.16.0 is in the "current" environment (scripts/requirements-current.txt;
its dependencies are all there, so `import trl.trainer.grpo_trainer` works). The loss is
GRPOTrainer._compute_loss itself, run on an instance made without __init__ (no model, no
dataset): the attributes it reads are set by hand, _get_per_token_logps_and_entropies returns the
batch's log-probabilities (float64, requires_grad), and the accelerator is one process. The
advantages are TRL's lines of _generate_and_score_completions (which needs a model and reward
functions to run) copied with TRL's own nanstd. The test-only program test_grpo_loss_helper
(tests/helpers/grpo_loss_main.cc, built next to crucible) runs Crucible's side.

Tolerance: 1e-6 relative for the loss and advantages; for the gradient, 1e-6 of the largest
entry's magnitude, elementwise (Crucible returns the gradient in float32, 6e-8 relative); 1e-6
absolute for the metrics. Inputs are float32 values, exactly the same on both sides; both Python
sides compute in float64. Crucible and the reference agree to 2e-15 or better on the loss; TRL differs
from both by about 2e-8 relative wherever rewards are scaled by a std, because TRL's nanstd computes
Bessel's factor count / (count - 1) from integer tensors, in float32 (4/3 -> 1.33333337)."""
import json
import random
import struct
import subprocess
from pathlib import Path

import pytest

from conftest import crucible_binary, python_env

B, T, G = 8, 7, 4
LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo", "vespo"]
BASE = {"epsilon_low": 0.2, "epsilon_high": 0.28, "beta": 0.04, "kl_bias_correction": True,
        "max_completion_length": T, "importance_sampling_level": "token",
        # torch.where(advantages > 0, pos, neg) makes TRL's temperatures float32 scalars: values exact
        # in float32 keep that rounding (1.05 -> 1.0499999523) out of a float64 comparison.
        "sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.25}
CASES = [(name, {"loss_type": name}, "group") for name in LOSS_TYPES] + [
    ("grpo-no-kl-none", {"loss_type": "grpo", "beta": 0.0}, "none"),
    ("dapo-batch-delta-plain-kl", {"loss_type": "dapo", "delta": 1.3, "kl_bias_correction": False}, "batch"),
    ("cispo-clipping", {"loss_type": "cispo", "epsilon_high": 1.1}, "group"),
    ("gspo-sequence", {"loss_type": "grpo", "importance_sampling_level": "sequence"}, "group"),
    ("luspo-sequence", {"loss_type": "luspo", "importance_sampling_level": "sequence"}, "group"),
    ("dapo-sequence-plain-kl", {"loss_type": "dapo", "importance_sampling_level": "sequence",
                                "kl_bias_correction": False}, "batch"),
    ("sapo-none", {"loss_type": "sapo", "beta": 0.0}, "none"),
]
METRICS = ["kl", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean",
           "clip_ratio/low_min", "clip_ratio/high_max", "cispo_clip_ratio"]


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def fixed_batch():
    rng = random.Random(1234)
    lengths = [7, 5, 3, 6, 0, 7, 2, 4]
    mask = [float(t < lengths[b]) for b in range(B) for t in range(T)]
    old = [f32(-rng.uniform(0.1, 3.0)) for _ in range(B * T)]
    logp = [f32(o + rng.uniform(-0.45, 0.45)) for o in old]
    ref = [f32(o + rng.uniform(-0.3, 0.3)) for o in old]
    rewards = [1.0, 0.0, 0.0, 1.0, 0.5, 0.0, 2.0, 0.25]
    return {"sequences": B, "positions": T, "group_size": G, "logp": logp, "old_logp": old, "ref_logp": ref,
            "mask": mask, "rewards": rewards}


# Runs in the "current" environment: TRL's loss and the reference, each case's loss, gradient,
# advantages and metrics as JSON on stdout.
TRL_SIDE = r'''
import collections, json, math, sys, types
import torch
import trl
from trl.trainer.grpo_trainer import GRPOTrainer
from trl.trainer.utils import nanstd

batch, cases = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
B, T, G = batch["sequences"], batch["positions"], batch["group_size"]
tensor = lambda key: torch.tensor(batch[key], dtype=torch.float64).view(B, T)
rewards = torch.tensor(batch["rewards"], dtype=torch.float64)


def trl_advantages(scale_rewards):
    # TRL 1.16.0 _generate_and_score_completions, sum_then_normalize with one reward function.
    mean_grouped_rewards = rewards.view(-1, G).mean(dim=1).repeat_interleave(G, dim=0)
    if scale_rewards in ["group", "none"]:
        std_rewards = nanstd(rewards.view(-1, G), dim=1).repeat_interleave(G, dim=0)
    else:
        std_rewards = nanstd(rewards).expand_as(rewards)
    advantages = rewards - mean_grouped_rewards
    if scale_rewards != "none":
        advantages = advantages / (std_rewards + 1e-4)
    return advantages


class OneProcess:
    num_processes = 1
    def reduce(self, x, reduction="sum"): return x
    def gather(self, x): return x
    def gather_for_metrics(self, x): return x


def trl_loss(config, advantages):
    trainer = GRPOTrainer.__new__(GRPOTrainer)
    logp = tensor("logp").clone().requires_grad_(True)
    d = trainer.__dict__
    d.update(loss_type=config["loss_type"], beta=config["beta"], epsilon_low=config["epsilon_low"],
             epsilon_high=config["epsilon_high"], importance_sampling_level=config["importance_sampling_level"],
             max_completion_length=config["max_completion_length"], top_entropy_quantile=1.0,
             off_policy_mask_threshold=None, use_vllm=False, vllm_importance_sampling_correction=False,
             _entropy_bonus_enabled=False, aux_loss_enabled=False, current_gradient_accumulation_steps=1,
             model=types.SimpleNamespace(training=True), accelerator=OneProcess(),
             _metrics={"train": collections.defaultdict(list), "eval": collections.defaultdict(list)})
    d["args"] = types.SimpleNamespace(
        use_bias_correction_kl=config["kl_bias_correction"], delta=config.get("delta"),
        sapo_temperature_pos=config["sapo_temperature_pos"], sapo_temperature_neg=config["sapo_temperature_neg"],
        steps_per_generation=1,
        vespo_k_pos=2.0, vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0)
    d["_get_per_token_logps_and_entropies"] = lambda *args, **kwargs: (logp, torch.zeros_like(logp), None)
    mask = tensor("mask")
    inputs = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
              "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask,
              "advantages": advantages, "old_per_token_logps": tensor("old_logp"),
              "ref_per_token_logps": tensor("ref_logp"), "num_items_in_batch": mask.sum()}
    loss = trainer._compute_loss(None, inputs)
    loss.backward()
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    return loss.item(), logp.grad.flatten().tolist(), metrics


def reference_loss(config, scale_rewards):
    """From the papers: GRPO (Shao et al. 2024) with k3 KL, DAPO's token sum, Dr. GRPO's constant,
    GSPO's sequence ratio, CISPO's held clip, SAPO's soft gate, VESPO's gamma weight, LUSPO's sums."""
    r = rewards.view(-1, G)
    mean = r.mean(1, keepdim=True)
    if scale_rewards == "group":
        advantages = (r - mean) / (r.std(1, unbiased=True, keepdim=True) + 1e-4)
    elif scale_rewards == "batch":
        advantages = (r - mean) / (rewards.std(unbiased=True) + 1e-4)
    else:
        advantages = r - mean
    A = advantages.reshape(B, 1)
    logp = tensor("logp").clone().requires_grad_(True)
    old, ref, m = tensor("old_logp"), tensor("ref_logp"), tensor("mask")
    lengths = m.sum(1, keepdim=True)
    if config["importance_sampling_level"] == "token":
        w = torch.exp(logp - old)
    else:
        w = torch.exp(((logp - old) * m).sum(1, keepdim=True) / lengths.clamp(min=1)).expand(B, T)
    lo, hi, kind = 1 - config["epsilon_low"], 1 + config["epsilon_high"], config["loss_type"]
    if kind == "cispo":
        per_token = -torch.clamp(w, max=config["epsilon_high"]).detach() * A * logp
    elif kind == "sapo":
        tau = torch.where(A > 0, config["sapo_temperature_pos"], config["sapo_temperature_neg"]).double()
        per_token = -(4 / tau) * torch.sigmoid(tau * (w - 1)) * A
    elif kind == "vespo":
        log_w = (torch.clamp(logp - old, -20, 20) * m).sum(1, keepdim=True).clamp(math.log(1e-8), 20)
        k, lam = torch.where(A >= 0, 2.0, 3.0), torch.where(A >= 0, 3.0, 2.0)
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w)).detach()
        per_token = -phi * A * logp
    else:
        unclipped = torch.clamp(w, max=config["delta"]) if config.get("delta") else w
        per_token = -torch.minimum(unclipped * A, torch.clamp(w, lo, hi) * A)
    kl = torch.exp(ref - logp) - (ref - logp) - 1
    if config["kl_bias_correction"]:
        kl = kl * w
    per_token = (per_token + config["beta"] * kl) * m
    if kind in ("grpo", "sapo"):
        loss = (per_token.sum(1) / lengths.squeeze(1).clamp(min=1)).mean()
    elif kind == "dr_grpo":
        loss = per_token.sum() / (B * config["max_completion_length"])
    elif kind == "luspo":
        loss = per_token.sum(1).mean()
    else:  # bnpo (one micro-batch), dapo, cispo, vespo
        loss = per_token.sum() / m.sum()
    loss.backward()
    return loss.item(), logp.grad.flatten().tolist(), advantages.flatten().tolist()


out = {"trl_version": trl.__version__, "cases": []}
for name, config, scale_rewards in cases:
    advantages = trl_advantages(scale_rewards)
    loss, grad, metrics = trl_loss(config, advantages)
    ref_loss, ref_grad, ref_advantages = reference_loss(config, scale_rewards)
    out["cases"].append({"name": name, "trl": {"loss": loss, "grad": grad, "advantages": advantages.tolist(),
                                              "metrics": metrics},
                         "reference": {"loss": ref_loss, "grad": ref_grad, "advantages": ref_advantages}})
print(json.dumps(out))
'''


def crucible_side(batch, config, scale_rewards):
    helper = Path(crucible_binary()).resolve().parent / "test_grpo_loss_helper"
    assert helper.exists(), f"{helper} not found: build it (cmake --build build --target test_grpo_loss_helper)"
    request = dict(batch, config=config, scale_rewards=scale_rewards)
    proc = subprocess.run([str(helper)], input=json.dumps(request), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def close(a, b, relative=1e-6):
    return abs(a - b) <= relative * max(abs(a), abs(b), 1e-12)


@pytest.fixture(scope="module")
def expected(tmp_path_factory):
    folder = tmp_path_factory.mktemp("grpo")
    batch = fixed_batch()
    (folder / "batch.json").write_text(json.dumps(batch))
    cases = [(name, dict(BASE, **config), scale) for name, config, scale in CASES]
    (folder / "cases.json").write_text(json.dumps(cases))
    result = json.loads(python_env("current").run(TRL_SIDE, folder / "batch.json", folder / "cases.json"))
    assert result["trl_version"] == "1.16.0"
    return batch, {case["name"]: case for case in result["cases"]}


@pytest.mark.parametrize("name,config,scale_rewards", CASES, ids=[case[0] for case in CASES])
def test_loss_gradient_and_metrics_match_trl_and_the_reference(expected, name, config, scale_rewards):
    batch, cases = expected
    ours = crucible_side(batch, dict(BASE, **config), scale_rewards)
    for side in ("trl", "reference"):
        theirs = cases[name][side]
        assert all(close(a, b) for a, b in zip(ours["advantages"], theirs["advantages"])), (side, ours["advantages"],
                                                                                          theirs["advantages"])
        assert close(ours["loss"], theirs["loss"]), (side, ours["loss"], theirs["loss"])
        scale = max(abs(g) for g in theirs["grad"])
        assert scale > 0
        worst = max(abs(a - b) for a, b in zip(ours["dloss_dlogp"], theirs["grad"])) / scale
        print(f"{name} vs {side}: loss {ours['loss']:.9g} against {theirs['loss']:.9g} "
              f"(relative difference {abs(ours['loss'] - theirs['loss']) / abs(theirs['loss']):.1g}), "
              f"largest gradient difference {worst:.1g} of the largest entry")
        assert worst <= 1e-6, (side, worst, ours["dloss_dlogp"], theirs["grad"])
    trl_metrics = cases[name]["trl"]["metrics"]
    print(f"{name} metrics: TRL {trl_metrics}, Crucible {ours['metrics']}")
    for metric in METRICS:
        if metric in trl_metrics:
            assert abs(ours["metrics"][metric] - trl_metrics[metric]) <= 1e-6, (metric, ours["metrics"], trl_metrics)
    # The case exercises what it names: the clip metrics TRL logs for this loss type are there.
    if config["loss_type"] in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo"):
        assert "clip_ratio/region_mean" in trl_metrics
