"""SophiaG and the trainer's Hessian pass (optim/sophia.cc, Trainer::HessianPass) through the real
`crucible` binary on a Llama of 41k parameters: with optimizer.sophia_k = 2 the Hessian pass runs
at steps 2, 4, 6 (targets sampled from the model's logits by Philox on the seed, step, sample and
position). Every rank count, ZeRO stage and overlap setting must give the losses, gradient norms, SophiaG metrics
and final weights of one rank; a resume at step 3, between two Hessian steps, the bits of the
uninterrupted run; sophia_k <= 0 one line and exit 2."""
from conftest import crucible_binary
from rank_runs import mpirun_train, resume_runs, steps_and_digest

TINY = ["model.vocab_size=256", "model.dim=32", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2",
        "model.ffn_hidden_dim=96", "training.seq_len=16", "training.local_batch_size=1",
        "training.global_batch_size=8", "metrics.peak_gflops=10", "lr_scheduler.warmup_steps=1",
        "lr_scheduler.decay_type=constant", "optimizer.lr=0.003", "optimizer.name=SophiaG",
        "optimizer.sophia_k=2", "optimizer.beta1=0.965", "optimizer.beta2=0.99", "optimizer.sophia_rho=0.04"]
FIELDS = ("loss", "grad_norm", "sophia/clipped_fraction", "sophia/hessian_min", "sophia/hessian_max")


def train(np, run_dir, settings, check=True):
    return mpirun_train([crucible_binary(), "train"], np, run_dir, TINY + settings, check)


def result(proc, run_dir):
    return steps_and_digest(proc, run_dir, FIELDS)


def test_every_rank_count_and_zero_stage_gives_the_bits_of_one_rank(tmp_path):
    reference = result(train(1, tmp_path / "np1", ["training.steps=5"]), tmp_path / "np1")
    steps = reference[0]
    assert len(steps) == 5
    # The Hessian estimate the update divides by is 0 until the pass of step 2, positive after it.
    assert steps[1][5] == 0 and steps[2][5] > 0, steps
    assert all(0 < s[3] <= 1 for s in steps), steps
    for np, stage, overlap in [(2, 0, "true"), (2, 1, "true"), (2, 1, "false"), (2, 3, "true"), (2, 3, "false"),
                               (4, 1, "true"), (4, 3, "true")]:
        run_dir = tmp_path / f"np{np}-z{stage}-{overlap}"
        proc = train(np, run_dir, ["training.steps=5", f"parallelism.zero_stage={stage}",
                                   f"parallelism.overlap_grad_reduce={overlap}"])
        assert f"ranks={np} zero_stage={stage}" in proc.stdout
        assert result(proc, run_dir) == reference, (np, stage, overlap)


def test_the_hessian_pass_changes_the_run_and_follows_its_interval(tmp_path):
    # k = 2 and k = 3 agree through step 2's update and part ways after the first Hessian pass
    # (step 2 against step 3): the pass is real and keyed on the step.
    a = result(train(1, tmp_path / "k2", ["training.steps=4"]), tmp_path / "k2")[0]
    b = result(train(1, tmp_path / "k3", ["training.steps=4", "optimizer.sophia_k=3"]), tmp_path / "k3")[0]
    assert a[:2] == b[:2]
    assert a[2] != b[2]


def test_a_resume_between_two_hessian_steps_is_bit_exact_on_another_layout(tmp_path):
    # Written at step 3 on two ranks (ZeRO-1), between the Hessian passes of steps 2 and 4.
    straight, _, resumed = resume_runs(train, tmp_path, [(4, 3), (1, 1)])
    reference = result(*straight)
    for np, stage, proc, run_dir in resumed:
        assert "phase=resume from=" in proc.stdout
        assert result(proc, run_dir) == reference, (np, stage)


def test_a_hessian_interval_below_one_is_a_one_line_config_error(tmp_path):
    for value in ("0", "-3"):
        proc = train(1, tmp_path / f"bad{value}", ["training.steps=2", f"optimizer.sophia_k={value}"], check=False)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        lines = [line for line in proc.stderr.splitlines() if "optimizer.sophia_k" in line]
        assert len(lines) == 1, proc.stderr


def test_a_clipped_fraction_above_the_threshold_warns_once_from_the_step_after_the_first_estimate(tmp_path):
    proc = train(1, tmp_path / "warn", ["training.steps=6", "optimizer.sophia_clip_warn=0.5"])
    steps = result(proc, tmp_path / "warn")[0]
    assert all(s[3] > 0.5 for s in steps), steps  # above it on every step, steps 1-2 (h = 0) included
    warnings = [line for line in (proc.stdout + proc.stderr).splitlines() if "sophia/clipped_fraction" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: step 3: "), warnings


def test_a_batch_ramp_is_refused_with_one_line(tmp_path):
    # SophiaG scales its Hessian by the tokens of a global batch; a ramp would change them mid-run.
    proc = train(1, tmp_path / "ramp", ["training.steps=4", "training.global_batch_size=4",
                                         "training.batch_ramp=[\"2x@3\"]"], check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "training.batch_ramp" in line]
    assert len(lines) == 1 and "not supported yet" in lines[0], proc.stderr
