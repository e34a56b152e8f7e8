#!/usr/bin/env bash
# Builds the "current" test environment: today's releases of the tools Crucible interoperates
# with (scripts/requirements-current.txt: torch on the CPU, transformers 5, tokenizers, lm-eval,
# accelerate, megatron-core, trl), so that the interop and reference tests run against them as well
# as against the pinned set of the project venv (.venv: Debian's torch 1.13, and the private
# folders of setup-hf-interop.sh and setup-lm-eval.sh). Prints the environment's python as the
# last line of stdout; the tests run it in subprocesses.
#
# It is a venv of Debian's python3 without the system site packages (Debian's torch must not
# shadow the new one), kept outside the clone because it is large: pip's torch wheel brings the
# CUDA 13 libraries (3.2 GB to download in all, 6.2 GB installed), which the CPU tests never call
# but without which torch does not import. The folder is
#   ${CRUCIBLE_CACHE:-${XDG_CACHE_HOME:-~/.cache}/crucible}/venv-current-<key>
# where <key> hashes the requirements file, this script and the Python version: changing any of
# them builds a new one, and every clone on the machine shares it. A stamp written last marks a
# complete install; a folder without it (an interrupted or failed install) is deleted and redone,
# never used. Folders of older keys are left in place (delete them by hand to free the space).
# Whether a rebuild downloads everything again depends on pip's HTTP cache (~/.cache/pip), that is
# on the index's cache headers. Cost and bumping: docs/testing.md.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
requirements=$repo/scripts/requirements-current.txt
python=/usr/bin/python3
root=${CRUCIBLE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/crucible}
key=$({ cat "$requirements" "$0"; "$python" -VV; } | sha256sum | cut -c1-16)
venv=$root/venv-current-$key
stamp=$venv/.complete

mkdir -p "$root"
exec 9>"$root/.venv-current.lock"
flock 9  # one install at a time (two clones, or two test runs, on one machine)
if [ ! -f "$stamp" ]; then
  echo "setup-current: installing $(grep -c '==' "$requirements") pinned packages into $venv" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --use-pep517)
  megatron=$(grep '^megatron-core==' "$requirements")
  "${pip[@]}" -r <(grep -v '^megatron-core==' "$requirements")
  # megatron-core >= 0.19 declares Requires-Python >= 3.12 (Debian 12 has 3.11) but ships cp311
  # wheels, its compiled helpers_cpp included; the modules the tests import run on 3.11.
  "${pip[@]}" --ignore-requires-python --only-binary=:all: "$megatron"
  "$venv/bin/python" -m pip check --disable-pip-version-check >&2
  (cd "$repo/tests/integration" && "$venv/bin/python" -c "
import accelerate, lm_eval, lm_eval.evaluator, lm_eval.models.huggingface, numpy, safetensors
import lion_pytorch, tokenizers, torch, transformers, trl, trl.trainer.grpo_trainer
import megatron_compat
megatron_compat.indexed_dataset(), megatron_compat.blending_helper()
from importlib.metadata import version
print('setup-current:', ', '.join(f'{p} {version(p)}' for p in
      ['torch', 'transformers', 'tokenizers', 'lm_eval', 'accelerate', 'megatron-core', 'numpy',
       'lion-pytorch', 'trl']))
" >&2)
  touch "$stamp"
fi
echo "$venv/bin/python"
