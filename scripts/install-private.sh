#!/usr/bin/env bash
# Installs pinned Python packages into a private folder of the venv, not into the venv itself,
# for tests that need versions which must not replace the venv's own (Hugging Face transformers
# 4.40 for Debian's torch 1.13, lm-eval 0.4.3). Everything is installed with --no-deps, so pip
# never resolves or downloads torch; the tests put the folder first on PYTHONPATH in the
# subprocess that imports it. A stamp file marks a finished install; a partial one is redone.
#
#   scripts/install-private.sh VENV NAME STAMP CHECK -- PACKAGE==VERSION ...
# CHECK is Python run with the folder on PYTHONPATH after the install (it should import what the
# tests use and print the versions).
set -euo pipefail
venv=$1 name=$2 stamp_name=$3 check=$4
shift 4
[ "${1:-}" = "--" ] && shift
target="$venv/$name"
stamp="$target/$stamp_name"
[ -f "$stamp" ] && exit 0
rm -rf "$target"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --target "$target" "$@"
PYTHONPATH="$target" "$venv/bin/python" -c "$check"
touch "$stamp"
