"""[training] device and mixed precision as a user meets them on the command line: a device this
build or this machine cannot run, an unknown device, a precision no backend has: one line on
stderr, exit 2, and no run directory. The seam itself (a model off the host gets the CPU's bits)
is tests/unit/compute/backend_test.cc; the GPU's own tests are tests/gpu/ (make test-gpu)."""
import numpy as np
import pytest

from conftest import crucible_binary, native_bf16_kernels, run_crucible
from rank_runs import mpirun_train, steps_and_digest

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


# ---- bf16 compute on the CPU: trains, and keeps the promises of the fp32 path ----

BF16 = ["training.mixed_precision_param=bfloat16", "training.seq_len=64", "training.local_batch_size=2",
        "training.global_batch_size=8", "optimizer.lr=3e-3", "lr_scheduler.warmup_steps=2",
        "model.vocab_size=256", "training.dataset=tokens", "lr_scheduler.decay_type=constant"]


@pytest.fixture
def text_tokens(tmp_path):
    """The bytes of a real English text as uint16 tokens (vocab 256): something to learn."""
    text = open("/usr/share/common-licenses/GPL-3", "rb").read()
    path = tmp_path / "gpl.u16"
    np.frombuffer(text, dtype=np.uint8).astype(np.uint16).tofile(path)
    return f"training.dataset_path={path}"


def bf16_path_runs(path):
    """The kernel the start line names for [debug] bf16_path `path`, or None where this CPU cannot
    run it or, for a kernel named explicitly, where `native` already runs it."""
    kernels = native_bf16_kernels()
    if path == "emulated":
        return "emulated"
    if path == "native":
        return kernels[0] if kernels else None
    return path if path in kernels[1:] else None


@pytest.mark.parametrize("path", ["emulated", "native", "avx512_bf16"])
def test_bf16_compute_trains_and_its_bits_depend_neither_on_threads_nor_ranks(tmp_path, text_tokens, path):
    expected = bf16_path_runs(path)
    if expected is None:
        pytest.skip(f"bf16_path={path}: this CPU has no such kernel, or native runs it already")
    settings = BF16 + [text_tokens, f"debug.bf16_path={path}", "training.steps=12"]
    runs = {}
    for threads, np in [(2, 1), (1, 1), (1, 2)]:
        run_dir = tmp_path / f"t{threads}-np{np}"
        if np == 1:
            proc = run_crucible("train", *sum((["--set", s] for s in settings), []),
                                "--set", f"job.dump_folder={run_dir}", env={"OMP_NUM_THREADS": str(threads)},
                                timeout=300)
        else:
            proc = mpirun_train([crucible_binary(), "train"], np, run_dir, settings)
        start = next(l for l in proc.stdout.splitlines() if l.startswith("phase=start"))
        assert f"compute=bfloat16 bf16_path={expected}" in start, start
        runs[(threads, np)] = steps_and_digest(proc, run_dir, ["loss"])
    steps, digest = runs[(2, 1)]
    assert steps[-1][1] < steps[0][1] - 1.0, f"bf16 training did not learn: {steps}"
    for layout, (other_steps, other_digest) in runs.items():
        assert other_steps == steps and other_digest == digest, f"{layout} differs from 2 threads, 1 rank"
    # It follows the fp32 run's curve closely, but it is not the fp32 run.
    fp32 = run_crucible("train", *sum((["--set", s] for s in settings[1:]), []),
                        "--set", f"job.dump_folder={tmp_path / 'fp32'}", timeout=300)
    fp32_steps, fp32_digest = steps_and_digest(fp32, tmp_path / "fp32", ["loss"])
    assert fp32_digest != digest
    assert max(abs(a[1] - b[1]) for a, b in zip(steps, fp32_steps)) < 0.05, (steps, fp32_steps)


@pytest.mark.parametrize("precision", ["bfloat16", "float32"])
@pytest.mark.parametrize("path", ["avx512_bf16", "amx", "native", "amx2"])
def test_a_bf16_kernel_this_cpu_lacks_or_an_unknown_one_is_refused_in_one_line(tmp_path, path, precision):
    # Under float32 the kernel would not run, but naming one this CPU lacks is refused alike.
    kernels = native_bf16_kernels()
    if path in kernels or (path == "native" and kernels):
        pytest.skip(f"this CPU runs bf16_path={path}")
    line = refused(tmp_path, f"training.mixed_precision_param={precision}", f"debug.bf16_path={path}")
    assert line.startswith("crucible: error: debug.bf16_path"), line
    assert "auto" in line, line  # what to do instead


def test_bf16_compute_resumes_bit_exactly(tmp_path, text_tokens):
    settings = BF16 + [text_tokens, "debug.bf16_path=emulated", "checkpoint.interval=3", "checkpoint.keep_latest_k=0"]
    sets_ = lambda items: sum((["--set", s] for s in items), [])
    straight = run_crucible("train", *sets_(settings + ["training.steps=6"]),
                            "--set", f"job.dump_folder={tmp_path / 'straight'}", timeout=300)
    run_crucible("train", *sets_(settings + ["training.steps=3"]), "--set", f"job.dump_folder={tmp_path / 'r'}",
                 timeout=300)
    resumed = run_crucible("train", *sets_(settings + ["training.steps=6"]),
                           "--set", f"job.dump_folder={tmp_path / 'r'}", timeout=300)
    assert "resumed" in resumed.stdout or "resume" in resumed.stdout
    assert steps_and_digest(straight, tmp_path / "straight", ["loss"])[1] == \
        steps_and_digest(resumed, tmp_path / "r", ["loss"])[1]
