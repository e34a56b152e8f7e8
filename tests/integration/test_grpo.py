"""`crucible grpo` (docs/post-training.md, "GRPO loop"): the loop runs on the debug Llama and on a
small DeepSeek-V3 and logs its metrics; the same seed gives the same weights; with iterations = 1
and beta = 0 the importance ratio is exactly 1 (and it moves at the second iteration of a batch);
the policy learns what a reward asks for; prompts can be rendered with a chat template;
a failing reward command stops the run with its one line (exit 65); bad [grpo] keys are refused
in one line (exit 2); 1, 2 and 4 data-parallel ranks, ZeRO-1 and ZeRO-3, give the same bits; a
run killed in the middle resumes to the uninterrupted run's bits (inside a rollout batch too, and on
another rank count), and refuses a resume whose reference weights changed.

The model: the debug flavor (or a DeepSeek-V3 of the same vocabulary) from its seeded init, with
a 300-id BPE tokenizer trained on the task's text. A random model never answers right, so the
runs that must move the weights use a reward command that scores a completion by its length (a
spread of rewards in every group)."""
import json
import math
import re
import sys

import pytest

from conftest import crucible_binary, run_crucible, write_bpe_tokenizer
from rank_runs import mpirun_train
from test_generate import DEEPSEEK

ENV = {"OMP_NUM_THREADS": "2"}
TEXT = 'What is the sum of the digits of 48213? Finish with a line "Answer: <integer>".\nAnswer: 18\n'
METRICS = ["reward_mean", "reward_std", "completion_length", "truncated_rate", "grpo_loss", "kl", "entropy",
           "mean_ratio", "clip_ratio_low_mean", "clip_ratio_high_mean", "clip_ratio_region_mean",
           "trained_positions", "generation_s", "reward_s", "score_s", "train_s"]
E_REWARD = "import json, sys\nfor line in sys.stdin:\n    c = json.loads(line)['completion']\n    print(c.count('e') / max(len(c), 1))\n"
LENGTH_REWARD = "import json, sys\nfor line in sys.stdin:\n    print(len(json.loads(line)['completion']) % 7)\n"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("grpo")
    write_bpe_tokenizer(folder, TEXT * 20)
    (folder / "prompts.jsonl").write_text(
        json.dumps({"prompt": "What is the sum of the digits of 48213?", "id": 1}) + "\n" +
        json.dumps({"prompt": "What is the sum", "id": 2}) + "\n")
    (folder / "length_reward.py").write_text(LENGTH_REWARD)
    (folder / "e_reward.py").write_text(E_REWARD)
    return folder


def sets(folder, run, *extra, command="length_reward.py"):
    items = ["model.flavor=debug", "model.vocab_size=320", f"model.tokenizer_path={folder / 'tokenizer.json'}",
             "training.seq_len=64", "training.local_batch_size=2", "training.steps=4",
             "metrics.peak_gflops=100", "optimizer.lr=1e-3", "grpo.max_new_tokens=16",
             f"job.dump_folder={run}"]
    if command:
        items += ["grpo.task=command", f"grpo.prompts={folder / 'prompts.jsonl'}",
                  f'grpo.reward_command="{sys.executable} {folder / command}"']
    items += list(extra)
    return [a for item in items for a in ("--set", item)]


def grpo(folder, run, *extra, command="length_reward.py", check=True):
    return run_crucible("grpo", *sets(folder, run, *extra, command=command), env=ENV, check=check)


def records(run):
    return [json.loads(line) for line in open(run / "metrics.jsonl")]


def untimed(rows):
    """The records without what depends on the machine's speed."""
    timed = {"tok_per_s", "mfu", "step_seconds", "rss_peak_bytes"}
    return [{k: v for k, v in r.items() if not k.endswith("_s") and k not in timed} for r in rows]


def digest(proc):
    return re.search(r"weights_xxh3=([0-9a-f]+)", proc.stdout).group(1)


def test_builtin_task_runs_and_logs_every_metric(setup, tmp_path):
    proc = grpo(setup, tmp_path / "run", "training.steps=3", "grpo.task=sum_digits", command=None)
    assert "phase=grpo task=sum_digits group_size=4 prompts_per_step=2" in proc.stdout
    lines = [l for l in proc.stdout.splitlines() if l.startswith("step=")]
    assert len(lines) == 3 and all("reward_mean=" in l and "accuracy=" in l for l in lines)
    rows = records(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        for key in METRICS + ["accuracy", "format_rate"]:
            assert key in r and r[key] is not None, key
        assert 1 <= r["completion_length"] <= 16 and 0 <= r["accuracy"] <= r["format_rate"] <= 1
        assert r["rollout_step"] == r["step"]
        assert 0 < r["entropy"] <= math.log(320)  # nats per completion token, at most log V
        # The micro-batches (2 rows) run at their longest row rounded up to 8, not training.seq_len
        # = 64: every row's inputs (prompt + completion - 1 >= its completion) fit, and the step's
        # 8 rows take fewer positions than 8 x 64.
        assert r["trained_positions"] % 16 == 0, r["trained_positions"]
        assert 8 * r["completion_length"] <= r["trained_positions"] < 8 * 64, r


def test_every_grpo_metric_reaches_tensorboard(setup, tmp_path):
    """The GRPO metrics join the step's record, so TensorBoard gets each as train/<name>, equal to
    metrics.jsonl (read back with TensorBoard's own reader)."""
    from test_tensorboard import assert_scalars_equal, expected_scalars, read
    run = tmp_path / "run"
    grpo(setup, run, "training.steps=2", "grpo.task=sum_digits", "metrics.enable_tensorboard=true", command=None)
    expected = expected_scalars(run / "metrics.jsonl", "train")
    for key in METRICS + ["accuracy", "format_rate"]:
        assert f"train/{key}" in expected, key
    assert_scalars_equal(read(run / "tb"), expected, "train")


def test_same_seed_same_weights_and_the_ratio_is_one_at_the_rollout_weights(setup, tmp_path):
    first = grpo(setup, tmp_path / "a")
    second = grpo(setup, tmp_path / "b")
    assert digest(first) == digest(second)
    rows = records(tmp_path / "a")
    for r in rows:  # iterations = 1, beta = 0: the policy is the rollout policy at every step
        assert r["mean_ratio"] == 1.0 and r["kl"] == 0.0
        assert r["clip_ratio_region_mean"] == 0.0 and r["rollout_step"] == r["step"]
        assert r["reward_std"] > 0 and r["grad_norm"] > 0
    assert untimed(records(tmp_path / "b")) == untimed(rows)
    # Another seed samples other completions.
    assert digest(grpo(setup, tmp_path / "c", "debug.seed=1")) != digest(first)


def test_second_iteration_scores_the_updated_policy_against_the_reference(setup, tmp_path):
    grpo(setup, tmp_path / "run", "grpo.iterations=2", "grpo.beta=0.1", "grpo.loss_type=grpo")
    rows = records(tmp_path / "run")
    assert [r["rollout_step"] for r in rows] == [1, 1, 2, 2]
    assert rows[0]["mean_ratio"] == 1.0 and rows[0]["kl"] == 0.0  # the reference is the init
    assert rows[1]["mean_ratio"] != 1.0 and rows[1]["kl"] > 0
    assert rows[1]["generation_s"] == 0 and rows[1]["reward_mean"] == rows[0]["reward_mean"]


def test_the_policy_learns_what_the_reward_asks_for(setup, tmp_path):
    """A reward for the share of the letter e in the completion: the sign and the scale of the
    gradient are right when the reward climbs well above its start (0.02 -> 0.33 here)."""
    grpo(setup, tmp_path / "run", "training.steps=30", "grpo.prompts_per_step=4", "optimizer.lr=3e-3",
         "lr_scheduler.warmup_steps=0", command="e_reward.py")
    rewards = [r["reward_mean"] for r in records(tmp_path / "run")]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.15, rewards


def test_prompts_rendered_with_a_chat_template(setup, tmp_path):
    text = setup / "chat_text.txt"
    text.write_text((setup / "prompts.jsonl").read_text() * 30)
    tokenizer = setup / "chat_tokenizer.json"
    run_crucible("tokenizer", "train", text, "-o", tokenizer, "--vocab-size", "300", "--min-frequency", "1",
                 "--special", "<|endoftext|>", "--special", "<|im_start|>", "--special", "<|im_end|>", env=ENV)
    plain = grpo(setup, tmp_path / "plain", "training.steps=2", f"model.tokenizer_path={tokenizer}")
    chat = grpo(setup, tmp_path / "chat", "training.steps=2", f"model.tokenizer_path={tokenizer}",
                "grpo.chat_template=chatml")
    assert digest(plain) != digest(chat)
    proc = grpo(setup, tmp_path / "bad", "grpo.chat_template=chatml", check=False)  # no markers
    assert proc.returncode == 2 and "<|im_start|>" in proc.stderr.strip().splitlines()[-1]


def test_deepseek_v3_with_muon(setup, tmp_path):
    extra = ["model.name=deepseek_v3", "optimizer.name=Muon", "training.steps=2"]
    extra += [f"model.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in DEEPSEEK.items()]
    proc = grpo(setup, tmp_path / "run", *extra)
    assert "done steps=2" in proc.stdout
    assert all(r["grad_norm"] > 0 for r in records(tmp_path / "run"))


def test_a_failing_reward_command_stops_the_run_in_one_line(setup, tmp_path):
    (setup / "crash.py").write_text("import sys\nsys.stdin.read()\nsys.exit(3)\n")
    (setup / "words.py").write_text("import sys\nfor line in sys.stdin:\n    print('good')\n")
    proc = grpo(setup, tmp_path / "a", command="crash.py", check=False)
    assert proc.returncode == 65, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "grpo rollout step 1: reward command" in last and "exited with status 3" in last
    proc = grpo(setup, tmp_path / "b", command="words.py", check=False)
    assert proc.returncode == 65, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert 'line 1 "good" is not a finite number' in last
    assert 'prompt "What is the sum of the digits of 48213?"' in last


@pytest.mark.parametrize("item, message", [
    ("grpo.group_sized=4", "unknown key 'grpo.group_sized'"),
    ("grpo.loss_type=ppo", 'grpo.loss_type = "ppo"'),
    ("grpo.scale_rewards=mean", 'grpo.scale_rewards = "mean"'),
    ("grpo.task=multiplication", 'grpo.task = "multiplication"'),
    ("grpo.max_new_tokens=60", "do not fit training.seq_len = 64"),
    ("grpo.iterations=3", "training.steps = 4 is not a multiple of grpo.iterations = 3"),
    ("training.global_batch_size=16", "crucible grpo sets it to grpo.prompts_per_step x grpo.group_size = 8"),
    ("grpo.temperature=0", "grpo.temperature"),
    ("grpo.chat_template=zephyr", "grpo.chat_template: unknown chat template 'zephyr'"),
    ("debug.grpo_average_reduction=max", 'debug.grpo_average_reduction = "max"'),
])
def test_bad_grpo_keys_exit_2_in_one_line(setup, tmp_path, item, message):
    proc = grpo(setup, tmp_path / "run", item, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert message in last, last


@pytest.mark.parametrize("zero_stage", [1, 3])
def test_one_two_and_four_data_parallel_ranks_give_the_same_bits(setup, tmp_path, zero_stage):
    """8 completions per step: 8, 4 and 2 per rank (one micro-batch of 2 on each of 4 ranks)."""
    items = [a for a in sets(setup, tmp_path / "unused", "grpo.iterations=2", "grpo.beta=0.1",
                             f"parallelism.zero_stage={zero_stage}")[1::2]
             if not a.startswith("job.dump_folder")]
    out = {}
    for np in (1, 2, 4):
        run = tmp_path / f"np{np}"
        proc = mpirun_train([crucible_binary(), "grpo"], np, run, items)
        keep = ["step", "loss", "grad_norm", "grpo_loss", "kl", "entropy", "mean_ratio", "reward_mean",
                "clip_ratio_region_mean", "completion_length"]
        out[np] = (digest(proc), [[r[k] for k in keep] for r in records(run)])
    assert out[1] == out[2] == out[4]


RESUME_KEEP = ["step", "loss", "grad_norm", "grpo_loss", "kl", "entropy", "mean_ratio", "reward_mean", "reward_std",
               "clip_ratio_region_mean", "completion_length", "rollout_step", "lr"]


@pytest.mark.parametrize("iterations, kill_step", [(1, 3), (2, 2), (2, 3)])
def test_a_killed_run_resumes_to_the_uninterrupted_bits(setup, tmp_path, iterations, kill_step):
    """SIGKILL before step `kill_step` (checkpoints every step), then --resume auto: the same
    weights and metrics as the run that was not stopped. With iterations = 2, kill step 2 resumes
    inside a rollout batch (its rollouts and old and reference log-probabilities restored from the
    checkpoint), kill step 3 at a batch boundary (the next batch regenerated)."""
    extra = [f"grpo.iterations={iterations}", "grpo.beta=0.1", "grpo.loss_type=grpo",
             "checkpoint.interval=1", "checkpoint.async=false"]
    straight = grpo(setup, tmp_path / "straight", *extra)
    run = tmp_path / "run"
    killed = grpo(setup, run, *extra, "debug.kill_rank=0", f"debug.kill_step={kill_step}", check=False)
    assert killed.returncode != 0 and len(records(run)) == kill_step - 1, killed.stderr
    resumed = grpo(setup, run, *extra, "debug.kill_rank=0", f"debug.kill_step={kill_step}")
    assert f"phase=resume from={run / 'ckpt' / f'step-{kill_step - 1}'} step={kill_step - 1} " in resumed.stdout
    assert ("phase=grpo_resume rollout_step=1" in resumed.stdout) == ((kill_step - 1) % iterations != 0)
    assert digest(resumed) == digest(straight)
    assert untimed(records(run)) == untimed(records(tmp_path / "straight"))


def test_a_resume_inside_a_batch_on_another_rank_count_gives_the_same_bits(setup, tmp_path):
    """One rank killed before step 2 (inside the first batch of iterations = 2) resumes on two
    ranks with the one-rank run's bits."""
    items = [a for a in sets(setup, tmp_path / "unused", "grpo.iterations=2", "grpo.beta=0.1",
                             "checkpoint.interval=1", "checkpoint.async=false")[1::2]
             if not a.startswith("job.dump_folder")]
    straight = mpirun_train([crucible_binary(), "grpo"], 1, tmp_path / "straight", items)
    run = tmp_path / "run"
    kill = ["debug.kill_rank=0", "debug.kill_step=2"]
    mpirun_train([crucible_binary(), "grpo"], 1, run, items + kill, check=False)
    assert len(records(run)) == 1
    resumed = mpirun_train([crucible_binary(), "grpo"], 2, run, items + kill)
    assert "phase=grpo_resume rollout_step=1" in resumed.stdout
    assert digest(resumed) == digest(straight)
    assert [[r[k] for k in RESUME_KEEP] for r in records(run)] == \
        [[r[k] for k in RESUME_KEEP] for r in records(tmp_path / "straight")]


def test_a_resume_whose_reference_weights_changed_is_refused_in_one_line(setup, tmp_path):
    """The checkpoint records the initial weights' source and xxh3; a resume with grpo.beta > 0
    reloads them and refuses (exit 65) when the file now holds other weights."""
    first = grpo(setup, tmp_path / "first", "training.steps=2")
    init = tmp_path / "init.safetensors"
    init.write_bytes((tmp_path / "first" / "model.safetensors").read_bytes())
    extra = ["grpo.beta=0.1", "checkpoint.interval=1", "checkpoint.async=false", f"model.init_weights={init}",
             "debug.kill_rank=0", "debug.kill_step=3"]
    run = tmp_path / "run"
    grpo(setup, run, *extra, check=False)
    state = json.loads((run / "ckpt" / "step-2" / "state.json").read_text())
    assert state["step_batches"]["reference"]["source"] == f"model.init_weights = {init}"
    assert state["step_batches"]["rollout_step"] == 2 and "batch" not in state["step_batches"]
    second = grpo(setup, tmp_path / "second", "training.steps=2", "debug.seed=1")
    assert digest(second) != digest(first)
    init.write_bytes((tmp_path / "second" / "model.safetensors").read_bytes())
    proc = grpo(setup, run, *extra, check=False)
    assert proc.returncode == 65, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert f"the reference weights reloaded from model.init_weights = {init} hash" in last, last
    assert state["step_batches"]["reference"]["xxh3"] in last
