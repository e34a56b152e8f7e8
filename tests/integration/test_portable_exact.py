"""The portable exact mode ([debug] portable_exact, crucible smoke --portable): one golden for every
device, independent of ranks and threads, and kernels that call no libm and fuse no operations."""
import json
import os
import pathlib
import shutil
import subprocess

import pytest

from conftest import REPO, crucible_binary, run_crucible

PORTABLE = REPO / "tests" / "golden" / "smoke-portable.json"
FP32 = REPO / "tests" / "golden" / "smoke.json"
LIBM = {"exp", "expf", "log", "logf", "sin", "sinf", "cos", "cosf", "pow", "powf", "tanh", "tanhf",
        "exp2", "exp2f", "log2", "log1p", "expm1", "sincos", "sincosf", "erf", "erff"}


@pytest.mark.parametrize("ranks,threads", [(1, "2"), (1, "1"), (2, "1")])
def test_portable_smoke_passes_on_any_rank_and_thread_count(ranks, threads):
    proc = run_crucible("smoke", "--portable", "--ranks", ranks, env={"CRUCIBLE_SMOKE_THREADS": threads})
    assert "smoke: PASS" in proc.stdout and "smoke-portable.json" in proc.stdout


def test_portable_golden_differs_from_fp32_and_update_reproduces_it(tmp_path):
    portable, fp32 = json.loads(PORTABLE.read_text()), json.loads(FP32.read_text())
    assert "portable_exact = true" in portable["config"] and "portable_exact" not in fp32["config"]
    assert [s["loss_bits"] for s in portable["steps"]] != [s["loss_bits"] for s in fp32["steps"]]
    # Same run, same losses to a few digits: the portable kernels compute the same math.
    for a, b in zip(portable["steps"], fp32["steps"]):
        assert abs(a["loss"] - b["loss"]) < 1e-5
    golden = tmp_path / "golden.json"
    run_crucible("smoke", "--portable", "--golden", golden, "--update")
    assert json.loads(golden.read_text()) == portable, "stale: rerun crucible smoke --portable --update"
    run_crucible("smoke", "--golden", FP32)  # the fp32 gate still holds its own golden


def test_smoke_on_another_device_without_portable_is_refused_and_cuda_says_why_it_cannot_run():
    proc = run_crucible("smoke", "--device", "cuda", check=False)
    assert proc.returncode == 2 and "add --portable" in proc.stderr, proc.stderr
    # With a GPU the CPU's golden must hold; without one (or without the CUDA backend) the smoke
    # fails in one line that carries the training run's reason, exit 2 (a configuration this
    # machine cannot run), never 1 (a difference from the golden).
    proc = run_crucible("smoke", "--portable", "--device", "cuda", check=False)
    if proc.returncode == 0:
        assert "smoke: PASS" in proc.stdout and "device=cuda" in proc.stdout, proc.stdout
    else:
        lines = [l for l in proc.stderr.splitlines() if l.strip()]
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert 'training.device = "cuda"' in lines[0], lines[0]


def test_portable_bfloat16_is_refused_in_one_line(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[model]\nflavor = "debug"\n[training]\nsteps = 1\nseq_len = 16\n'
                      'dataset = "synthetic"\nmixed_precision_param = "bfloat16"\n'
                      '[debug]\nportable_exact = true\n')
    proc = run_crucible("train", "--config", config, "--set", f"job.dump_folder={tmp_path / 'run'}",
                        check=False)
    assert proc.returncode == 2
    assert "portable_exact computes in float32 only" in proc.stderr


def test_portable_backend_object_calls_no_libm_transcendental():
    obj = (pathlib.Path(crucible_binary()).parent / "CMakeFiles" / "crucible_core.dir" / "src" /
           "compute" / "portable_backend.cc.o")
    if not obj.exists() or not shutil.which("nm"):
        pytest.skip(f"no {obj} or no nm")
    undefined = {line.split()[-1].split("@")[0] for line in
                 subprocess.run(["nm", "-u", obj], capture_output=True, text=True, check=True).stdout.splitlines()}
    assert not undefined & LIBM, f"libm called: {sorted(undefined & LIBM)}"


def test_portable_header_compiles_with_nvcc_without_fused_or_library_math(tmp_path):
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    if not nvcc:
        pytest.skip("nvcc not installed: the CUDA compile check of compute/portable/ is skipped")
    ptx = tmp_path / "check.ptx"
    subprocess.run([nvcc, "-std=c++20", "-x", "cu", f"-I{REPO / 'src'}", "-ptx",
                    REPO / "tests" / "cuda" / "portable_kernels_check.cu", "-o", ptx], check=True)
    text = ptx.read_text()
    assert "fma." not in text, "nvcc fused a multiply-add in the portable kernels"
    assert "call" not in text.replace("// ", ""), "the portable kernels call a library function"
