"""`make demo-rl` (scripts/demo-rl.sh, docs/post-training.md "Worked path: reinforcement learning on
arithmetic"): synthetic sum_digits data, a tokenizer with one token per digit, pre-training, SFT
(ChatML), GRPO on the built-in task and the held-out accuracy of the SFT and the GRPO model. Here
with a few steps per phase and small data sets, so it runs in well under a minute and a half on 2
cores."""
import json
import os
import re
import subprocess

from conftest import REPO, crucible_binary


def test_demo_rl_runs_every_phase(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, CRUCIBLE=crucible_binary(), OMP_NUM_THREADS="2", DEMO_RL_OUT=str(out),
               DEMO_RL_PRE_STEPS="6", DEMO_RL_SFT_STEPS="4", DEMO_RL_GRPO_STEPS="3", DEMO_RL_HELDOUT="20",
               DEMO_RL_DATA_ARGS="--pretrain 500 --sft 200")
    proc = subprocess.run([REPO / "scripts" / "demo-rl.sh"], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    for phase in ["sum_digits: 500 pre-training documents, 200 SFT pairs, 20 held-out prompts",
                  "one token per digit", "pre-training tiny for 6 steps", "SFT for 4 steps",
                  "phase=sft conversations=200", "template=chatml", "GRPO for 3 steps on sum_digits",
                  "phase=grpo task=sum_digits", "GRPO reward curve", "demo-rl: done"]:
        assert phase in log, (phase, log[-3000:])
    assert log.count("demo-rl:   done steps=") == 3  # pre-training, SFT, GRPO
    curve = [line for line in log.splitlines() if re.match(r"demo-rl: +[0-9]+-[0-9]+ ", line)]
    assert len(curve) == 3, log[-3000:]
    lines = log.splitlines()
    for label in ["greedy", "sampled at 0.7, 4 a problem"]:
        at = lines.index(f"demo-rl: held-out accuracy, {label} (n=20 problems):")
        assert re.fullmatch(r"demo-rl:   SFT  [01]\.[0-9]{3} \+- [0-9.]+", lines[at + 1]), lines[at + 1]
        assert re.fullmatch(r"demo-rl:   GRPO [01]\.[0-9]{3} \+- [0-9.]+", lines[at + 2]), lines[at + 2]
        assert re.match(r"demo-rl:   GRPO - SFT [-+][01]\.[0-9]{3} \(paired standard error ", lines[at + 3])
    for run in ["sft", "grpo"]:
        for suffix in [""] + [f"-t0.7-seed{k}" for k in (1, 2, 3, 4)]:
            assert len(json.loads((out / f"answers-{run}{suffix}.json").read_text())["results"]) == 20
    # The data's numbers have 2 to 4 digits, and GRPO read its prompts from the data.
    for name in ["heldout.jsonl", "grpo-prompts.jsonl"]:
        for line in open(out / "data" / name):
            number = re.search(r"digits of ([0-9]+)\?", json.loads(line)["prompt"]).group(1)
            assert 2 <= len(number) <= 4, number
    assert f"prompts = '{out}/data/grpo-prompts.jsonl'" in (out / "grpo" / "config.toml").read_text()
    # Every digit is a token of its own, and the held-out prompts are the built-in generator's.
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    assert not [t for t in vocab if len(t) > 1 and any(c.isdigit() for c in t)]
    specials = {t["content"] for t in tokenizer["added_tokens"]}
    assert {"<|im_start|>", "<|im_end|>"} <= specials, specials
    heldout = [json.loads(line) for line in open(out / "data" / "heldout.jsonl")]
    assert all(h["prompt"].endswith('Finish with a line "Answer: <integer>".') for h in heldout)


def test_the_generator_is_the_built_in_one():
    """make-arithmetic-data.py's problems are MakeProblem's (src/rl/rewards.cc), checked on known values."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("gen", REPO / "scripts" / "make-arithmetic-data.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    # MakeProblem(task, 3, i), printed by a C++ program linked with src/rl/rewards.cc.
    assert gen.make_problem("sum_digits", 3, 0)[:2] == (
        'What is the sum of the digits of 9324049? Finish with a line "Answer: <integer>".', "31")
    assert gen.make_problem("sum_digits", 3, 2)[1] == "40"
    assert gen.make_problem("addition", 3, 1)[:2] == ('What is 802 + 8761? Finish with a line "Answer: <integer>".',
                                                     "9563")
    assert gen.make_problem("addition", 3, 2)[2] == "9+5=14 4+8+1=13 5+8+1=14 2+6+1=9 8+0=8\nAnswer: 89434"
    # A narrower range of digits draws from the same stream: the built-in range is (2, 8).
    assert gen.make_problem("sum_digits", 3, 0, (2, 8)) == gen.make_problem("sum_digits", 3, 0)
    assert all(2 <= len(gen.make_problem("sum_digits", 4, i, (2, 4))[0].split("digits of ")[1].split("?")[0]) <= 4
               for i in range(200))
