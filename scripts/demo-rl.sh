#!/usr/bin/env bash
# `make demo-rl`: reinforcement learning on arithmetic, end to end, in about ten minutes on 2 cores
# (docs/post-training.md "Worked path: reinforcement learning on arithmetic").
#  1. synthetic data (scripts/make-arithmetic-data.py, deterministic): worked problems of the built-in
#     GRPO task sum_digits in its exact prompt format (src/rl/rewards.cc), as pre-training documents
#     (seed 1), as question/answer pairs for SFT (seed 2), and 200 held-out prompts (seed 3);
#  2. a byte-level BPE tokenizer of 320 ids holding ChatML's markers, trained on the documents with
#     their digits removed, so every digit stays a token of its own; one shard;
#  3. pre-train the `tiny` model on the documents (configs/demo-rl/pretrain.toml);
#  4. SFT on the pairs, rendered with ChatML (configs/demo-rl/sft.toml, `[training] dataset = "sft"`);
#  5. GRPO from the SFT weights on the built-in task (configs/demo-rl/grpo.toml: problems of seed 4,
#     reward 1 for a correct "Answer: <int>"), and its reward curve from metrics.jsonl;
#  6. held-out accuracy of the SFT and the GRPO model: greedy `crucible generate --chat --json` on
#     the held-out prompts, scored by the rule of the built-in check, with standard errors.
# Everything lands in demo-rl/ (DEMO_RL_OUT): data/, tokenizer.json, shards/, pre/, sft/, grpo/,
# answers-sft.json, answers-grpo.json and the logs.
# Smaller runs (the test, a quick check): DEMO_RL_PRE_STEPS, DEMO_RL_SFT_STEPS, DEMO_RL_GRPO_STEPS,
# DEMO_RL_HELDOUT (held-out prompts), DEMO_RL_DATA_ARGS (options of make-arithmetic-data.py, e.g.
# "--pretrain 500 --sft 200").
set -euo pipefail
cd "$(dirname "$0")/.."
crucible=${CRUCIBLE:-build/crucible}
out=${DEMO_RL_OUT:-demo-rl}
pre_steps=${DEMO_RL_PRE_STEPS:-1000}
sft_steps=${DEMO_RL_SFT_STEPS:-60}
grpo_steps=${DEMO_RL_GRPO_STEPS:-120}
heldout=${DEMO_RL_HELDOUT:-200}
start=$(date +%s)
say() { echo "demo-rl: $* ($(( $(date +%s) - start )) s)"; }
mkdir -p "$out"
rm -rf "$out/pre" "$out/sft" "$out/grpo"

# 1. Data.
# shellcheck disable=SC2086  # DEMO_RL_DATA_ARGS: options, split on spaces
python3 scripts/make-arithmetic-data.py "$out/data" --heldout "$heldout" ${DEMO_RL_DATA_ARGS:-} |
  sed 's/^/demo-rl:   /'
say "data in $out/data: pretrain.jsonl, sft-train.jsonl, heldout.jsonl"

# 2. Tokenizer (digits never merged: it learns only from the text around them) and a shard.
python3 - "$out/data/pretrain.jsonl" "$out/data/tokenizer-input.jsonl" <<'PY'
import json, re, sys
with open(sys.argv[2], "w", encoding="utf-8") as f:
    for line in open(sys.argv[1], encoding="utf-8"):
        f.write(json.dumps({"text": re.sub("[0-9]", "", json.loads(line)["text"])}) + "\n")
PY
"$crucible" tokenizer train --vocab-size 320 --special '<|endoftext|>' --special '<|im_start|>' \
  --special '<|im_end|>' -o "$out/tokenizer.json" "$out/data/tokenizer-input.jsonl" 2>/dev/null | tail -n 1
"$crucible" data prepare -q -t "$out/tokenizer.json" -o "$out/shards/arith" "$out/data/pretrain.jsonl"
echo "1.0 shards/arith arithmetic" > "$out/blend.txt"
say "tokenizer $out/tokenizer.json (ChatML markers, one token per digit), shard $out/shards/arith"

# 3. Pre-training on the worked problems.
say "pre-training tiny for $pre_steps steps"
"$crucible" train --config configs/demo-rl/pretrain.toml --set "model.tokenizer_path=$out/tokenizer.json" \
  --set "training.dataset_path=$out/blend.txt" --set "training.steps=$pre_steps" \
  --set "job.dump_folder=$out/pre" > "$out/pre.log" 2>&1 || { tail -n 5 "$out/pre.log" >&2; exit 1; }
grep -E '^done ' "$out/pre.log" | sed 's/^/demo-rl:   /'

# 4. SFT on the question/answer pairs (ChatML).
say "SFT for $sft_steps steps (ChatML; configs/demo-rl/sft.toml)"
"$crucible" train --config configs/demo-rl/sft.toml --set "model.tokenizer_path=$out/tokenizer.json" \
  --set "model.init_weights=$out/pre/model.safetensors" --set "training.steps=$sft_steps" \
  --set "training.dataset_path=$out/data/sft-train.jsonl" --set "job.dump_folder=$out/sft" \
  > "$out/sft.log" 2>&1 || { tail -n 5 "$out/sft.log" >&2; exit 1; }
grep -E '^phase=sft |^done ' "$out/sft.log" | sed 's/^/demo-rl:   /'

# 5. GRPO from the SFT weights on the built-in task.
say "GRPO for $grpo_steps steps on sum_digits (configs/demo-rl/grpo.toml)"
"$crucible" grpo --config configs/demo-rl/grpo.toml --set "model.tokenizer_path=$out/tokenizer.json" \
  --set "model.init_weights=$out/sft/model.safetensors" --set "training.steps=$grpo_steps" \
  --set "job.dump_folder=$out/grpo" > "$out/grpo.log" 2>&1 || { tail -n 5 "$out/grpo.log" >&2; exit 1; }
grep -E '^phase=grpo |^done ' "$out/grpo.log" | sed 's/^/demo-rl:   /'
python3 - "$out/grpo/metrics.jsonl" <<'PY'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "reward_mean" in r]
every = max(1, len(rows) // 10)
print(f"demo-rl: GRPO reward curve (metrics.jsonl; means over {every} steps, 64 completions each)")
print(f"demo-rl:   {'steps':>9s} {'reward':>7s} {'format':>7s} {'length':>7s} {'kl':>8s}")
for i in range(0, len(rows), every):
    chunk = rows[i:i + every]
    mean = lambda key: sum(r[key] for r in chunk) / len(chunk)
    print(f"demo-rl:   {chunk[0]['step']:>4d}-{chunk[-1]['step']:<4d} {mean('reward_mean'):7.3f} "
          f"{mean('format_rate'):7.3f} {mean('completion_length'):7.1f} {mean('kl'):8.5f}")
PY

# 6. Held-out accuracy, SFT against GRPO: greedy, the rule of the built-in check.
for run in sft grpo; do
  "$crucible" generate "$out/$run" --chat --chat-template chatml --prompts "$out/data/heldout.jsonl" \
    --max-new-tokens 64 --batch-size 50 --json > "$out/answers-$run.json"
done
python3 - "$out/data/heldout.jsonl" "$out/answers-sft.json" "$out/answers-grpo.json" <<'PY'
import json, math, re, sys
answers = [json.loads(line)["answer"] for line in open(sys.argv[1])]
# src/rl/rewards.cc CheckAnswer: the last "Answer:", spaces or tabs, an integer, then only whitespace.
RULE = re.compile(r"[ \t]*(-?[0-9]{1,40})[ \t\n\r]*")
def correct(text, expected):
    at = text.rfind("Answer:")
    m = RULE.fullmatch(text, at + 7) if at >= 0 else None
    return bool(m) and int(m.group(1)) == int(expected)
acc = {}
for name, path in [("SFT", sys.argv[2]), ("GRPO", sys.argv[3])]:
    results = json.load(open(path))["results"]
    n = len(results)
    p = sum(correct(r["text"], a) for r, a in zip(results, answers)) / n
    se = math.sqrt(p * (1 - p) / n)
    acc[name] = (p, se)
    print(f"demo-rl: held-out accuracy {name:4s} {p:.3f} +- {se:.3f} (n={n}, greedy)")
d = acc["GRPO"][0] - acc["SFT"][0]
se = acc["GRPO"][1]
verdict = "above" if d > se else "not above"
print(f"demo-rl:   GRPO - SFT = {d:+.3f}: {verdict} the GRPO model's standard error {se:.3f}")
PY
say "done: the GRPO model is $out/grpo (crucible generate $out/grpo --chat --chat-template chatml --prompt '...')"
