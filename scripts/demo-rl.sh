#!/usr/bin/env bash
# `make demo-rl`: reinforcement learning on arithmetic, end to end, in about ten minutes on 2 cores
# (docs/post-training.md "Worked path: reinforcement learning on arithmetic").
#  1. synthetic data (scripts/make-arithmetic-data.py, deterministic): worked problems of the built-in
#     GRPO task sum_digits in its exact prompt format (src/rl/rewards.cc), numbers of 2 to 4 digits
#     (the built-in task draws 2 to 8; the tiny model does not learn to copy the longer ones in this
#     budget), as pre-training documents (seed 1), question/answer pairs for SFT (seed 2), 500
#     held-out prompts (seed 3) and the GRPO prompts (seed 4, grpo.prompts);
#  2. a byte-level BPE tokenizer of 320 ids holding ChatML's markers, trained on the documents with
#     their digits removed, so every digit stays a token of its own; one shard;
#  3. pre-train the `tiny` model on the documents (configs/demo-rl/pretrain.toml);
#  4. SFT on the pairs, rendered with ChatML (configs/demo-rl/sft.toml, `[training] dataset = "sft"`);
#  5. GRPO from the SFT weights on those prompts, rewarded by the built-in check
#     (configs/demo-rl/grpo.toml: 1 for a correct "Answer: <int>"), and its reward curve;
#  6. held-out accuracy of the SFT and the GRPO model by the rule of the built-in check
#     (`crucible generate --chat --json`), greedy and sampled as GRPO samples (temperature 0.7,
#     4 a problem), with standard errors over the problems and of the paired difference.
# Everything lands in demo-rl/ (DEMO_RL_OUT): data/, tokenizer.json, shards/, pre/, sft/, grpo/,
# answers-*.json and the logs.
# Smaller runs (the test, a quick check): DEMO_RL_PRE_STEPS, DEMO_RL_SFT_STEPS, DEMO_RL_GRPO_STEPS,
# DEMO_RL_HELDOUT (held-out prompts), DEMO_RL_DATA_ARGS (options of make-arithmetic-data.py, e.g.
# "--pretrain 500 --sft 200").
set -euo pipefail
cd "$(dirname "$0")/.."
crucible=${CRUCIBLE:-build/crucible}
out=${DEMO_RL_OUT:-demo-rl}
pre_steps=${DEMO_RL_PRE_STEPS:-1000}
sft_steps=${DEMO_RL_SFT_STEPS:-200}
grpo_steps=${DEMO_RL_GRPO_STEPS:-300}
heldout=${DEMO_RL_HELDOUT:-500}
start=$(date +%s)
say() { echo "demo-rl: $* ($(( $(date +%s) - start )) s)"; }
mkdir -p "$out"
rm -rf "$out/pre" "$out/sft" "$out/grpo"

# 1. Data.
# shellcheck disable=SC2086  # DEMO_RL_DATA_ARGS: options, split on spaces
python3 scripts/make-arithmetic-data.py "$out/data" --digits 2-4 --heldout "$heldout" ${DEMO_RL_DATA_ARGS:-} |
  sed 's/^/demo-rl:   /'
say "data in $out/data: pretrain.jsonl, sft-train.jsonl, heldout.jsonl, grpo-prompts.jsonl"

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
grpo_prompts=()  # the data's own range of digits when it is not the built-in task's
[ -f "$out/data/grpo-prompts.jsonl" ] && grpo_prompts=(--set "grpo.prompts=$out/data/grpo-prompts.jsonl")
"$crucible" grpo --config configs/demo-rl/grpo.toml --set "model.tokenizer_path=$out/tokenizer.json" \
  --set "model.init_weights=$out/sft/model.safetensors" --set "training.steps=$grpo_steps" \
  "${grpo_prompts[@]}" --set "job.dump_folder=$out/grpo" > "$out/grpo.log" 2>&1 ||
  { tail -n 5 "$out/grpo.log" >&2; exit 1; }
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

# 6. Held-out accuracy, SFT against GRPO, by the rule of the built-in check: greedy, and sampled as
# GRPO samples (temperature 0.7, 4 completions a problem, seeds 1-4: the accuracy GRPO optimises,
# each problem's share of right answers averaged over the problems).
for run in sft grpo; do
  "$crucible" generate "$out/$run" --chat --chat-template chatml --prompts "$out/data/heldout.jsonl" \
    --max-new-tokens 64 --batch-size 100 --json > "$out/answers-$run.json" 2>/dev/null
  for seed in 1 2 3 4; do
    "$crucible" generate "$out/$run" --chat --chat-template chatml --prompts "$out/data/heldout.jsonl" \
      --max-new-tokens 64 --batch-size 100 --temperature 0.7 --seed "$seed" --json \
      > "$out/answers-$run-t0.7-seed$seed.json" 2>/dev/null
  done
done
python3 - "$out" <<'PY'
import json, math, re, sys
out = sys.argv[1]
answers = [json.loads(line)["answer"] for line in open(f"{out}/data/heldout.jsonl")]
n = len(answers)
# src/rl/rewards.cc CheckAnswer: the last "Answer:", spaces or tabs, an integer, then only whitespace.
RULE = re.compile(r"[ \t]*(-?[0-9]{1,40})[ \t\n\r]*")
def correct(text, expected):
    at = text.rfind("Answer:")
    m = RULE.fullmatch(text, at + 7) if at >= 0 else None
    return bool(m) and int(m.group(1)) == int(expected)
def per_problem(files):  # each problem's share of right answers over the files
    shares = [0.0] * n
    for path in files:
        for i, (r, a) in enumerate(zip(json.load(open(path))["results"], answers)):
            shares[i] += correct(r["text"], a) / len(files)
    return shares
def mean_se(values):
    m = sum(values) / len(values)
    var = sum((v - m) ** 2 for v in values) / (len(values) - 1)
    return m, math.sqrt(var / len(values))
seeds = [f"t0.7-seed{k}" for k in (1, 2, 3, 4)]
verdict = ""
for label, suffixes in [("greedy", [""]), ("sampled at 0.7, 4 a problem", ["-" + s for s in seeds])]:
    shares = {run: per_problem([f"{out}/answers-{run}{x}.json" for x in suffixes]) for run in ("sft", "grpo")}
    (ps, ses), (pg, seg) = mean_se(shares["sft"]), mean_se(shares["grpo"])
    d, sed = mean_se([g - s for g, s in zip(shares["grpo"], shares["sft"])])
    print(f"demo-rl: held-out accuracy, {label} (n={n} problems):")
    print(f"demo-rl:   SFT  {ps:.3f} +- {ses:.3f}")
    print(f"demo-rl:   GRPO {pg:.3f} +- {seg:.3f}")
    print(f"demo-rl:   GRPO - SFT {d:+.3f} (paired standard error {sed:.3f}): "
          f"{'above' if d > seg else 'not above'} the GRPO model's standard error {seg:.3f}")
PY
say "done: the GRPO model is $out/grpo (crucible generate $out/grpo --chat --chat-template chatml --prompt '...')"
