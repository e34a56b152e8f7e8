"""[training] device and mixed precision as a user meets them on the command line: a device this
build or this machine cannot run, an unknown device, a precision no backend has: one line on
stderr, exit 2, and no run directory. The seam itself (a model off the host gets the CPU's bits)
is tests/unit/compute/backend_test.cc; the GPU's own tests are tests/gpu/ (make test-gpu)."""
import pytest

from conftest import run_crucible

DEBUG = ["--set", "training.steps=1", "--set", "training.seq_len=16",
         "--set", "training.local_batch_size=1"]


def refused(tmp_path, *settings):
    run_dir = tmp_path / "run"
    proc = run_crucible("train", *DEBUG, *sum((["--set", s] for s in settings), []),
                        "--set", f"job.dump_folder={run_dir}", check=False, timeout=120)
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr)
    assert not run_dir.exists(), "a refused run left a run directory"
    assert "step=" not in proc.stdout
    return lines[0]


def test_cuda_on_a_machine_without_a_gpu_or_a_build_without_cuda_is_one_line_exit_2(tmp_path):
    # Either this build has no CUDA backend (it says how to get one) or it has one and this
    # machine has no GPU (it says what the CUDA runtime said). CI machines have no GPU.
    line = refused(tmp_path, "training.device=cuda")
    assert 'training.device = "cuda"' in line, line
    assert "without the CUDA backend" in line or "GPU" in line, line


def test_an_unknown_device_lists_the_registered_ones(tmp_path):
    line = refused(tmp_path, "training.device=tpu")
    assert "training.device: unknown device 'tpu' (choose one of cpu" in line, line


@pytest.mark.parametrize("setting,named", [
    ("training.mixed_precision_param=float16", "training.mixed_precision_param"),
    ("training.mixed_precision_reduce=bfloat16", "training.mixed_precision_reduce"),
])
def test_a_precision_no_backend_has_is_refused_naming_the_key(tmp_path, setting, named):
    line = refused(tmp_path, setting)
    assert line.startswith(f"crucible: error: {named}"), line


def test_the_start_line_names_the_device_and_the_compute_precision(tmp_path):
    proc = run_crucible("train", *DEBUG, "--set", f"job.dump_folder={tmp_path / 'run'}",
                        timeout=120)
    start = next(l for l in proc.stdout.splitlines() if l.startswith("phase=start"))
    assert " device=cpu compute=float32 " in start, start
