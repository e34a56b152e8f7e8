"""`crucible generate` (docs/generation.md): greedy output equals transformers' `generate`
(do_sample=False, the "current" transformers set of conftest.py) token for token on an exported
model, for several prompts and lengths, batched and unbatched; sampled output is the same run to
run and under batching and differs across seeds; bad input gets one line and exit 2.

The model: the debug Llama (vocabulary 320 for a 300-id BPE tokenizer), its initial weights drawn
3x wider than the init so that the logits are far apart (a near tie could fall either way in two
implementations), trained 5 steps, exported with `crucible export hf`; and a DeepSeek-V3 of the
same vocabulary (MLA, a dense layer, then routed and shared experts; its balance biases away from
0) made the same way, against transformers' DeepseekV3ForCausalLM."""
import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from conftest import python_env, run_crucible, write_bpe_tokenizer
from test_deepseek_v3 import model_sets

TEXT = ("the quick brown fox jumps over the lazy dog. " * 8 +
        "hello world, this is a small test of generation with a cache. " * 6)
MODEL = ["--set", "model.flavor=debug", "--set", "model.vocab_size=320", "--set", "training.seq_len=64",
         "--set", "training.local_batch_size=2", "--set", "metrics.peak_gflops=100"]
ENV = {"OMP_NUM_THREADS": "2"}
PROMPTS = ["the quick brown fox", "hello", "this is a small test of generation with a cache. the lazy"]

HF_GENERATE = r"""
import json, sys, torch, transformers
from transformers import LlamaForCausalLM
dtype = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
model = LlamaForCausalLM.from_pretrained(sys.argv[1], **{dtype: torch.float32}).eval()
# argv[3], when given: round every matrix (not the norms) to that type and back, as
# `crucible generate --dtype f16|bf16` does (model/inference_weights.h).
if len(sys.argv) > 3:
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(p.to(getattr(torch, sys.argv[3])).float())
out = []
for request in json.loads(sys.argv[2]):
    ids = torch.tensor([request["prompt"]])
    with torch.no_grad():
        tokens = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                max_new_tokens=request["max_new_tokens"], pad_token_id=0)
    out.append(tokens[0, ids.shape[1]:].tolist())
print(json.dumps(out))
"""

# The DeepSeek-V3 family's shape of test_deepseek_v3_hf (query compression, a dense first layer,
# grouped routing, a shared expert, values narrower than the keys), at the tokenizer's vocabulary.
DEEPSEEK = {"vocab_size": 320, "dim": 64, "n_layers": 3, "n_heads": 4, "ffn_hidden_dim": 160,
            "q_lora_rank": 48, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
            "v_head_dim": 12, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
            "moe_intermediate_size": 32, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5,
            "first_k_dense_replace": 1, "norm_topk_prob": True, "tie_embeddings": False}


def exported(folder, sets, scale, biases=False):
    """`crucible export hf` of a run of `sets` trained 5 steps on TEXT from its initial weights
    drawn `scale` times wider (and, with `biases`, its balance biases away from 0)."""
    write_bpe_tokenizer(folder, TEXT)
    init = folder / "init.safetensors"
    run_crucible("model", "init", *sets, "--out", init)
    rng = np.random.default_rng(5)
    weights = {n: (rng.normal(0, 0.05, w.shape).astype(np.float32) if biases and n.endswith("e_score_correction_bias")
                   else w * scale) for n, w in load_file(str(init)).items()}
    save_file(weights, str(init))
    run = folder / "run"
    run_crucible("train", *sets, "--set", "training.steps=5", "--set", "checkpoint.interval=5",
                 "--set", f"model.init_weights={init}", "--set", f"model.tokenizer_path={folder / 'tokenizer.json'}",
                 "--set", f"job.dump_folder={run}", env=ENV)
    out = folder / "hf"
    run_crucible("export", "hf", run, out)
    return out


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """The exported Hugging Face folder of a tiny trained run."""
    return exported(tmp_path_factory.mktemp("generate"), MODEL, 3.0)


def generate(model, prompts, *options):
    args = [a for p in prompts for a in ("--prompt", p)]
    proc = run_crucible("generate", model, *args, "--json", *options, env=ENV)
    assert "phase=kv_cache bytes=" in proc.stderr
    return json.loads(proc.stdout)["results"]


def test_greedy_equals_transformers_batched_and_unbatched(model):
    hf = python_env("current")
    requests, ours = [], []
    for max_new in (4, 24):
        batched = generate(model, PROMPTS, "--max-new-tokens", str(max_new), "--batch-size", "3")
        # Two slots for three prompts: the third waits for a free slot, and runs beside another.
        two = generate(model, PROMPTS, "--max-new-tokens", str(max_new), "--batch-size", "2")
        for i, prompt in enumerate(PROMPTS):
            alone = generate(model, [prompt], "--max-new-tokens", str(max_new))[0]
            assert batched[i]["tokens"] == alone["tokens"] == two[i]["tokens"]
            assert batched[i]["logprobs"] == alone["logprobs"]  # the same bits
            assert batched[i]["finish"] in ("length", "eos")
            if batched[i]["finish"] == "length":
                assert len(batched[i]["tokens"]) == max_new
            requests.append({"prompt": batched[i]["prompt_tokens"], "max_new_tokens": max_new})
            ours.append(batched[i]["tokens"])
    theirs = json.loads(hf.run(HF_GENERATE, model, json.dumps(requests)).strip().splitlines()[-1])
    assert theirs == ours
    # Not a degenerate model: the long outputs are not one token repeated.
    assert all(len(set(tokens)) > 2 for tokens in ours[len(PROMPTS):])


def test_sampling_is_reproducible_batch_invariant_and_seeded(model):
    options = ["--temperature", "0.9", "--top-k", "50", "--top-p", "0.95", "--min-p", "0.01",
               "--repetition-penalty", "1.1", "--max-new-tokens", "16", "--ignore-eos"]
    first = generate(model, PROMPTS, *options, "--seed", "5")
    again = generate(model, PROMPTS, *options, "--seed", "5", "--batch-size", "1")
    assert [r["tokens"] for r in first] == [r["tokens"] for r in again]
    alone = generate(model, PROMPTS[:1], *options, "--seed", "5")
    assert alone[0]["tokens"] == first[0]["tokens"]
    other = generate(model, PROMPTS, *options, "--seed", "6")
    assert [r["tokens"] for r in other] != [r["tokens"] for r in first]
    # Each prompt draws from its own stream: two identical prompts give different samples.
    twins = generate(model, [PROMPTS[0], PROMPTS[0]], *options, "--seed", "5")
    assert twins[0]["tokens"] == first[0]["tokens"] and twins[1]["tokens"] != twins[0]["tokens"]
    assert all(len(r["tokens"]) == 16 and len(r["logprobs"]) == 16 for r in first)
    assert all(lp <= 0 for r in first for lp in r["logprobs"])


def test_streams_one_prompt_and_ends_at_max_tokens_without_its_stop_string(model):
    proc = run_crucible("generate", model, "--prompt", "hello", "--max-new-tokens", "6", env=ENV)
    result = generate(model, ["hello"], "--max-new-tokens", "6")[0]
    assert proc.stdout == result["text"] + "\n"
    never = generate(model, ["hello"], "--max-new-tokens", "6", "--stop", "\u2603never\u2603", "--ignore-eos")[0]
    assert never["finish"] == "length" and len(never["tokens"]) == 6
    # A stop string the output does contain ends it there, and the text is cut before it.
    long = generate(model, ["hello"], "--max-new-tokens", "24", "--ignore-eos")[0]
    stop = long["text"][4:6]
    if stop.strip():
        cut = generate(model, ["hello"], "--max-new-tokens", "24", "--ignore-eos", "--stop", stop)[0]
        assert cut["finish"] == "stop" and cut["text"] == long["text"][:long["text"].index(stop)]


@pytest.mark.parametrize("dtype, torch_dtype", [("f16", "float16"), ("bf16", "bfloat16")])
def test_sixteen_bit_weights_are_the_rounded_model(model, dtype, torch_dtype):
    """--dtype f16|bf16 generates what transformers generates from the same model with every matrix
    rounded to that type (norms kept), token for token, batched or not; and the rounding shows: its
    log-probabilities are not the f32 run's."""
    hf = python_env("current")
    batched = generate(model, PROMPTS, "--max-new-tokens", "16", "--dtype", dtype)
    f32 = generate(model, PROMPTS, "--max-new-tokens", "16")
    requests = []
    for i, prompt in enumerate(PROMPTS):
        alone = generate(model, [prompt], "--max-new-tokens", "16", "--dtype", dtype)[0]
        assert alone["tokens"] == batched[i]["tokens"] and alone["logprobs"] == batched[i]["logprobs"]
        requests.append({"prompt": batched[i]["prompt_tokens"], "max_new_tokens": 16})
    theirs = json.loads(hf.run(HF_GENERATE, model, json.dumps(requests), torch_dtype).strip().splitlines()[-1])
    assert theirs == [r["tokens"] for r in batched]
    assert [r["logprobs"] for r in batched] != [r["logprobs"] for r in f32]
    proc = run_crucible("generate", model, "--prompt", "hello", "--dtype", "f8", check=False, env=ENV)
    assert proc.returncode == 2 and "--dtype 'f8': expected f32, f16 or bf16" in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--prompt", ""], "prompt 0 is empty"),
    (["--prompt", "hello " * 40, "--max-length", "16"], "more than the context of 16"),
    (["--prompt", "hello", "--top-p", "0"], "--top-p: expected a value in (0, 1]"),
    (["--prompt", "hello", "--top-p", "1.5"], "--top-p: expected a value in (0, 1]"),
    (["--prompt", "hello", "--top-q", "3"], "--top-q"),
    (["--prompt", "hello", "--chat"], "no chat template"),
    ([], "no prompt"),
])
def test_bad_input_gets_one_line_and_exit_2(model, args, message):
    proc = run_crucible("generate", model, *args, check=False, env=ENV)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stdout == ""


@pytest.fixture(scope="module")
def deepseek_model(tmp_path_factory):
    """The exported DeepseekV3ForCausalLM folder of a tiny trained deepseek_v3 run."""
    sets = model_sets(DEEPSEEK) + MODEL
    return exported(tmp_path_factory.mktemp("generate_deepseek"), sets, 3.0, biases=True)


def test_deepseek_v3_greedy_equals_transformers_batched_and_unbatched(deepseek_model):
    """MLA with its cache of expanded keys and values, and routed experts in decode: greedy output
    is transformers' DeepseekV3ForCausalLM.generate, and a prompt's tokens and log-probabilities
    are the same bits alone, three to a batch, and two slots for three prompts."""
    hf = python_env("current")
    batched = generate(deepseek_model, PROMPTS, "--max-new-tokens", "20", "--batch-size", "3")
    two = generate(deepseek_model, PROMPTS, "--max-new-tokens", "20", "--batch-size", "2")
    requests = []
    for i, prompt in enumerate(PROMPTS):
        alone = generate(deepseek_model, [prompt], "--max-new-tokens", "20")[0]
        assert batched[i]["tokens"] == alone["tokens"] == two[i]["tokens"]
        assert batched[i]["logprobs"] == alone["logprobs"] == two[i]["logprobs"]
        requests.append({"prompt": batched[i]["prompt_tokens"], "max_new_tokens": 20})
    script = HF_GENERATE.replace("LlamaForCausalLM", "DeepseekV3ForCausalLM")
    theirs = json.loads(hf.run(script, deepseek_model, json.dumps(requests)).strip().splitlines()[-1])
    assert theirs == [r["tokens"] for r in batched]
    assert all(len(set(r["tokens"])) > 2 for r in batched if r["finish"] == "length")
