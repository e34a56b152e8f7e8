#!/usr/bin/env bash
# Installs Hugging Face transformers for the interop tests (tests/integration/test_hf_interop.py)
# into a private folder, not into the venv itself: transformers 4.40 is the newest line that
# runs on Debian's torch 1.13, and it needs tokenizers 0.19 / huggingface_hub < 1.0, which must
# not replace the newer versions other tests use. The tests put this folder first on PYTHONPATH
# in the subprocess that imports transformers. Nothing here installs torch (--no-deps, pinned).
set -euo pipefail
exec "$(dirname "$0")/install-private.sh" "${1:-.venv}" hf-interop .stamp-4.40.2 \
  "import transformers, torch; print('hf-interop: transformers', transformers.__version__, 'torch', torch.__version__)" -- \
  transformers==4.40.2 tokenizers==0.19.1 huggingface_hub==0.36.2 regex==2024.11.6 \
  pyyaml==6.0.2 requests==2.32.3 urllib3==2.2.3 idna==3.10 certifi==2024.8.30 \
  charset-normalizer==3.4.0 filelock==3.16.1 fsspec==2024.10.0 packaging==24.2 tqdm==4.67.1 \
  typing_extensions==4.12.2
