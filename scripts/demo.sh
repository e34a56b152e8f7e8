#!/usr/bin/env bash
# `make demo`: the main job end to end on the embedded default, in about ten minutes on 2 cores.
#  1. fetch real English text from Debian packages (scripts/fetch-demo-corpora.sh): the King James
#     Bible, fortunes, the Jargon File and the GCIDE dictionary, as jsonl documents;
#  2. train a byte-level BPE tokenizer (8192 ids) on them;
#  3. prepare each corpus as its own Megatron .bin/.idx shard with a manifest;
#  4. blend them with weights (a blendcorpus file list) and report the realised mixture;
#  5. train the `tiny` model on the blend and print the loss curve.
# Everything lands in demo/ (corpora/, tokenizer.json, shards/, blend.txt, run/).
# DEMO_STEPS=N trains N steps instead of configs/demo.toml's (a quick end-to-end check).
set -euo pipefail
cd "$(dirname "$0")/.."
crucible=${CRUCIBLE:-build/crucible}
out=demo
start=$(date +%s)
say() { echo "demo: $* ($(( $(date +%s) - start )) s)"; }

scripts/fetch-demo-corpora.sh "$out/corpora"
say "corpora in $out/corpora"

"$crucible" tokenizer train --vocab-size 8192 -o "$out/tokenizer.json" "$out"/corpora/*.jsonl | tail -n 1
say "tokenizer $out/tokenizer.json"

for corpus in kjv fortunes jargon gcide; do
  "$crucible" data prepare -q -t "$out/tokenizer.json" -o "$out/shards/$corpus" "$out/corpora/$corpus.jsonl"
done
say "shards in $out/shards"

cat > "$out/blend.txt" <<LIST
# weight  prefix            corpus   (blendcorpus file list; prefixes relative to this file)
0.4       shards/kjv        bible
0.2       shards/fortunes   fortunes
0.2       shards/jargon     jargon
0.2       shards/gcide      dictionary
LIST
"$crucible" data verify --list "$out/blend.txt" | tail -n 1
steps=${DEMO_STEPS:-$("$crucible" train --config configs/demo.toml --print-config | sed -n 's/^steps = //p')}
"$crucible" data inspect -q --list "$out/blend.txt" --seq-len 256 --samples $((steps * 4)) \
  --tokenizer "$out/tokenizer.json" --decode 1
say "blend $out/blend.txt"

"$crucible" train --config configs/demo.toml --set "model.tokenizer_path=$out/tokenizer.json" \
  --set "training.dataset_path=$out/blend.txt" --set "job.dump_folder=$out/run" \
  --set "training.steps=$steps"
python3 - "$out/run/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
first, last = rows[0], rows[-1]
print(f"demo: loss {first['loss']:.3f} at step {first['step']} -> {last['loss']:.3f} at step {last['step']} "
      f"({last['tokens']} tokens of the blend)")
PY
say "run directory $out/run (config.toml, metrics.jsonl, ckpt/, model.safetensors)"
