"""GGUF export: `crucible export gguf` (src/ckpt/gguf.h) read back by llama.cpp's own `gguf`
package and run by llama.cpp itself (llama-cpp-python), both in the venv that
scripts/setup-llama-cpp.sh builds (`make llama-env`; conftest.llama_python finds it). The tests
skip, saying so, only when that venv is missing.

A tiny Llama (debug flavor, vocabulary 320 over a 300-token Llama-3-style tokenizer, so 20 ids
are padding) is trained for 60 steps on a small word corpus, so that its greedy continuations
are decided by clear margins. Checked:
- the metadata, tensor names, shapes and types as GGUFReader reads them; the F32 tensors equal
  the checkpoint's bit for bit (q/k rows un-interleaved: llama.cpp's RoPE pairs adjacent rows),
  F16 and BF16 equal numpy's round-to-nearest-even, Q8_0 equals gguf-py's own quantizer;
- llama.cpp's logits of the F32 file against transformers' on `crucible export hf` of the same
  run (1e-3 absolute), and greedy continuations, token for token, against transformers'
  generate and against `crucible generate`; F16, BF16 and Q8_0 report how many prompts agree;
- llama.cpp's tokenizer against `crucible tokenizer encode`, for the Llama-3 and the GPT-2
  pre-tokenizers;
- bad input: an unknown --dtype, a run without a tokenizer, a tokenizer llama.cpp has no
  pre-tokenizer for, a DeepSeek-V3 model without shared experts (one line, exit 2).

DeepSeek-V3 (llama.cpp's deepseek2): two tiny runs made as tests/integration/test_generate.py makes
its DeepSeek-V3 (initial weights 3x wider, balance biases away from 0, 5 steps): query compression,
a dense first layer, then MoE layers with grouped routing (groups of two), one shared expert and
normalised, scaled weights; and plain queries, a tied head, two shared experts, unnormalised
weights and groups of one expert. Checked: every key and tensor name, shape and type as GGUFReader
reads them, the F32 tensors bit for bit against the checkpoint converted in numpy as
convert_hf_to_gguf.py converts DeepSeek's folder (kv_b split into k_b transposed and v_b, the
experts stacked, the RoPE rows interleaved), Q8_0's F16 fallback for rows not a multiple of 32 and
its F32 router; llama.cpp's greedy continuations of 6 prompts from the F32 file with an F32 KV
cache equal `crucible generate`'s token for token, with the log-probabilities of those tokens
within 1e-4; with llama.cpp's default F16 cache, and for F16 and Q8_0, how many prompts agree is
reported."""
import json

import numpy as np
import pytest
from safetensors.numpy import load_file

from conftest import PythonEnv, llama_python, python_env, run_crucible
from test_deepseek_v3 import model_sets
from test_generate import DEEPSEEK, MODEL as DEEPSEEK_RUN, exported

ENV = {"OMP_NUM_THREADS": "1"}
DTYPES = ["f32", "f16", "bf16", "q8_0"]
VOCAB = 320  # the model's; the tokenizer has 300 ids
N_HEADS, N_KV_HEADS, HEAD_DIM = 4, 2, 32  # the debug flavor
MAX_NEW = 12
PROMPTS = ["the quick brown", "a small house in", "birds sing songs of", "old stone bridge and",
           "the lazy cat runs", "green field while summer", "rain falls on the", "fox jumps over a"]
# Strings whose tokenization llama.cpp and crucible must agree on: words, digits, punctuation,
# whitespace runs, contractions, non-ASCII, and a special token written in the text.
TOKENIZE = PROMPTS + ["Hello, World! It's 2024: 12345 apples...", "  two  spaces\tand a tab\nnew line",
                      "naïve café 日本語 🙂 ok", "they'll we've I'm", "the fox<|end_of_text|>the dog"]


def sets(*items):
    return [a for item in items for a in ("--set", item)]


def train_run(root, name, tokenizer, steps):
    run_dir = root / name
    run_crucible("train", *sets("model.flavor=debug", f"model.vocab_size={VOCAB}", "training.seq_len=64",
                                "training.local_batch_size=4", "metrics.peak_gflops=100", f"training.steps={steps}",
                                f"checkpoint.interval={steps}", "training.dataset=tokens",
                                f"training.dataset_path={root / 'tokens.u32'}", "training.token_dtype=uint32",
                                "optimizer.lr=0.003", f"model.tokenizer_path={tokenizer}",
                                f"job.dump_folder={run_dir}"), env=ENV)
    return run_dir


@pytest.fixture(scope="module")
def llama():
    python = llama_python()
    if python is None:
        pytest.skip("the llama.cpp venv is missing: run `make llama-env` (scripts/setup-llama-cpp.sh) first")
    return PythonEnv("llama", python)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    rng = np.random.default_rng(0)
    words = ("the quick brown fox jumps over lazy dog and cat runs to a small house in green field while "
             "birds sing songs of summer rain falls on old stone bridge").split()
    lines = [" ".join(rng.choice(words, rng.integers(5, 16))) + "." for _ in range(400)]
    (root / "corpus.txt").write_text("\n".join(lines) + "\n")
    for pre in ["llama3", "gpt2"]:
        run_crucible("tokenizer", "train", root / "corpus.txt", "-o", root / f"tok-{pre}.json", "--vocab-size", 300,
                     "--pretokenizer", pre)
    run_crucible("tokenizer", "encode", root / "corpus.txt", "-t", root / "tok-llama3.json", "--out-bin",
                 root / "tokens.u32", "--eos")
    run_dir = train_run(root, "run", root / "tok-llama3.json", 60)
    files = {}
    for dtype in DTYPES:
        files[dtype] = root / f"model-{dtype}.gguf"
        proc = run_crucible("export", "gguf", run_dir, files[dtype], "--dtype", dtype)
        assert f"-> {files[dtype]} (gguf {dtype}, 451200 parameters" in proc.stdout
    run_crucible("export", "hf", run_dir, root / "hf")
    return {"root": root, "run": run_dir, "files": files, "hf": root / "hf",
            "weights": load_file(str(run_dir / "ckpt" / "step-60" / "model.safetensors"))}


# argv: a JSON job; writes the JSON result to argv[2] and the tensors to argv[3] (npz).
READ = r"""
import json, sys, numpy as np
from gguf import GGUFReader, GGMLQuantizationType, quants
job = json.load(open(sys.argv[1]))
out, arrays = {}, {}
for dtype, path in job.items():
    r = GGUFReader(path)
    fields = {}
    for key, field in r.fields.items():
        if key.startswith("GGUF."):
            continue
        value = field.contents()
        fields[key] = value.tolist() if hasattr(value, "tolist") else value
    tensors = []
    for t in r.tensors:
        tensors.append([t.name, t.tensor_type.name, [int(d) for d in t.shape]])
        arrays[f"{dtype}/{t.name}"] = np.array(t.data)
        if t.tensor_type == GGMLQuantizationType.Q8_0:
            arrays[f"{dtype}/{t.name}/dequantized"] = quants.dequantize(t.data, t.tensor_type)
    out[dtype] = {"fields": fields, "tensors": tensors}
json.dump(out, open(sys.argv[2], "w"))
np.savez(sys.argv[3], **arrays)
"""

QUANTIZE = r"""
import sys, numpy as np
from gguf import GGMLQuantizationType, quants
data = np.load(sys.argv[1])
np.savez(sys.argv[2], **{k: quants.quantize(v, GGMLQuantizationType.Q8_0) for k, v in data.items()})
"""


def gguf_layout(name):
    """The llama.cpp tensor name of a Hugging Face one."""
    outside = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
               "lm_head.weight": "output.weight"}
    if name in outside:
        return outside[name]
    layer, rest = name[len("model.layers."):].split(".", 1)
    inner = {"input_layernorm.weight": "attn_norm", "self_attn.q_proj.weight": "attn_q",
             "self_attn.k_proj.weight": "attn_k", "self_attn.v_proj.weight": "attn_v",
             "self_attn.o_proj.weight": "attn_output", "post_attention_layernorm.weight": "ffn_norm",
             "mlp.gate_proj.weight": "ffn_gate", "mlp.up_proj.weight": "ffn_up", "mlp.down_proj.weight": "ffn_down"}
    return f"blk.{layer}.{inner[rest]}.weight"


def interleave(w, heads):
    """convert_hf_to_gguf.py's LlamaModel.permute: each head's rows from rotate-half to pairs."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def expected_tensors(weights):
    """GGUF name -> the float32 values the file must hold (q/k interleaved)."""
    out = {}
    for name, w in weights.items():
        if "q_proj" in name:
            w = interleave(w, N_HEADS)
        elif "k_proj" in name:
            w = interleave(w, N_KV_HEADS)
        out[gguf_layout(name)] = np.ascontiguousarray(w, dtype=np.float32)
    return out


def bf16_bits(x):
    """float32 -> bfloat16 bits, round to nearest even (the weights are finite)."""
    bits = x.view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def test_gguf_reader_reads_the_metadata_and_the_exact_tensors(trained, llama, tmp_path):
    job = tmp_path / "job.json"
    job.write_text(json.dumps({d: str(p) for d, p in trained["files"].items()}))
    llama.run(READ, job, tmp_path / "read.json", tmp_path / "tensors.npz")
    read = json.loads((tmp_path / "read.json").read_text())
    arrays = np.load(tmp_path / "tensors.npz")
    tokenizer = json.loads((trained["root"] / "tok-llama3.json").read_text())
    vocab = {i: t for t, i in tokenizer["model"]["vocab"].items()}
    vocab.update({t["id"]: t["content"] for t in tokenizer["added_tokens"]})
    expected = expected_tensors(trained["weights"])
    file_types = {"f32": 0, "f16": 1, "bf16": 32, "q8_0": 7}
    matrix_types = {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0"}
    q8_values, q8_ours = {}, {}
    for dtype in DTYPES:
        fields, tensors = read[dtype]["fields"], read[dtype]["tensors"]
        assert {k: v for k, v in fields.items() if not k.startswith("tokenizer.ggml.")} == {
            "general.architecture": "llama", "general.name": "run", "general.alignment": 32,
            "general.file_type": file_types[dtype], "general.quantization_version": 2,
            "llama.context_length": 64, "llama.embedding_length": 128, "llama.block_count": 2,
            "llama.feed_forward_length": 352, "llama.attention.head_count": N_HEADS,
            "llama.attention.head_count_kv": N_KV_HEADS, "llama.rope.freq_base": 10000.0,
            "llama.attention.layer_norm_rms_epsilon": pytest.approx(1e-5, rel=1e-6),
            "llama.rope.dimension_count": HEAD_DIM, "llama.attention.key_length": HEAD_DIM,
            "llama.attention.value_length": HEAD_DIM, "llama.vocab_size": VOCAB}
        assert fields["tokenizer.ggml.model"] == "gpt2" and fields["tokenizer.ggml.pre"] == "llama-bpe"
        assert fields["tokenizer.ggml.tokens"] == [vocab.get(i, f"[PAD{i}]") for i in range(VOCAB)]
        assert fields["tokenizer.ggml.token_type"] == [1] * 298 + [3, 3] + [5] * 20
        assert fields["tokenizer.ggml.merges"] == tokenizer["model"]["merges"]
        assert (fields["tokenizer.ggml.bos_token_id"], fields["tokenizer.ggml.eos_token_id"]) == (298, 299)
        assert fields["tokenizer.ggml.add_bos_token"] is False and fields["tokenizer.ggml.add_eos_token"] is False

        assert sorted(t[0] for t in tensors) == sorted(expected)
        for name, kind, shape in tensors:
            want = expected[name]
            assert shape == list(reversed(want.shape)), name  # ggml order: the contiguous dimension first
            assert kind == ("F32" if want.ndim == 1 else matrix_types[dtype]), name
            data = arrays[f"{dtype}/{name}"]
            if kind == "F32":
                assert np.array_equal(data.view(np.uint32), want.view(np.uint32)), f"{dtype} {name}: not bit-exact"
            elif kind == "F16":
                assert np.array_equal(data.view(np.uint16), want.astype(np.float16).view(np.uint16)), name
            elif kind == "BF16":
                assert np.array_equal(data.view(np.uint16).reshape(want.shape), bf16_bits(want)), name
            else:
                q8_values[name], q8_ours[name] = want, data
                # Within half a quantisation step (d = max|x|/127 of a 32-value block) plus the
                # fp16 rounding of d (relative 2^-11, times |q| <= 127).
                step = np.abs(want.reshape(-1, 32)).max(axis=1, keepdims=True) / 127
                error = np.abs(arrays[f"q8_0/{name}/dequantized"].reshape(-1, 32) - want.reshape(-1, 32))
                assert np.all(error <= step * (0.5 + 127 * 2.0**-11) * 1.001), name
    # Q8_0 against gguf-py's own quantizer: the fp16 scales exactly; the int8 values exactly but
    # where x/d lies within float32 rounding of a half (gguf-py rounds floor(frac + 0.5) in
    # float32, ggml roundf), observed never or almost never.
    np.savez(tmp_path / "q8_in.npz", **q8_values)
    llama.run(QUANTIZE, tmp_path / "q8_in.npz", tmp_path / "q8_theirs.npz")
    theirs = np.load(tmp_path / "q8_theirs.npz")
    differ = 0
    for name, ours in q8_ours.items():
        a, b = ours.reshape(-1, 34), theirs[name].reshape(-1, 34)
        assert np.array_equal(a[:, :2], b[:, :2]), f"{name}: Q8_0 scales differ"
        qa, qb = a[:, 2:].view(np.int8).astype(int), b[:, 2:].view(np.int8).astype(int)
        assert np.abs(qa - qb).max() <= 1, name
        differ += int((qa != qb).sum())
    total = sum(v.size for v in q8_values.values())
    print(f"Q8_0: {differ} of {total} int8 values differ from gguf-py's quantizer (by 1)")
    assert differ <= total * 1e-4


# argv: a JSON job {files: {dtype: path}, prompts: [[ids]], strings: [...], max_new, eos, vocab_only: [paths]};
# writes {generated: {dtype: [[ids]]}, logits: [[...]] (f32, first prompt), tokens: {path: [[ids]]}}.
LLAMA_RUN = r"""
import json, sys, numpy as np
from llama_cpp import Llama
job = json.load(open(sys.argv[1]))
out = {"generated": {}, "tokens": {}}
for dtype, path in job["files"].items():
    llm = Llama(model_path=path, n_ctx=64, n_batch=64, n_threads=1, seed=0, logits_all=dtype == "f32",
                verbose=False)
    if dtype == "f32":
        first = job["prompts"][0]
        llm.eval(first)
        np.save(sys.argv[3], np.array(llm.scores[:len(first)], dtype=np.float32))
    runs = []
    for prompt in job["prompts"]:
        tokens = []
        for token in llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
            tokens.append(int(token))
            if token == job["eos"] or len(tokens) == job["max_new"]:
                break
        runs.append(tokens)
    out["generated"][dtype] = runs
    llm.close()
for path in job["vocab_only"]:
    llm = Llama(model_path=path, vocab_only=True, verbose=False)
    out["tokens"][path] = [llm.tokenize(s.encode(), add_bos=False, special=True) for s in job["strings"]]
json.dump(out, open(sys.argv[2], "w"))
"""

# argv: the HF folder, a JSON list of prompts (ids), max_new_tokens, eos, out.json (continuations),
# out.npy (the first prompt's logits).
HF_GENERATE = r"""
import json, sys, numpy as np, torch, transformers
from transformers import LlamaForCausalLM
model = LlamaForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32).eval()
prompts, max_new, eos = json.loads(open(sys.argv[2]).read()), int(sys.argv[3]), int(sys.argv[4])
out = []
with torch.no_grad():
    np.save(sys.argv[6], model(torch.tensor([prompts[0]])).logits[0].numpy())
    for p in prompts:
        ids = model.generate(torch.tensor([p]), max_new_tokens=max_new, do_sample=False, eos_token_id=eos,
                             pad_token_id=eos)[0, len(p):].tolist()
        out.append(ids)
json.dump(out, open(sys.argv[5], "w"))
"""


def crucible_tokens(tokenizer, strings, path):
    """`crucible tokenizer encode` of each string (a jsonl document each)."""
    path.write_text("".join(json.dumps({"text": s}) + "\n" for s in strings))
    proc = run_crucible("tokenizer", "encode", path, "-t", tokenizer, "--field", "text")
    return [[int(t) for t in line.split()] for line in proc.stdout.splitlines()]


def test_llama_cpp_runs_the_export_as_transformers_and_crucible_do(trained, llama, tmp_path):
    root = trained["root"]
    prompts = crucible_tokens(root / "tok-llama3.json", PROMPTS, tmp_path / "prompts.jsonl")
    assert all(prompts)
    # A GPT-2-style tokenizer: a short run that only serves its vocabulary.
    gpt2_run = train_run(root, "run-gpt2", root / "tok-gpt2.json", 1)
    gpt2_file = tmp_path / "gpt2.gguf"
    run_crucible("export", "gguf", gpt2_run, gpt2_file)
    job = {"files": {d: str(p) for d, p in trained["files"].items()}, "prompts": prompts, "strings": TOKENIZE,
           "max_new": MAX_NEW, "eos": 299, "vocab_only": [str(trained["files"]["f32"]), str(gpt2_file)]}
    (tmp_path / "job.json").write_text(json.dumps(job))
    llama.run(LLAMA_RUN, tmp_path / "job.json", tmp_path / "llama.json", tmp_path / "llama_logits.npy")
    result = json.loads((tmp_path / "llama.json").read_text())

    # The tokenizers agree, for both pre-tokenizers.
    for path, tokenizer in [(trained["files"]["f32"], "tok-llama3.json"), (gpt2_file, "tok-gpt2.json")]:
        ours = crucible_tokens(root / tokenizer, TOKENIZE, tmp_path / "strings.jsonl")
        assert result["tokens"][str(path)] == ours, tokenizer

    # transformers (the pinned stack) on `crucible export hf` of the same run.
    hf = python_env("pinned", "setup-hf-interop.sh", "hf-interop")
    (tmp_path / "prompts.json").write_text(json.dumps(prompts))
    hf.run(HF_GENERATE, trained["hf"], tmp_path / "prompts.json", MAX_NEW, 299, tmp_path / "hf.json",
           tmp_path / "hf_logits.npy")
    reference = json.loads((tmp_path / "hf.json").read_text())
    logits_diff = float(np.abs(np.load(tmp_path / "llama_logits.npy")[:, :VOCAB] -
                               np.load(tmp_path / "hf_logits.npy")).max())
    print(f"F32: max |logits_llama.cpp - logits_transformers| = {logits_diff:.3g}")
    assert logits_diff < 1e-3

    # crucible generate on the run itself, greedy, batched.
    proc = run_crucible("generate", trained["run"], *[a for p in PROMPTS for a in ("--prompt", p)],
                        "--max-new-tokens", MAX_NEW, "--json", env=ENV)
    ours = [r["tokens"] for r in json.loads(proc.stdout)["results"]]
    assert [r["prompt_tokens"] for r in json.loads(proc.stdout)["results"]] == prompts
    assert ours == reference, "crucible generate and transformers disagree"

    generated = result["generated"]
    assert generated["f32"] == reference, "llama.cpp (F32) and transformers disagree"
    assert any(len(set(r)) > 2 for r in reference), "degenerate continuations test nothing"
    for dtype in ["f16", "bf16", "q8_0"]:
        agree = sum(a == b for a, b in zip(generated[dtype], reference))
        print(f"{dtype.upper()}: llama.cpp's greedy continuations equal F32's for {agree} of {len(prompts)} "
              f"prompts ({MAX_NEW} new tokens)")


def test_export_gguf_refuses_what_llama_cpp_cannot_run_in_one_line(trained, tmp_path):
    out = tmp_path / "x.gguf"
    proc = run_crucible("export", "gguf", trained["run"], out, "--dtype", "q4_0", check=False)
    assert proc.returncode == 2 and "--dtype 'q4_0': expected f32, f16, bf16 or q8_0" in proc.stderr
    # A pre-tokenizer llama.cpp has no name for (ByteLevel adding a prefix space).
    tokenizer = json.loads((trained["root"] / "tok-gpt2.json").read_text())
    tokenizer["pre_tokenizer"]["add_prefix_space"] = True
    (tmp_path / "tok.json").write_text(json.dumps(tokenizer))
    run_dir = train_run(trained["root"], "run-prefix", tmp_path / "tok.json", 1)
    proc = run_crucible("export", "gguf", run_dir, out, check=False)
    assert proc.returncode == 2 and "has no llama.cpp equivalent" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()
    run_dir = trained["root"] / "run-none"
    run_crucible("train", *sets("model.flavor=debug", "training.seq_len=32", "training.steps=1",
                                "metrics.peak_gflops=100", f"job.dump_folder={run_dir}"), env=ENV)
    proc = run_crucible("export", "gguf", run_dir, out, check=False)
    assert proc.returncode == 2 and "has no tokenizer" in proc.stderr and not out.exists()
    # DeepSeek-V3 without shared experts: llama.cpp's deepseek2 requires them in its MoE layers.
    run_dir = trained["root"] / "run-deepseek"
    run_crucible("train", *sets("model.name=deepseek_v3", "model.flavor=debug", "model.n_shared_experts=0",
                                "training.seq_len=32", "training.steps=1", "metrics.peak_gflops=100",
                                f"job.dump_folder={run_dir}",
                                f"model.tokenizer_path={trained['root'] / 'tok-llama3.json'}"), env=ENV)
    proc = run_crucible("export", "gguf", run_dir, out, check=False)
    assert proc.returncode == 2 and "model.n_shared_experts = 0" in proc.stderr and "deepseek2" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()


# DeepSeek-V3 as llama.cpp's deepseek2. "compressed" is test_generate.py's model; "plain" the other
# branches: attn_q, a tied head, unnormalised weights, groups of one expert (written as one group).
DEEPSEEK_VARIANTS = {
    "compressed": DEEPSEEK,
    "plain": {**DEEPSEEK, "q_lora_rank": 0, "tie_embeddings": True, "norm_topk_prob": False, "n_group": 8,
              "topk_group": 4, "routed_scaling_factor": 1.0, "v_head_dim": 24, "n_shared_experts": 2},
}
DEEPSEEK_DTYPES = {"compressed": ["f32", "f16", "q8_0"], "plain": ["f32", "f16"]}
DEEPSEEK_PROMPTS = ["the quick brown fox", "hello", "this is a small test of generation with a cache. the lazy",
                    "the lazy dog", "hello world, this is", "a small test of"]
DEEPSEEK_NEW = 20


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    """Per variant: the trained run and its GGUF files."""
    out = {}
    for variant, config in DEEPSEEK_VARIANTS.items():
        folder = tmp_path_factory.mktemp(f"gguf-deepseek-{variant}")
        exported(folder, model_sets(config) + DEEPSEEK_RUN, 3.0, biases=True)
        run_dir, files = folder / "run", {}
        for dtype in DEEPSEEK_DTYPES[variant]:
            files[dtype] = folder / f"{variant}-{dtype}.gguf"
            run_crucible("export", "gguf", run_dir, files[dtype], "--dtype", dtype)
        out[variant] = {"config": config, "run": run_dir, "files": files,
                        "weights": load_file(str(run_dir / "ckpt" / "step-5" / "model.safetensors"))}
    return out


def deepseek_keys(config, dtype):
    """The general.* and deepseek2.* keys convert_hf_to_gguf.py writes for DeepSeek's own folder of
    this config (scoring_func sigmoid), with q_lora_rank 0 written and groups of one as one group."""
    grouped = config["n_routed_experts"] // config["n_group"] > 1
    keys = {"general.architecture": "deepseek2", "general.name": "run", "general.alignment": 32,
            "general.file_type": {"f32": 0, "f16": 1, "q8_0": 7}[dtype], "general.quantization_version": 2}
    keys.update({f"deepseek2.{k}": v for k, v in {
        "block_count": config["n_layers"], "context_length": 64, "embedding_length": config["dim"],
        "feed_forward_length": config["ffn_hidden_dim"], "attention.head_count": config["n_heads"],
        "attention.head_count_kv": 1, "rope.freq_base": 10000.0,
        "attention.layer_norm_rms_epsilon": pytest.approx(1e-5, rel=1e-6),
        "expert_count": config["n_routed_experts"], "expert_used_count": config["num_experts_per_tok"],
        "expert_group_count": config["n_group"] if grouped else 1,
        "expert_group_used_count": config["topk_group"] if grouped else 1, "expert_gating_func": 2,
        "leading_dense_block_count": config["first_k_dense_replace"], "vocab_size": config["vocab_size"],
        "attention.q_lora_rank": config["q_lora_rank"], "attention.kv_lora_rank": config["kv_lora_rank"],
        "attention.key_length": config["kv_lora_rank"] + config["qk_rope_head_dim"],
        "attention.value_length": config["kv_lora_rank"],
        "attention.key_length_mla": config["qk_nope_head_dim"] + config["qk_rope_head_dim"],
        "attention.value_length_mla": config["v_head_dim"],
        "expert_feed_forward_length": config["moe_intermediate_size"],
        "expert_shared_count": config["n_shared_experts"],
        "expert_weights_scale": pytest.approx(config["routed_scaling_factor"]),
        "rope.dimension_count": config["qk_rope_head_dim"]}.items()})
    if config["norm_topk_prob"]:
        keys["deepseek2.expert_weights_norm"] = True
    return keys


def deepseek_expected(weights, config):
    """GGUF name -> float32 values, converted from the checkpoint as convert_hf_to_gguf.py's
    DeepseekV2Model converts DeepSeek's folder, whose RoPE rows keep their pairs adjacent: ours are
    rotate-half, so they are interleaved first."""
    H, Dn, Dr, Dv = config["n_heads"], config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"]
    R, E = config["kv_lora_rank"], config["n_routed_experts"]
    out, experts = {}, {}
    renamed = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_a_proj.weight": "attn_q_a.weight",
               "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight", "self_attn.q_b_proj.weight": "attn_q_b.weight",
               "self_attn.q_proj.weight": "attn_q.weight", "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
               "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight", "self_attn.o_proj.weight": "attn_output.weight",
               "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate.weight": "ffn_gate_inp.weight",
               "mlp.gate.e_score_correction_bias": "exp_probs_b.bias"}
    for kind in ["gate", "up", "down"]:
        renamed[f"mlp.{kind}_proj.weight"] = f"ffn_{kind}.weight"
        renamed[f"mlp.shared_experts.{kind}_proj.weight"] = f"ffn_{kind}_shexp.weight"
    outside = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
               "lm_head.weight": "output.weight"}
    for name, w in weights.items():
        if name in outside:
            out[outside[name]] = w
            continue
        layer, rest = name[len("model.layers."):].split(".", 1)
        if rest.startswith("mlp.experts."):
            expert, kind = rest[len("mlp.experts."):].split(".", 1)
            experts.setdefault(f"blk.{layer}.ffn_{kind.split('_')[0]}_exps.weight", {})[int(expert)] = w
        elif rest == "self_attn.kv_b_proj.weight":
            kv_b = w.reshape(H, Dn + Dv, R)
            out[f"blk.{layer}.attn_k_b.weight"] = kv_b[:, :Dn].transpose(0, 2, 1)
            out[f"blk.{layer}.attn_v_b.weight"] = kv_b[:, Dn:]
        else:
            w = w.copy()
            if rest in ("self_attn.q_b_proj.weight", "self_attn.q_proj.weight"):
                heads = w.reshape(H, Dn + Dr, -1)
                heads[:, Dn:] = interleave(heads[:, Dn:].reshape(H * Dr, -1), H).reshape(H, Dr, -1)
            elif rest == "self_attn.kv_a_proj_with_mqa.weight":
                w[R:] = interleave(w[R:], 1)
            out[f"blk.{layer}.{renamed[rest]}"] = w
    for name, by_expert in experts.items():
        assert sorted(by_expert) == list(range(E)), name
        out[name] = np.stack([by_expert[e] for e in range(E)])
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def test_deepseek_v3_gguf_holds_the_deepseek2_keys_and_tensors(deepseek, llama, tmp_path):
    job = {f"{variant}/{dtype}": str(path) for variant, d in deepseek.items() for dtype, path in d["files"].items()}
    (tmp_path / "job.json").write_text(json.dumps(job))
    llama.run(READ, tmp_path / "job.json", tmp_path / "read.json", tmp_path / "tensors.npz")
    read = json.loads((tmp_path / "read.json").read_text())
    arrays = np.load(tmp_path / "tensors.npz")
    for key in job:
        variant, dtype = key.split("/")
        config = deepseek[variant]["config"]
        fields, tensors = read[key]["fields"], read[key]["tensors"]
        assert {k: v for k, v in fields.items() if not k.startswith("tokenizer.ggml.")} == deepseek_keys(config, dtype)
        assert fields["tokenizer.ggml.model"] == "gpt2" and fields["tokenizer.ggml.pre"] == "gpt-2"
        expected = deepseek_expected(deepseek[variant]["weights"], config)
        assert sorted(t[0] for t in tensors) == sorted(expected), key
        assert ("output.weight" in expected) != config["tie_embeddings"]
        for name, kind, shape in tensors:
            want = expected[name]
            assert shape == list(reversed(want.shape)), (key, name)
            forced_f32 = want.ndim == 1 or name.endswith("ffn_gate_inp.weight")
            if dtype == "f32" or forced_f32:
                assert kind == "F32", (key, name)
                assert np.array_equal(arrays[f"{key}/{name}"].view(np.uint32).reshape(want.shape),
                                      want.view(np.uint32)), f"{key} {name}: not bit-exact"
            elif dtype == "f16" or want.shape[-1] % 32 != 0:  # Q8_0 falls back to F16 for such rows
                assert kind == "F16", (key, name)
                assert np.array_equal(arrays[f"{key}/{name}"].view(np.uint16).reshape(want.shape),
                                      want.astype(np.float16).view(np.uint16)), (key, name)
            else:
                assert kind == "Q8_0", (key, name)
                step = np.abs(want.reshape(-1, 32)).max(axis=1, keepdims=True) / 127
                error = np.abs(arrays[f"{key}/{name}/dequantized"].reshape(-1, 32) - want.reshape(-1, 32))
                assert np.all(error <= step * (0.5 + 127 * 2.0**-11) * 1.001), (key, name)
    # Both fallbacks happen: k_b's rows are qk_nope_head_dim = 16 long, the router's stays F32.
    kinds = {name: kind for name, kind, _ in read["compressed/q8_0"]["tensors"]}
    assert kinds["blk.1.attn_k_b.weight"] == "F16" and kinds["blk.1.ffn_gate_inp.weight"] == "F32"
    assert kinds["blk.1.ffn_gate_exps.weight"] == "Q8_0"


# argv: a JSON job {files: {key: [path, f32_cache]}, prompts: [[ids]], max_new}; writes {key:
# {"tokens": [[ids]], "logprobs": [[...]]}}: greedy continuations and the log-softmax of each chosen
# token, with a KV cache of F32 (type_k = type_v = GGML_TYPE_F32) or llama.cpp's default, F16.
DEEPSEEK_LLAMA_RUN = r"""
import json, sys, numpy as np
from llama_cpp import Llama
job = json.load(open(sys.argv[1]))
out = {}
for key, (path, f32_cache) in job["files"].items():
    cache = {"type_k": 0, "type_v": 0} if f32_cache else {}
    llm = Llama(model_path=path, n_ctx=64, n_batch=64, n_threads=1, seed=0, logits_all=True, verbose=False,
                **cache)
    eos = llm.token_eos()
    runs, logprobs = [], []
    for prompt in job["prompts"]:
        tokens = []
        for token in llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
            tokens.append(int(token))
            if token == eos or len(tokens) == job["max_new"]:
                break
        llm.reset()
        llm.eval(prompt + tokens[:-1])
        scores = np.array(llm.scores[len(prompt) - 1:len(prompt) - 1 + len(tokens)], dtype=np.float64)
        scores -= scores.max(axis=1, keepdims=True)
        scores -= np.log(np.exp(scores).sum(axis=1, keepdims=True))
        runs.append(tokens)
        logprobs.append([float(scores[i, t]) for i, t in enumerate(tokens)])
    out[key] = {"tokens": runs, "logprobs": logprobs}
    llm.close()
json.dump(out, open(sys.argv[2], "w"))
"""


def test_llama_cpp_runs_the_deepseek_v3_export_as_crucible_generate_does(deepseek, llama, tmp_path):
    """The F32 file with an F32 KV cache gives crucible's tokens. llama.cpp's default cache is F16:
    the latent and k_pe rounded to 11 bits move the log-probabilities by up to a few 1e-3, enough
    to flip a near tie (in "compressed", "the lazy dog" meets a choice between two experts of layer
    2 decided by 3.9e-4), so that setting, F16 and Q8_0 only report agreement."""
    ours, prompts = {}, None
    for variant, d in deepseek.items():
        proc = run_crucible("generate", d["run"], *[a for p in DEEPSEEK_PROMPTS for a in ("--prompt", p)],
                            "--max-new-tokens", DEEPSEEK_NEW, "--json", env=ENV)
        results = json.loads(proc.stdout)["results"]
        prompts = prompts or [r["prompt_tokens"] for r in results]
        assert [r["prompt_tokens"] for r in results] == prompts
        ours[variant] = results
        assert any(len(set(r["tokens"])) > 2 for r in results), f"{variant}: degenerate continuations test nothing"
    files = {}
    for variant, d in deepseek.items():
        for dtype, path in d["files"].items():
            files[f"{variant}/{dtype}"] = [str(path), dtype == "f32"]
        files[f"{variant}/f32 (F16 cache)"] = [str(d["files"]["f32"]), False]
    (tmp_path / "job.json").write_text(json.dumps({"files": files, "prompts": prompts, "max_new": DEEPSEEK_NEW}))
    llama.run(DEEPSEEK_LLAMA_RUN, tmp_path / "job.json", tmp_path / "llama.json")
    result = json.loads((tmp_path / "llama.json").read_text())
    for variant, results in ours.items():
        theirs = result[f"{variant}/f32"]
        assert theirs["tokens"] == [r["tokens"] for r in results], f"{variant}: llama.cpp (F32) and crucible disagree"
        worst = max(abs(a - b) for r, lp in zip(results, theirs["logprobs"]) for a, b in zip(r["logprobs"], lp))
        print(f"deepseek2 {variant} F32: max |logprob_llama.cpp - logprob_crucible| = {worst:.3g}")
        assert worst < 1e-4
        for dtype in ["f32 (F16 cache)"] + DEEPSEEK_DTYPES[variant][1:]:
            agree = sum(a == r["tokens"] for a, r in zip(result[f"{variant}/{dtype}"]["tokens"], results))
            print(f"deepseek2 {variant} {dtype.upper()}: llama.cpp's greedy continuations equal crucible's for "
                  f"{agree} of {len(results)} prompts ({DEEPSEEK_NEW} new tokens)")
