#!/usr/bin/env bash
# `make demo-post`: from pre-training to a chat model on the demo corpora, in about ten minutes on
# 2 cores (docs/post-training.md "Worked path: from pre-training to a chat model").
#  1. the demo corpora (demo/corpora when `make demo` left them, else scripts/fetch-demo-corpora.sh),
#     each split into training documents and held-out text (every 50th document);
#  2. a byte-level BPE tokenizer (8192 ids) holding ChatML's markers <|im_start|> <|im_end|> (and
#     <|endoftext|>, the EOS) as special tokens, and one Megatron shard per corpus;
#  3. pre-train the `tiny` model on blend A (KJV, fortunes, GCIDE; configs/demo-post/pretrain.toml);
#  4. continue pre-training from those weights on blend B (the Jargon File, 20% of blend A replayed)
#     in two stages, twice: lr_policy rewarm and gentle (configs/demo-post/cpt.toml), each scoring
#     the demo tasks and the held-out text of every corpus at every stage boundary; print both
#     runs' eval/stages.jsonl side by side and what changed on blend A's corpora (forgetting);
#  5. build a conversation set from the corpora (scripts/make-sft-conversations.py: "What does the
#     Jargon File say about X?" -> the entry) and fine-tune the gentle CPT run on it
#     (configs/demo-post/sft.toml, `[training] dataset = "sft"`, ChatML);
#  6. `crucible generate --chat` on held-out questions, next to the entries' own answers.
# Everything lands in demo-post/ (DEMO_POST_OUT): corpora/ (when fetched), train/, heldout/,
# tokenizer.json, shards/, blend-a.txt, blend-b.txt, pre/, cpt-rewarm/, cpt-gentle/, sft/ (the
# conversations), sft-run/ (the chat model).
# Smaller runs (the test, a quick check): DEMO_POST_CORPORA=DIR (kjv, fortunes, jargon, gcide .jsonl),
# DEMO_POST_PRE_STEPS, DEMO_POST_CPT_STEPS (both stages together), DEMO_POST_SFT_STEPS,
# DEMO_POST_EVAL_ITEMS (items per task and held-out documents per corpus at each boundary),
# DEMO_POST_QUESTIONS (held-out questions to generate for), DEMO_POST_SFT_ARGS (options of
# make-sft-conversations.py, e.g. "--gcide 40").
set -euo pipefail
cd "$(dirname "$0")/.."
crucible=${CRUCIBLE:-build/crucible}
out=${DEMO_POST_OUT:-demo-post}
pre_steps=${DEMO_POST_PRE_STEPS:-400}
cpt_steps=${DEMO_POST_CPT_STEPS:-200}
sft_steps=${DEMO_POST_SFT_STEPS:-250}
eval_items=${DEMO_POST_EVAL_ITEMS:-150}
questions=${DEMO_POST_QUESTIONS:-3}
start=$(date +%s)
say() { echo "demo-post: $* ($(( $(date +%s) - start )) s)"; }
mkdir -p "$out"

# 1. Corpora: reuse, else fetch; hold out every 50th document of each for the boundary evaluations.
corpora=${DEMO_POST_CORPORA:-}
if [ -z "$corpora" ]; then
  if [ -s demo/corpora/jargon.jsonl ]; then corpora=demo/corpora; else
    scripts/fetch-demo-corpora.sh "$out/corpora"; corpora=$out/corpora; fi
fi
python3 - "$corpora" "$out" <<'PY'
import os, sys
src, out = sys.argv[1:3]
for corpus in ["kjv", "fortunes", "jargon", "gcide"]:
    lines = [l for l in open(os.path.join(src, corpus + ".jsonl"), encoding="utf-8") if l.strip()]
    for split, keep in [("train", lambda i: i % 50 != 7), ("heldout", lambda i: i % 50 == 7)]:
        os.makedirs(os.path.join(out, split), exist_ok=True)
        with open(os.path.join(out, split, corpus + ".jsonl"), "w", encoding="utf-8") as f:
            f.writelines(l for i, l in enumerate(lines) if keep(i))
PY
say "corpora from $corpora: training documents in $out/train, every 50th in $out/heldout"

# 2. The tokenizer holds the chat template's markers from the start (one token each), and shards.
"$crucible" tokenizer train --vocab-size 8192 --special '<|endoftext|>' --special '<|im_start|>' \
  --special '<|im_end|>' -o "$out/tokenizer.json" "$out"/train/*.jsonl | tail -n 1
for corpus in kjv fortunes jargon gcide; do
  "$crucible" data prepare -q -t "$out/tokenizer.json" -o "$out/shards/$corpus" "$out/train/$corpus.jsonl"
done
cat > "$out/blend-a.txt" <<LIST
# blend A, pre-training: no Jargon File (weight prefix corpus; prefixes relative to this file)
0.4       shards/kjv        bible
0.3       shards/fortunes   fortunes
0.3       shards/gcide      dictionary
LIST
cat > "$out/blend-b.txt" <<LIST
# blend B, continued pre-training: the Jargon File, with 20% of blend A replayed
0.8       shards/jargon     jargon
0.08      shards/kjv        bible
0.06      shards/fortunes   fortunes
0.06      shards/gcide      dictionary
LIST
say "tokenizer $out/tokenizer.json (ChatML markers as special tokens), shards in $out/shards"

# 3. Pre-training on blend A.
rm -rf "$out/pre" "$out/cpt-rewarm" "$out/cpt-gentle" "$out/sft-run"
say "pre-training tiny on blend A for $pre_steps steps"
"$crucible" train --config configs/demo-post/pretrain.toml --set "model.tokenizer_path=$out/tokenizer.json" \
  --set "training.dataset_path=$out/blend-a.txt" --set "training.steps=$pre_steps" \
  --set "job.dump_folder=$out/pre" > "$out/pre.log" 2>&1 || { tail -n 5 "$out/pre.log" >&2; exit 1; }
grep -E '^done ' "$out/pre.log" | sed 's/^/demo-post:   /'

# 4. Continued pre-training on blend B, rewarm against gentle, with boundary evaluations.
cpt1=$(( cpt_steps / 2 > 0 ? cpt_steps / 2 : 1 )); cpt2=$(( cpt_steps - cpt1 > 0 ? cpt_steps - cpt1 : 1 ))
warmup=$(( cpt1 / 5 > 0 ? cpt1 / 5 : 1 ))
heldout_a="[\"$out/heldout/kjv.jsonl\", \"$out/heldout/fortunes.jsonl\", \"$out/heldout/gcide.jsonl\"]"
for policy in rewarm gentle; do
  extra=""; [ "$policy" = gentle ] && extra=", peak_fraction = 0.25"
  stage1="{name = \"cpt1\", list = \"$out/blend-b.txt\", steps = $cpt1, lr_policy = \"$policy\", \
warmup_steps = $warmup$extra, eval_text = \"$out/heldout/jargon.jsonl\"}"
  stages="[$stage1, {name = \"cpt2\", list = \"$out/blend-b.txt\", steps = $cpt2}]"  # TOML: one line
  say "continued pre-training on blend B, lr_policy=$policy: stages cpt1 ($cpt1 steps) and cpt2 ($cpt2)"
  "$crucible" train --config configs/demo-post/cpt.toml --set "model.tokenizer_path=$out/tokenizer.json" \
    --set "model.init_weights=$out/pre/model.safetensors" --set "data.stages=$stages" \
    --set "stage_eval.text=$heldout_a" --set "stage_eval.items=$eval_items" \
    --set "job.dump_folder=$out/cpt-$policy" > "$out/cpt-$policy.log" 2>&1 ||
    { tail -n 5 "$out/cpt-$policy.log" >&2; exit 1; }
  grep -E '^done ' "$out/cpt-$policy.log" | sed 's/^/demo-post:   /'
done
python3 - "$out/cpt-rewarm/eval/stages.jsonl" "$out/cpt-gentle/eval/stages.jsonl" <<'PY'
import json, sys
runs = {name: [json.loads(l) for l in open(path)] for name, path in zip(["rewarm", "gentle"], sys.argv[1:3])}
start = runs["rewarm"][0]
cols = [("start", start)] + [(f"{name}:{b['stage']}", b) for name, rows in runs.items() for b in rows[1:]]
short = lambda text_name: text_name.split("/")[-1].removesuffix(".jsonl")
texts = list(start["text"]) if start.get("text") else []
tasks = list(start["tasks"]) if start.get("tasks") else []
print("demo-post: boundary evaluations, eval/stages.jsonl of both runs (start = the pre-trained weights, the same in both)")
print("demo-post:   " + f"{'':28s}" + "".join(f"{c:>15s}" for c, _ in cols))
print("demo-post:   " + f"{'step':28s}" + "".join(f"{b['step']:>15d}" for _, b in cols))
for t in tasks:
    print("demo-post:   " + f"{'acc ' + t:28s}" + "".join(f"{b['tasks'][t]['acc']:>15.3f}" for _, b in cols))
for t in texts:
    print("demo-post:   " + f"{'held-out loss ' + short(t):28s}" + "".join(f"{b['text'][t]['loss']:>15.3f}" for _, b in cols))
# What changed from the start to the end of each run: the loss of every held-out text and each
# task's accuracy, the latter against its standard error (|change| < 2 SE: within noise).
print("demo-post: from the start to the end of CPT (held-out loss: + is worse; acc: in standard errors of the start's)")
for name, rows in runs.items():
    end = rows[-1]
    parts = [f"{short(t)} {end['text'][t]['loss'] - start['text'][t]['loss']:+.3f}" for t in texts]
    accs = []
    for t in tasks:
        d, se = end["tasks"][t]["acc"] - start["tasks"][t]["acc"], start["tasks"][t]["acc_stderr"]
        accs.append(f"{t} {d:+.3f} ({d / se:+.1f} SE)" if se > 0 else f"{t} {d:+.3f}")
    print(f"demo-post:   {name}: loss {', '.join(parts)}; acc {', '.join(accs)}")
forgot = {name: [short(t) for t in texts if short(t) != "jargon" and rows[-1]["text"][t]["loss"] > start["text"][t]["loss"]]
          for name, rows in runs.items()}
for name, corpora in forgot.items():
    print(f"demo-post:   {name}: held-out loss of blend A's corpora rose on "
          f"{', '.join(corpora) if corpora else 'none'} ({len(corpora)} of 3)")
PY
say "boundary evaluations in $out/cpt-rewarm/eval/stages.jsonl and $out/cpt-gentle/eval/stages.jsonl"

# 5. SFT on conversations built from the corpora, from the gentle CPT run.
# shellcheck disable=SC2086  # DEMO_POST_SFT_ARGS: options, split on spaces
python3 scripts/make-sft-conversations.py "$corpora" "$out/sft" ${DEMO_POST_SFT_ARGS:-} | sed 's/^/demo-post:   /'
say "SFT from $out/cpt-gentle for $sft_steps steps (ChatML; configs/demo-post/sft.toml)"
"$crucible" train --config configs/demo-post/sft.toml --set "model.tokenizer_path=$out/tokenizer.json" \
  --set "model.init_weights=$out/cpt-gentle/model.safetensors" --set "training.steps=$sft_steps" \
  --set "training.dataset_path=$out/sft/sft-train.jsonl" --set "job.dump_folder=$out/sft-run" \
  > "$out/sft-run.log" 2>&1 || { tail -n 5 "$out/sft-run.log" >&2; exit 1; }
grep -E '^phase=sft |^done ' "$out/sft-run.log" | sed 's/^/demo-post:   /'
python3 - "$out/sft-run/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print(f"demo-post:   SFT loss (assistant tokens) {rows[0]['loss']:.3f} at step {rows[0]['step']} -> "
      f"{rows[-1]['loss']:.3f} at step {rows[-1]['step']}")
PY

# 6. The chat model on held-out questions (never trained on in SFT), greedy.
head -n "$questions" "$out/sft/sft-heldout.jsonl" > "$out/questions.jsonl"
"$crucible" generate "$out/sft-run" --chat --prompts "$out/questions.jsonl" --max-new-tokens 64 \
  --repetition-penalty 1.2 --json > "$out/answers.json"
python3 - "$out/questions.jsonl" "$out/answers.json" <<'PY'
import json, sys
asked = [json.loads(l)["messages"] for l in open(sys.argv[1])]
answers = json.load(open(sys.argv[2]))
print(f"demo-post: crucible generate --chat (template {answers.get('chat_template')}) on held-out questions")
for messages, result in zip(asked, answers["results"]):
    print(f"demo-post:   Q: {messages[0]['content']}")
    print(f"demo-post:   A: {' '.join(result['text'].split())}")
    print(f"demo-post:   (the entry: {messages[1]['content']})")
PY
say "chat model $out/sft-run (crucible generate $out/sft-run --chat --prompt '...')"
