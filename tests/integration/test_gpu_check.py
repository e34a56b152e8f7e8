"""The lent-GPU check (scripts/gpu-check.sh) run here, where there is no GPU: a dry run must fail
every CUDA stage in one line (no false PASS), end by its deadline, and leave summary.txt and
logs.tar.gz behind even when it is killed partway. The pack is built from this build
(scripts/pack-gpu-build.sh), which also says the glibc it needs."""
import os
import re
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from conftest import REPO, crucible_binary

CUDA_STAGES = ("test_gpu", "smoke_portable_cuda", "train_cuda", "train_cuda_again",
               "train_cuda_bf16", "train_cuda_resumed", "resume_cpu_on_cuda",
               "detector_bf16_master", "detector_fp32_master", "bench_gpu_train")


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    build = Path(crucible_binary()).resolve().parent
    if not (build / "test_gpu").exists():
        pytest.skip(f"{build} has no CUDA build (test_gpu): the pack needs the CUDA toolkit")
    folder = tmp_path_factory.mktemp("pack") / "gpu-pack"
    proc = subprocess.run([REPO / "scripts" / "pack-gpu-build.sh", build, folder],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    needed = re.search(r"the pack needs glibc (\d+\.\d+) or newer", proc.stdout)
    assert needed, proc.stdout
    with tarfile.open(folder / "crucible-gpu.tar.gz") as tar:
        recorded = tar.extractfile("glibc").read().decode().strip()
    assert recorded == needed.group(1)
    return folder


def run_check(pack, out, deadline):
    env = dict(os.environ, GPU_PACK=str(pack), OUT=str(out), GPU_CHECK_DEADLINE_S=str(deadline),
               CUDA_VISIBLE_DEVICES="")
    command = [str(REPO / "scripts" / "gpu-check.sh")]
    began = time.monotonic()
    proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=deadline + 120)
    return proc, time.monotonic() - began


def logs_in(out):
    with tarfile.open(out / "logs.tar.gz") as tar:
        return {Path(name).name for name in tar.getnames()}


def test_a_dry_run_without_a_gpu_fails_every_cuda_stage_in_one_line_and_ends_by_its_deadline(
        pack, tmp_path):
    deadline = 70
    proc, took = run_check(pack, tmp_path, deadline)
    summary = (tmp_path / "summary.txt").read_text()
    assert took < deadline + 15, f"took {took:.0f} s against a {deadline} s deadline\n{summary}"
    assert summary.startswith("glibc here: "), summary
    assert "glibc: PASS" in summary, summary
    lines = {line.split(":")[0]: line for line in summary.splitlines() if ":" in line}
    for stage in CUDA_STAGES:
        line = lines.get(stage)
        if line is None:  # a stage that needs an earlier one's checkpoint says so in one line too
            continue
        assert "FAIL" in line and "PASS" not in line, line
    assert "no CUDA GPU: FAIL" in lines["test_gpu"], lines["test_gpu"]
    assert not re.search(r"^(train_cuda|cuda run to run|cuda resume|frozen-RMSNorm).*PASS", summary,
                         re.M), summary
    assert re.search(r"^gpu-check: \d+ failing checks", summary, re.M), summary
    names = logs_in(tmp_path)
    assert {"summary.txt", "test_gpu.log", "ldd.txt"} <= names, names


def test_a_dry_run_killed_partway_leaves_its_summary_and_logs(pack, tmp_path):
    # SIGTERM (what `timeout` and the device tool send) while train_cpu, the one long stage of a
    # dry run, is in flight (its predecessor train_cuda is in the summary), whatever the load: the
    # trap must stop the stage and still write the summary and the logs.
    env = dict(os.environ, GPU_PACK=str(pack), OUT=str(tmp_path), GPU_CHECK_DEADLINE_S="300",
               CUDA_VISIBLE_DEVICES="")
    proc = subprocess.Popen([str(REPO / "scripts" / "gpu-check.sh")], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    summary = tmp_path / "summary.txt"
    began = time.monotonic()
    while time.monotonic() - began < 180 and proc.poll() is None:
        if summary.exists() and "train_cuda: " in summary.read_text():
            break
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()[0]
    proc.terminate()
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 143, output
    text = summary.read_text()
    assert "stopped by a signal" in text, text
    assert "test_gpu: FAIL" in text and "train_cpu: " not in text, text
    assert {"summary.txt", "test_gpu.log"} <= logs_in(tmp_path)
