"""The bit-exact smoke gate and the silent-bug detectors of the trainer."""
import json
import os
import shutil

import pytest

from conftest import REPO, run_crucible

GOLDEN = REPO / "tests" / "golden" / "smoke.json"
SMALL = ["--set", "model.flavor=debug", "--set", "training.seq_len=32", "--set", "training.local_batch_size=4",
         "--set", "metrics.peak_gflops=100000", "--set", "checkpoint.enable=false"]


def expect_the_pinned_gemm_path(work):
    # The golden holds on AVX2-only and AVX-512 machines because every rank runs the AVX2 row of
    # the GEMM library table (DNNL_MAX_CPU_ISA=AVX2, passed through mpirun -x).
    start = [l for l in (work / "train.log").read_text().splitlines() if l.startswith("phase=start")]
    assert start and " gemm=auto gemm_isa=avx2" in start[0], start


def test_smoke_gate_passes_on_a_clean_tree(tmp_path):
    proc = run_crucible("smoke", "--golden", GOLDEN, "--work-dir", tmp_path)
    assert "smoke: PASS" in proc.stdout
    expect_the_pinned_gemm_path(tmp_path)


def test_smoke_gate_passes_with_two_ranks_against_the_same_golden(tmp_path):
    if not shutil.which("mpirun"):
        pytest.skip("mpirun is not installed")
    proc = run_crucible("smoke", "--golden", GOLDEN, "--ranks", "2", "--work-dir", tmp_path)
    assert "smoke: PASS" in proc.stdout
    expect_the_pinned_gemm_path(tmp_path)


def test_smoke_gate_fails_when_a_kernel_changes_its_rounding_by_one_ulp():
    proc = run_crucible("smoke", "--golden", GOLDEN, env={"CRUCIBLE_TEST_PERTURB_KERNEL": "rmsnorm"}, check=False)
    assert proc.returncode == 1
    assert "smoke: FAIL first difference at step 1" in proc.stdout
    assert "smoke: FAIL first differing tensor" in proc.stdout


def test_smoke_update_writes_a_golden_that_then_passes(tmp_path):
    golden = tmp_path / "golden.json"
    run_crucible("smoke", "--golden", golden, "--update")
    data = json.loads(golden.read_text())
    assert len(data["steps"]) == 8 and len(data["tensors"]) > 10
    assert data == json.loads(GOLDEN.read_text()), "the stored golden is stale: rerun crucible smoke --update"
    run_crucible("smoke", "--golden", golden)


def test_a_missing_golden_is_a_usage_error_before_the_run(tmp_path):
    proc = run_crucible("smoke", "--golden", tmp_path / "none.json", "--work-dir", tmp_path / "work",
                        check=False)
    assert proc.returncode == 2 and "none.json: golden file not found" in proc.stderr, proc.stderr
    assert "status=training" not in proc.stdout and not (tmp_path / "work").exists(), proc.stdout


def test_a_device_this_machine_cannot_run_is_exit_2_in_one_line(tmp_path):
    # A build without the CUDA backend, or a machine without a GPU (CI): the run's own refusal,
    # a usage error, not the exit 1 of "a difference from the golden".
    if os.path.exists("/dev/nvidia0"):
        pytest.skip("this machine has a GPU")
    proc = run_crucible("smoke", "--device", "cuda", "--portable", "--work-dir", tmp_path, check=False)
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr)
    assert lines[0].startswith("crucible: error: smoke: ") and 'training.device = "cuda"' in lines[0], lines
    assert "crucible: error: training.device" not in lines[0], lines  # the run's prefix is not repeated


DEEPSEEK_GOLDEN = REPO / "tests" / "golden" / "smoke-deepseek_v3.json"


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_the_deepseek_v3_smoke_passes_on_one_two_and_four_ranks(tmp_path, ranks):
    if ranks > 1 and not shutil.which("mpirun"):
        pytest.skip("mpirun is not installed")
    proc = run_crucible("smoke", "--model", "deepseek_v3", "--ranks", ranks, "--work-dir", tmp_path)
    assert "smoke: PASS 8 steps" in proc.stdout and "smoke-deepseek_v3.json" in proc.stdout
    # Its run is the MoE family's: routed experts, their balance bias, expert loads.
    config = (tmp_path / "smoke.toml").read_text()
    assert 'name = "deepseek_v3"' in config and "n_kv_heads" not in config
    assert "load_cv=" in (tmp_path / "train.log").read_text()


@pytest.mark.parametrize("ranks,ep", [(2, 2), (4, 4), (4, 2)])
def test_the_deepseek_v3_smoke_passes_with_its_experts_split_over_ranks(tmp_path, ranks, ep):
    if not shutil.which("mpirun"):
        pytest.skip("mpirun is not installed")
    proc = run_crucible("smoke", "--model", "deepseek_v3", "--ranks", ranks, "--ep", ep, "--work-dir", tmp_path)
    assert f"ranks={ranks} expert_parallel={ep}" in proc.stdout
    assert "smoke: PASS 8 steps" in proc.stdout and "smoke-deepseek_v3.json" in proc.stdout
    assert f"phase=expert_parallel degree={ep}" in (tmp_path / "train.log").read_text()


def test_the_deepseek_v3_golden_is_current_and_a_one_ulp_change_fails_it(tmp_path):
    golden = tmp_path / "golden.json"
    run_crucible("smoke", "--model", "deepseek_v3", "--golden", golden, "--update")
    data = json.loads(golden.read_text())
    assert data == json.loads(DEEPSEEK_GOLDEN.read_text()), "stale: rerun crucible smoke --model deepseek_v3 --update"
    assert any(".mlp.experts.7.down_proj" in name for name in data["tensors"])
    assert any(name.endswith("e_score_correction_bias") for name in data["tensors"])
    proc = run_crucible("smoke", "--model", "deepseek_v3", env={"CRUCIBLE_TEST_PERTURB_KERNEL": "rmsnorm"},
                        check=False)
    assert proc.returncode == 1 and "smoke: FAIL first difference at step 1" in proc.stdout, proc.stdout


def test_smoke_refusals_are_one_line_with_exit_2(tmp_path):
    cases = [(["--model", "deepseek_v3", "--tp", "2", "--ranks", "2"], "the family has no tensor parallelism yet"),
             (["--model", "deepseek_v3", "--portable"], "the family has no portable kernels yet"),
             (["--ep", "2", "--ranks", "2"], "smoke --ep: only --model deepseek_v3 has experts to split"),
             (["--model", "deepseek_v3", "--ep", "4", "--ranks", "2"], "smoke --ep 4: --ranks 2 is not a multiple of it"),
             # The run's own error line, not mpirun's banner after it.
             (["--ranks", "4"], "training.global_batch_size (4) must be a positive multiple")]
    for args, message in cases:
        if "--ranks" in args and not shutil.which("mpirun"):
            continue
        proc = run_crucible("smoke", *args, "--work-dir", tmp_path / "work", check=False)
        lines = [l for l in proc.stderr.splitlines() if l.strip()]
        assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], (args, proc.stderr)


def warnings_of(tmp_path, *settings):
    proc = run_crucible("train", *SMALL, "--set", f"job.dump_folder={tmp_path / 'run'}", *settings)
    return [l for l in proc.stderr.splitlines() if l.startswith("warning:")], proc


def test_bf16_master_weights_freeze_the_norms_and_the_detector_says_so(tmp_path):
    warnings, _ = warnings_of(tmp_path, "--set", "training.steps=12", "--set", "training.master_dtype=bfloat16",
                              "--set", "optimizer.lr=1e-3", "--set", "lr_scheduler.warmup_steps=0",
                              "--set", "debug.frozen_steps=5")
    ulp = [w for w in warnings if "below half a bfloat16 ULP" in w]
    named = {w.split()[3].rstrip(":") for w in ulp}
    assert "model.norm.weight" in named and "model.layers.0.input_layernorm.weight" in named, warnings
    assert not any("q_proj" in n for n in named), warnings  # large-enough updates are not flagged
    assert any("model.norm.weight: unchanged for 5 steps" in w for w in warnings)


def test_float32_master_weights_raise_no_warning(tmp_path):
    warnings, _ = warnings_of(tmp_path, "--set", "training.steps=12", "--set", "debug.frozen_steps=5",
                              "--set", "optimizer.lr=1e-3", "--set", "lr_scheduler.warmup_steps=0")
    assert warnings == []


def test_a_loss_divided_by_a_fake_dp_factor_is_reported_at_step_one(tmp_path):
    warnings, _ = warnings_of(tmp_path, "--set", "training.steps=2", "--set", "debug.fake_loss_divisor=2")
    assert len(warnings) == 1 and "step-1 loss" in warnings[0] and "ln(vocab_size)" in warnings[0]


def test_an_injected_nan_gradient_is_named_on_the_step_it_appears(tmp_path):
    warnings, proc = warnings_of(tmp_path, "--set", "training.steps=4", "--set", "debug.inject_nan_step=3",
                                 "--set", "debug.inject_nan_tensor=model.layers.1.mlp.up_proj.weight")
    assert any(w.startswith("warning: step 3: non-finite gradient in model.layers.1.mlp.up_proj.weight")
               for w in warnings), warnings
    lines = {l.split()[0]: l for l in proc.stdout.splitlines() if l.startswith("step=")}
    assert "grad_norm=nan" in lines["step=3"]
    assert "loss=nan" not in lines["step=3"] and "grad_norm=nan" not in lines["step=4"]
