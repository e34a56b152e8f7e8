"""Shared fixtures for the integration tests: the crucible binary and a helper to run it."""
import os
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
