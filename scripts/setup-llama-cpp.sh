#!/usr/bin/env bash
# Builds the llama.cpp test environment: llama-cpp-python (which compiles llama.cpp from its
# vendored source with cmake) and the `gguf` package, pinned in scripts/requirements-llama.txt,
# so that tests/integration/test_gguf.py reads `crucible export gguf` files with llama.cpp's own
# reader and runs them in llama.cpp. Prints the environment's python as the last line of stdout;
# the tests run it in subprocesses.
#
# llama.cpp is built for the CPU only and without -march=native: AVX, AVX2, FMA, F16C and BMI2
# (x86-64-v3), no AVX-512, so the venv runs on any x86-64-v3 machine that shares the cache. The
# compile runs under `nice -n 10` on every core (CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)); it prints
# its duration, also kept in <venv>/.build-seconds. The folder is
#   ${CRUCIBLE_CACHE:-${XDG_CACHE_HOME:-~/.cache}/crucible}/venv-llama-<key>
# where <key> hashes the requirements file, this script and the Python version: changing any of
# them builds a new one, and every clone on the machine shares it. A stamp written last marks a
# complete install; a folder without it (an interrupted or failed install) is deleted and redone,
# never used. As in scripts/setup-current.sh, older keys' folders are left in place.
# Measured: 451 s for the llama.cpp compile on 2 cores shared with other builds (2026-12-07).
#
# `setup-llama-cpp.sh --find` builds nothing: it prints the python when the venv is complete and
# exits 1 otherwise (tests/integration/conftest.py's llama_python, so a bare pytest run skips).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
requirements=$repo/scripts/requirements-llama.txt
python=/usr/bin/python3
root=${CRUCIBLE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/crucible}
key=$({ cat "$requirements" "$0"; "$python" -VV; } | sha256sum | cut -c1-16)
venv=$root/venv-llama-$key
stamp=$venv/.complete

if [ "${1:-}" = --find ]; then
  [ -f "$stamp" ] || { echo "setup-llama-cpp: $venv is not built (make llama-env)" >&2; exit 1; }
  echo "$venv/bin/python"
  exit 0
fi
mkdir -p "$root"
exec 9>"$root/.venv-llama.lock"
flock 9  # one install at a time (two clones, or two test runs, on one machine)
if [ ! -f "$stamp" ]; then
  echo "setup-llama-cpp: building llama-cpp-python and installing $(grep -c '==' "$requirements")" \
    "pinned packages into $venv (the llama.cpp compile takes minutes)" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps)
  # The build backend first: llama-cpp-python is then built against it, without isolation.
  "${pip[@]}" $(grep -E '^(scikit-build-core|pathspec|packaging)==' "$requirements")
  "${pip[@]}" -r <(grep -v '^llama-cpp-python==' "$requirements")
  start=$(date +%s)
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_CPU_ALL_VARIANTS=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \
-DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_BLAS=OFF -DGGML_CUDA=OFF \
-DGGML_VULKAN=OFF -DGGML_METAL=OFF -DLLAVA_BUILD=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    nice -n 10 "${pip[@]}" --no-build-isolation --no-binary llama-cpp-python \
    "$(grep '^llama-cpp-python==' "$requirements")"
  seconds=$(($(date +%s) - start))
  echo "$seconds" >"$venv/.build-seconds"
  "$venv/bin/python" -m pip check --disable-pip-version-check >&2
  "$venv/bin/python" -c "
import gguf, llama_cpp
from importlib.metadata import version
print('setup-llama-cpp:', ', '.join(f'{p} {version(p)}' for p in ['llama-cpp-python', 'gguf', 'numpy']),
      '(llama.cpp built in $seconds s on $(nproc) cores)')
" >&2
  touch "$stamp"
fi
echo "$venv/bin/python"
