#!/usr/bin/env bash
# Installs lm-evaluation-harness for the eval cross-check (tests/integration/test_eval_lm_eval.py)
# into a private folder, like scripts/setup-hf-interop.sh: lm-eval 0.4.3 with transformers 4.40.2
# (the newest line that runs on Debian's torch 1.13) and the datasets/accelerate/peft versions of
# that time. Everything is pinned and installed with --no-deps, so pip never resolves (or
# downloads) torch; the tests put this folder first on PYTHONPATH in the subprocess that runs
# lm_eval. lm-eval 0.4.3 is the first release whose import does not fetch a metric from the hub.
set -euo pipefail
export HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
exec "$(dirname "$0")/install-private.sh" "${1:-.venv}" lm-eval .stamp-0.4.3-1 \
  "import lm_eval.evaluator, lm_eval.models.huggingface, torch, transformers; print('lm-eval: 0.4.3, transformers', transformers.__version__, 'torch', torch.__version__)" -- \
  lm-eval==0.4.3 transformers==4.40.2 tokenizers==0.19.1 huggingface_hub==0.23.4 safetensors==0.4.3 \
  accelerate==0.30.1 datasets==2.19.2 evaluate==0.4.2 peft==0.10.0 \
  pyarrow==16.1.0 pyarrow-hotfix==0.6 pandas==2.2.2 pytz==2024.1 tzdata==2024.1 \
  python-dateutil==2.9.0.post0 six==1.16.0 dill==0.3.8 multiprocess==0.70.16 xxhash==3.4.1 \
  aiohttp==3.9.5 aiosignal==1.3.1 frozenlist==1.4.1 multidict==6.0.5 yarl==1.9.4 attrs==23.2.0 \
  sqlitedict==2.1.0 jsonlines==4.0.0 more-itertools==10.2.0 psutil==5.9.8 \
  sacrebleu==2.4.2 portalocker==2.8.2 tabulate==0.9.0 colorama==0.4.6 lxml==5.2.2 \
  scikit-learn==1.4.2 scipy==1.13.1 joblib==1.4.2 threadpoolctl==3.5.0 \
  jinja2==3.1.4 markupsafe==2.1.5 \
  regex==2024.11.6 pyyaml==6.0.2 requests==2.32.3 urllib3==2.2.3 idna==3.10 certifi==2024.8.30 \
  charset-normalizer==3.4.0 filelock==3.16.1 fsspec==2024.3.1 packaging==24.2 tqdm==4.67.1 \
  typing_extensions==4.12.2
