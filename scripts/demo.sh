#!/usr/bin/env bash
# `make demo`: the main job end to end on the embedded default, in about ten minutes on 2 cores.
#  1. fetch real English text from Debian packages (scripts/fetch-demo-corpora.sh): the King James
#     Bible, fortunes, the Jargon File and the GCIDE dictionary, as jsonl documents;
#  2. train a byte-level BPE tokenizer (8192 ids) on them;
#  3. prepare each corpus as its own Megatron .bin/.idx shard with a manifest;
#  4. blend them with weights (a blendcorpus file list) and report the realised mixture;
#  5. score the untrained model on the demo tasks (configs/tasks, scripts/make-demo-tasks.py),
#     train the `tiny` model on the blend, print the loss curve and the accuracy after training.
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
steps=${DEMO_STEPS:-$("$crucible" train --config configs/demo.toml --print-config |
  awk '/^\[/ { section = $0 } section == "[training]" && $1 == "steps" { print $3 }')}
"$crucible" data inspect -q --list "$out/blend.txt" --seq-len 256 --samples $((steps * 4)) \
  --tokenizer "$out/tokenizer.json" --decode 1
say "blend $out/blend.txt"

# Downstream accuracy before training (the freshly initialised weights: a 0-step run) ...
"$crucible" train --config configs/demo.toml --set "model.tokenizer_path=$out/tokenizer.json" \
  --set "training.dataset_path=$out/blend.txt" --set "job.dump_folder=$out/init" \
  --set "training.steps=0" --resume none > "$out/init.log"
"$crucible" eval -q "$out/init" --tasks configs/tasks/*.jsonl --json "$out/eval-before.json" > /dev/null
say "accuracy of the untrained model in $out/eval-before.json"

"$crucible" train --config configs/demo.toml --set "model.tokenizer_path=$out/tokenizer.json" \
  --set "training.dataset_path=$out/blend.txt" --set "job.dump_folder=$out/run" \
  --set "training.steps=$steps"
# ... and after.
"$crucible" eval -q "$out/run" --tasks configs/tasks/*.jsonl --json "$out/eval-after.json"
python3 - "$out/eval-before.json" "$out/eval-after.json" <<'PY'
import json, sys
before, after = (json.load(open(p)) for p in sys.argv[1:3])
def tasks(doc):
    items = doc["tasks"] if isinstance(doc["tasks"], list) else [dict(v, name=k) for k, v in doc["tasks"].items()]
    return {t["name"]: t for t in items}
b, a = tasks(before), tasks(after)
print("demo: downstream accuracy, before -> after training (chance; standard error; distance from chance)")
for name in a:
    t = a[name]
    z = (t["acc"] - t["chance"]) / t["acc_stderr"] if t["acc_stderr"] > 0 else 0.0
    print(f"demo:   {name:16s} acc {b[name]['acc']:.3f} -> {t['acc']:.3f}   acc_norm {b[name]['acc_norm']:.3f} -> "
          f"{t['acc_norm']:.3f}   (chance {t['chance']:.3f}; stderr {t['acc_stderr']:.3f}; {z:+.1f} SE)")
PY
python3 - "$out/run/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
first, last = rows[0], rows[-1]
print(f"demo: loss {first['loss']:.3f} at step {first['step']} -> {last['loss']:.3f} at step {last['step']} "
      f"({last['tokens']} tokens of the blend)")
PY
say "run directory $out/run (config.toml, metrics.jsonl, ckpt/, model.safetensors)"
