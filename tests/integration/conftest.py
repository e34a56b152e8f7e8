"""Shared fixtures for the integration tests: the crucible binary and a helper to run it."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def crucible_binary() -> str:
    path = os.environ.get("CRUCIBLE") or str(REPO / "build" / "crucible")
    if not Path(path).exists():
        pytest.exit(f"crucible binary not found at {path}; build first (make build) or set CRUCIBLE", 2)
    return path


@pytest.fixture(scope="session")
def crucible() -> str:
    return crucible_binary()


def run_crucible(*args, env=None, check=True, timeout=600, cwd=None):
    """Runs crucible with args; returns the CompletedProcess (text mode)."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    proc = subprocess.run([crucible_binary(), *map(str, args)], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=cwd)
    if check and proc.returncode != 0:
        raise AssertionError(f"crucible {' '.join(map(str, args))} exited {proc.returncode}\n"
                             f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def build_fuzzer(target):
    """Builds a libFuzzer target of tests/fuzz (clang, ASan + UBSan) next to the crucible binary."""
    clang = shutil.which("clang++")
    assert clang, "clang++ not found: run scripts/install-deps.sh (clang, libclang-rt-14-dev)"
    build = Path(crucible_binary()).resolve().parent / "fuzz"
    if not (build / "build.ninja").exists():
        subprocess.run(["cmake", "-S", REPO / "tests" / "fuzz", "-B", build, "-G", "Ninja",
                        f"-DCMAKE_CXX_COMPILER={clang}", "-DCMAKE_BUILD_TYPE="], check=True,
                       capture_output=True)
    proc = subprocess.run(["cmake", "--build", build, "--target", target], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return build / target
