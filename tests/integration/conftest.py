"""Shared fixtures for the integration tests: the crucible binary and a helper to run it, and the
pinned and current Python package sets the interop and reference tests run against."""
import os
import shutil
import subprocess
import sys
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


def cpu_flags() -> set:
    """The feature flags /proc/cpuinfo lists for this CPU."""
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def native_bf16_kernels() -> list:
    """The CPU backend's native bf16 kernels this CPU has, by their [debug] bf16_path names, the
    one `auto` and `native` pick first (kernels/cpu/gemm_bf16.h)."""
    flags = cpu_flags()
    kernels = []
    if {"avx512_bf16", "amx_bf16", "amx_tile"} <= flags:
        kernels.append("amx")
    if "avx512_bf16" in flags:
        kernels.append("avx512_bf16")
    return kernels


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


# The two sets of Python packages the interop and reference tests run against, each test once per
# set (its id says which): "pinned" is the project venv (Debian's torch 1.13, megatron-core
# 0.16.1; transformers 4.40.2 and lm-eval 0.4.3 in private folders of it), "current" today's
# releases (scripts/requirements-current.txt: torch 2.15 from PyPI, transformers 5, lm-eval
# 0.4.13, megatron-core 0.19), a venv outside the clone built by scripts/setup-current.sh.
# Both run in subprocesses, so two versions of a package never meet in one process.
STACKS = ["pinned", "current"]
_current_python = []


def current_python() -> str:
    """The python of the current set; scripts/setup-current.sh installs it when missing."""
    if not _current_python:
        proc = subprocess.run([str(REPO / "scripts" / "setup-current.sh")], stdout=subprocess.PIPE, text=True)
        assert proc.returncode == 0, ("scripts/setup-current.sh failed (its output is above): the current "
                                      "test environment is missing; run `make current-env` and see its error")
        _current_python.append(proc.stdout.strip().splitlines()[-1])
    return _current_python[0]


def llama_python():
    """The python of the llama.cpp venv (llama-cpp-python and gguf, scripts/setup-llama-cpp.sh),
    or None when it is not built: `make test` builds it first (make llama-env); a bare pytest run
    does not start the minutes-long compile."""
    proc = subprocess.run([str(REPO / "scripts" / "setup-llama-cpp.sh"), "--find"], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)
    return proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 else None


class PythonEnv:
    """One interpreter with one set of packages, run in a subprocess with the helpers of
    tests/integration importable (and `folder`, a private package folder, first on the path)."""

    def __init__(self, stack, python, folder=None):
        self.stack, self.python, self.folder = stack, python, folder

    def run(self, code, *args, env=None, timeout=900):
        """Runs python code with args; returns its stdout (fails the test with its stderr)."""
        path = ([str(self.folder)] if self.folder else []) + [str(REPO / "tests" / "integration")]
        full_env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), OMP_NUM_THREADS="1")
        full_env.update(env or {})
        proc = subprocess.run([self.python, "-c", code, *map(str, args)], capture_output=True, text=True,
                              env=full_env, timeout=timeout)
        assert proc.returncode == 0, f"{self.stack} python exited {proc.returncode}:\n{proc.stderr[-5000:]}"
        return proc.stdout


def python_env(stack, setup=None, folder=None) -> PythonEnv:
    """The PythonEnv of `stack`. For "pinned", the project venv, with `folder` of it first on the
    path after running scripts/`setup` (which installs that folder when missing)."""
    if stack == "current":
        return PythonEnv(stack, current_python())
    venv = Path(sys.executable).parent.parent
    if setup:
        subprocess.run([str(REPO / "scripts" / setup), str(venv)], check=True)
    return PythonEnv(stack, sys.executable, venv / folder if folder else None)


def write_bpe_tokenizer(folder, text):
    """A byte-level BPE tokenizer (tokenizers, 300 ids, <|endoftext|> special) trained on `text`,
    saved as folder/tokenizer.json; returns the ids `crucible eval --text` scores for the text
    (the end-of-text id first, as its document prefix)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator([text] * 4, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tokenizer.save(str(folder / "tokenizer.json"))
    return [tokenizer.token_to_id("<|endoftext|>")] + tokenizer.encode(text).ids
