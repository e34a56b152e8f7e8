#!/usr/bin/env bash
# `make demo`: the main job end to end on the embedded default. Trains the `tiny` model on real
# English text shipped with Debian (the license texts in /usr/share/common-licenses, as byte
# tokens) and prints the loss curve. Takes a few minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
crucible=${CRUCIBLE:-build/crucible}
out=demo
mkdir -p "$out"
python3 - "$out/text.u16" <<'PY'
import glob, sys
data = b"".join(open(p, "rb").read() for p in sorted(glob.glob("/usr/share/common-licenses/*")) if not p.endswith(".gz"))
with open(sys.argv[1], "wb") as f:
    for byte in data:
        f.write(bytes((byte, 0)))
print(f"demo: {len(data)} bytes of text from /usr/share/common-licenses", file=sys.stderr)
PY
"$crucible" train --config configs/demo.toml --set "training.dataset_path=$out/text.u16" \
  --set "job.dump_folder=$out/run"
echo "demo: run directory $out/run (config.toml, metrics.jsonl, model.safetensors)"
