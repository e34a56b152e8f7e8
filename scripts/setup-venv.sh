#!/usr/bin/env bash
# Creates the project venv for the reference tests: Debian's python3 with its python3-torch
# (pip's torch wheel is gigabytes of CUDA), plus the small packages in requirements-test.txt.
# pip's download cache lives outside the clone (~/.cache/pip), so a second clone reuses it.
set -euo pipefail
venv=${1:-.venv}
if [ ! -x "$venv/bin/python" ]; then
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r scripts/requirements-test.txt
# Packages whose declared dependencies would pull a new torch (megatron-core wants torch>=2.6):
# installed without dependencies; the tests import only the parts that work with Debian's torch.
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r scripts/requirements-nodeps.txt
"$venv/bin/python" -c "import torch, numpy; print('venv: torch', torch.__version__)"
