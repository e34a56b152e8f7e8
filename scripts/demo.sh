#!/usr/bin/env bash
# `make demo`: the main job end to end on the embedded default, in about ten minutes on 2 cores.
#  1. fetch real English text from Debian packages (scripts/fetch-demo-corpora.sh): the King James
#     Bible, fortunes, the Jargon File and the GCIDE dictionary, as jsonl documents;
#  2. train a byte-level BPE tokenizer (8192 ids) on them;
#  3. prepare each corpus as its own Megatron .bin/.idx shard with a manifest;
#  4. blend them with weights (a blendcorpus file list) and report the realised mixture;
#  5. score the untrained model on the demo tasks (configs/tasks, scripts/make-demo-tasks.py);
#  6. train the `tiny` model on the blend under `crucible launch` on 2 local ranks, with rank 1
#     killed partway (the demo switch debug.kill_rank / debug.kill_step: SIGKILL, as a node that
#     dies, in the first attempt only); the launcher classifies the failure and relaunches, the
#     trainer resumes from its last checkpoint;
#  7. train the same model uninterrupted as one process (the same global batch) and print both
#     runs' weights hashes side by side: they are equal;
#  8. print the loss curve and the accuracy after training, and write demo/report.html (loss,
#     LR, throughput, eval accuracy, the launch's attempt timeline), which opens offline.
# Everything lands in demo/ (corpora/, tokenizer.json, shards/, blend.txt, run/, reference/,
# report.html).
# DEMO_STEPS=N trains N steps instead of configs/demo.toml's (a quick end-to-end check); the kill
# comes at 60% of the steps, after at least one checkpoint (every DEMO_STEPS/4 steps).
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

# The job under the launcher: 2 ranks on this machine, micro-batches of 2 samples, the global
# batch of configs/demo.toml (4), a checkpoint every quarter; rank 1 dies at 60% of the steps.
# The uninterrupted run is one process with the same micro-batch and global batch (2 micro-batches
# a step): the bits do not depend on the number of ranks, only on the micro-batch size.
every=$(( steps / 4 > 0 ? steps / 4 : 1 ))
kill_step=$(( steps * 3 / 5 > every ? steps * 3 / 5 : every + 1 ))
common=(--config configs/demo.toml --set "model.tokenizer_path=$out/tokenizer.json"
  --set "training.dataset_path=$out/blend.txt" --set "training.steps=$steps"
  --set "training.local_batch_size=2" --set "training.global_batch_size=4")
rm -rf "$out/run" "$out/reference"
say "training under crucible launch on 2 ranks; rank 1 will be killed before step $kill_step"
"$crucible" launch --np 2 --retries 2 --backoff-base 1 --run-dir "$out/run" -- \
  "$crucible" train "${common[@]}" --set "job.dump_folder=$out/run" \
  --set "checkpoint.interval=$every" \
  --set "debug.kill_rank=1" --set "debug.kill_step=$kill_step" 2>&1 |
  grep --line-buffered -E "step=.*(0|$steps) loss=|fault:|launch: attempt|phase=resume from|error" || true
python3 - "$out/run/launch/attempts.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    a = json.loads(line)
    if a.get("kind") != "attempt":
        continue
    print(f"demo:   attempt {a.get('attempt')}: steps {a.get('first_step')}..{a.get('last_step')}, "
          f"exit {a.get('exit_code')}, verdict {a.get('verdict')}"
          + (f" ({a['evidence']})" if a.get('evidence') else ""))
PY
say "the same training uninterrupted, as one process"
"$crucible" train "${common[@]}" --set "job.dump_folder=$out/reference" --set "checkpoint.enable=false" \
  > "$out/reference.log" 2>&1
hash_of() { cat "$@" | grep -o 'weights_xxh3=[0-9a-f]*' | tail -n 1 | cut -d= -f2; }
recovered=$(hash_of "$out"/run/launch/attempt-*.log)
uninterrupted=$(hash_of "$out/reference.log")
echo "demo: weights after $steps steps   killed, relaunched, resumed (2 ranks): ${recovered:-missing}"
echo "demo:                           uninterrupted (1 process):          ${uninterrupted:-missing}"
if [ -z "$recovered" ] || [ "$recovered" != "$uninterrupted" ]; then
  echo "demo: error: the recovered run's weights differ from the uninterrupted run's" >&2
  exit 1
fi
echo "demo: identical: the crash, the relaunch and the resume left no trace in the weights"
# ... and after.
# (both scores go into the run's eval/ folder, where crucible report finds them)
mkdir -p "$out/run/eval"
cp "$out/eval-before.json" "$out/run/eval/untrained.json"
"$crucible" eval -q "$out/run" --tasks configs/tasks/*.jsonl --json "$out/run/eval/trained.json"
python3 - "$out/run/eval/untrained.json" "$out/run/eval/trained.json" <<'PY'
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
say "run directory $out/run (config.toml, metrics.jsonl, launch/attempts.jsonl, ckpt/, model.safetensors)"
"$crucible" report "$out/run" "$out/reference" -o "$out/report.html" | tail -n 1
say "open $out/report.html in a browser (self-contained, works offline)"
