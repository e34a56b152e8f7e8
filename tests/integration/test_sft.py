"""Supervised fine-tuning without packing (docs/post-training.md "Supervised fine-tuning"):
`[training] dataset = "sft"` over a .jsonl of conversations rendered by `[sft] chat_template`, from
the weights of a tiny pre-trained run (exported to a Hugging Face folder, checkpoint.initial_load_hf).
The startup line counts conversations, overlong ones and assistant tokens; only assistant targets
count (two datasets that differ only in tokens whose targets are masked give the same loss and the
same weights bit for bit, while changing a reply changes them); 1 and 2 data-parallel ranks give the
same weights; the export carries the run's template by default; bad input is one line with exit
2/65."""
import json
import re

import pytest

from conftest import crucible_binary, run_crucible
from rank_runs import mpirun_train
from test_generate import ENV, MODEL, TEXT
from test_generate_chat import CHATML, train_tokenizer

CONVERSATIONS = [
    {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the quick brown fox?"},
                  {"role": "assistant", "content": "jumps over the lazy dog."}]},
    {"prompt": "hello", "completion": "hello world, this is a small test."},
    {"messages": [{"role": "user", "content": "what jumps?"}, {"role": "assistant", "content": "the fox"},
                  {"role": "user", "content": "over what?"}, {"role": "assistant", "content": "the lazy dog"}]},
    {"prompt": "a small test", "completion": "of generation with a cache."},
]
SFT = ["--set", "training.dataset=sft", "--set", "sft.chat_template=chatml", "--set", "optimizer.lr=0.001",
       "--set", "training.global_batch_size=4", "--set", "checkpoint.enable=false"]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """(folder, tokenizer.json, hf folder): a 3-step pre-training run on a tokenizer holding the ChatML
    markers, exported to a Hugging Face folder."""
    folder = tmp_path_factory.mktemp("sft")
    (folder / "tok").mkdir()
    tokenizer = train_tokenizer(folder / "tok", "tokenizer.json", ["<|endoftext|>"] + CHATML)
    run = folder / "pre"
    run_crucible("train", *MODEL, "--set", "training.steps=3", "--set", "checkpoint.interval=3",
                 "--set", f"model.tokenizer_path={tokenizer}", "--set", f"job.dump_folder={run}", env=ENV)
    hf = folder / "pre-hf"
    run_crucible("export", "hf", run, hf)
    return folder, tokenizer, hf


def sft(pretrained, run, data, *extra, steps=2, check=True):
    folder, tokenizer, hf = pretrained
    return run_crucible("train", *MODEL, *SFT, "--set", f"training.steps={steps}",
                        "--set", f"model.tokenizer_path={tokenizer}", "--set", f"checkpoint.initial_load_hf={hf}",
                        "--set", f"training.dataset_path={data}", "--set", f"job.dump_folder={run}", *extra,
                        env=ENV, check=check)


def losses(run):
    return [json.loads(line)["loss"] for line in open(run / "metrics.jsonl")]


def digest(proc):
    return re.search(r"weights_xxh3=([0-9a-f]+)", proc.stdout).group(1)


def test_sft_run_reports_trains_and_exports_its_template(pretrained, tmp_path):
    folder, _, _ = pretrained
    data = write_jsonl(tmp_path / "c.jsonl", CONVERSATIONS)
    run = tmp_path / "run"
    proc = sft(pretrained, run, data, "--set", "checkpoint.enable=true", "--set", "checkpoint.interval=2")
    line = re.search(r"phase=sft conversations=4 truncated=0 skipped=0 assistant_tokens=(\d+) template=chatml",
                     proc.stdout)
    assert line and int(line.group(1)) > 10, proc.stdout
    assert all(l == l and l > 0 for l in losses(run))
    # The export carries the run's template without --chat-template, and generate --chat finds it.
    out = tmp_path / "hf"
    assert "chat_template=chatml" in run_crucible("export", "hf", run, out).stdout
    assert "<|im_start|>" in json.loads((out / "tokenizer_config.json").read_text())["chat_template"]
    gen = json.loads(run_crucible("generate", run, "--json", "--max-new-tokens", "2", "--chat", "--prompt", "hi",
                                  env=ENV).stdout)
    assert gen["chat_template"] == "chatml"


def test_masked_tokens_contribute_nothing(pretrained, tmp_path):
    # A trailing user turn after the last reply: tokens whose targets are all masked (where the
    # other dataset has padding), and no trained token sees them (causal attention).
    plain = write_jsonl(tmp_path / "plain.jsonl", CONVERSATIONS)
    extra = [dict(c) for c in CONVERSATIONS]
    for i, c in enumerate(extra):
        messages = c["messages"] if "messages" in c else [{"role": "user", "content": c["prompt"]},
                                                           {"role": "assistant", "content": c["completion"]}]
        extra[i] = {"messages": messages + [{"role": "user", "content": "and the lazy dog?"}]}
    perturbed = write_jsonl(tmp_path / "perturbed.jsonl", extra)
    changed = [dict(c) for c in CONVERSATIONS]
    changed[1] = {"prompt": "hello", "completion": "hello world, this is a big test."}
    reply = write_jsonl(tmp_path / "reply.jsonl", changed)
    runs = {}
    for name, data in [("plain", plain), ("perturbed", perturbed), ("reply", reply)]:
        proc = sft(pretrained, tmp_path / name, data)
        runs[name] = (proc, losses(tmp_path / name))
    (p_proc, p_loss), (x_proc, x_loss), (r_proc, r_loss) = runs["plain"], runs["perturbed"], runs["reply"]
    assert p_loss == x_loss and digest(p_proc) == digest(x_proc)
    # Not every token is ignored: a changed reply changes the loss and the weights.
    assert r_loss[0] != p_loss[0] and digest(r_proc) != digest(p_proc)


def test_one_and_two_ranks_give_the_same_weights(pretrained, tmp_path):
    folder, tokenizer, hf = pretrained
    data = write_jsonl(tmp_path / "c.jsonl", CONVERSATIONS)
    items = [s for s in (MODEL + SFT)[1::2]] + [
        "training.steps=2", f"model.tokenizer_path={tokenizer}", f"checkpoint.initial_load_hf={hf}",
        f"training.dataset_path={data}"]
    one = mpirun_train([str(crucible_binary()), "train"], 1, tmp_path / "one", items)
    two = mpirun_train([str(crucible_binary()), "train"], 2, tmp_path / "two", items)
    assert digest(one) == digest(two)
    assert losses(tmp_path / "one") == losses(tmp_path / "two")
    assert one.stdout.count("phase=sft ") == 1 and two.stdout.count("phase=sft ") == 1  # rank 0 only


def test_bad_input_is_one_line(pretrained, tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", CONVERSATIONS)
    proc = sft(pretrained, tmp_path / "a", good, "--set", "sft.chat_template=vicuna", check=False)
    assert proc.returncode == 2 and "vicuna" in proc.stderr
    bad = write_jsonl(tmp_path / "bad.jsonl", [CONVERSATIONS[0], {"messages": [{"role": "user", "content": "hi"}]}])
    proc = sft(pretrained, tmp_path / "b", bad, check=False)
    assert proc.returncode == 65 and f"{bad}:2: the conversation has no assistant message" in proc.stderr
    role = write_jsonl(tmp_path / "role.jsonl", [{"messages": [{"role": "robot", "content": "hi"}]}])
    proc = sft(pretrained, tmp_path / "c", role, check=False)
    assert proc.returncode == 65 and f"{role}:1: message 0: unknown role 'robot'" in proc.stderr
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    proc = sft(pretrained, tmp_path / "d", empty, check=False)
    assert proc.returncode == 65 and "no conversations" in proc.stderr
    # Overlong: counted and reported, truncated or skipped.
    long = write_jsonl(tmp_path / "long.jsonl", CONVERSATIONS + [{"prompt": "hi", "completion": "zq " * 60}])
    proc = sft(pretrained, tmp_path / "e", long, steps=1)
    assert "phase=sft conversations=5 truncated=1 skipped=0" in proc.stdout and "1 truncated" in proc.stderr
    proc = sft(pretrained, tmp_path / "f", long, "--set", "sft.overlong=skip", steps=1)
    assert "phase=sft conversations=4 truncated=0 skipped=1" in proc.stdout


def sft_samples(proc):
    return int(re.search(r"phase=sft .* packing=\w+ samples=(\d+) padding=([0-9.]+)", proc.stdout).group(1))


def padding(proc):
    return float(re.search(r"phase=sft .* padding=([0-9.]+)", proc.stdout).group(1))


def step_one(run):
    return json.loads(open(run / "metrics.jsonl").readline())


@pytest.mark.parametrize("family", ["llama", "deepseek_v3"])
def test_packed_and_unpacked_give_the_same_loss_per_token(pretrained, tmp_path, family):
    """Step 1 of a packed run and of an unpacked one over the same conversations (every one in the
    global batch, once): the same loss per assistant token and gradient norm to float tolerance
    (attention stays inside a conversation and its positions restart), with less padding."""
    folder, tokenizer, hf = pretrained
    data = write_jsonl(tmp_path / "c.jsonl", CONVERSATIONS + [
        {"prompt": "the lazy dog", "completion": "jumps over the quick fox."},
        {"messages": [{"role": "system", "content": "hello"}, {"role": "user", "content": "a test?"},
                      {"role": "assistant", "content": "a small test."}]}])
    base = [*MODEL, *SFT, "--set", f"model.tokenizer_path={tokenizer}", "--set", f"training.dataset_path={data}",
            "--set", "training.local_batch_size=1", "--set", "training.seq_len=160"]
    base += (["--set", f"checkpoint.initial_load_hf={hf}"] if family == "llama"
             else ["--set", "model.name=deepseek_v3", "--set", "model.vocab_size=320"])
    probe = run_crucible("train", *base, "--set", "sft.packing=true", "--set", "training.steps=0",
                         "--set", f"job.dump_folder={tmp_path / 'probe'}", env=ENV)
    packs = sft_samples(probe)
    assert packs < 6, probe.stdout  # the six conversations share samples
    runs = {}
    for name, extra in [("unpacked", ["--set", "training.global_batch_size=6"]),
                        ("packed", ["--set", "sft.packing=true", "--set", f"training.global_batch_size={packs}"])]:
        proc = run_crucible("train", *base, *extra, "--set", "training.steps=1",
                            "--set", f"job.dump_folder={tmp_path / name}", env=ENV)
        runs[name] = (proc, step_one(tmp_path / name))
    (u_proc, u), (p_proc, p) = runs["unpacked"], runs["packed"]
    assert p["loss"] == pytest.approx(u["loss"], rel=2e-6), (p, u)
    assert p["grad_norm"] == pytest.approx(u["grad_norm"], rel=1e-4), (p, u)
    assert padding(p_proc) < padding(u_proc)
    # The step line and metrics.jsonl count the padding of the step's global batch.
    assert p["padding_tokens"] < u["padding_tokens"] and 0 <= p["padding_share"] < u["padding_share"] < 1
    assert re.search(r"step=1 .* padding=[0-9.]+ content_tok/s=", p_proc.stdout)


def test_packed_one_and_two_ranks_give_the_same_weights(pretrained, tmp_path):
    folder, tokenizer, hf = pretrained
    data = write_jsonl(tmp_path / "c.jsonl", CONVERSATIONS * 3)
    items = [s for s in (MODEL + SFT)[1::2]] + [
        "training.steps=2", "sft.packing=true", f"model.tokenizer_path={tokenizer}",
        f"checkpoint.initial_load_hf={hf}", f"training.dataset_path={data}"]
    one = mpirun_train([str(crucible_binary()), "train"], 1, tmp_path / "one", items)
    two = mpirun_train([str(crucible_binary()), "train"], 2, tmp_path / "two", items)
    assert "packing=on" in one.stdout
    assert digest(one) == digest(two)
    assert losses(tmp_path / "one") == losses(tmp_path / "two")


def test_template_is_detected_from_the_tokenizer_config(pretrained, tmp_path):
    """Without sft.chat_template the run takes the named template that initial_load_hf's
    tokenizer_config.json carries (judged by rendering), records it in its config, and refuses a
    template that is none of them, or no template at all, in one line (exit 2)."""
    folder, tokenizer, hf = pretrained
    data = write_jsonl(tmp_path / "c.jsonl", CONVERSATIONS)
    chat_hf = tmp_path / "chat-hf"
    run_crucible("export", "hf", folder / "pre", chat_hf, "--chat-template", "chatml")
    run = tmp_path / "run"
    proc = run_crucible("train", *MODEL, *SFT, "--set", 'sft.chat_template=""', "--set", "training.steps=1",
                        "--set", f"model.tokenizer_path={tokenizer}", "--set", f"checkpoint.initial_load_hf={chat_hf}",
                        "--set", f"training.dataset_path={data}", "--set", f"job.dump_folder={run}", env=ENV)
    assert f"phase=sft_template detected=chatml from={chat_hf}/tokenizer_config.json" in proc.stdout
    assert "chat_template = 'chatml'" in (run / "config.toml").read_text()
    # A template that renders as none of the named ones.
    config = json.loads((chat_hf / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    (chat_hf / "tokenizer_config.json").write_text(json.dumps(config))
    proc = run_crucible("train", *MODEL, *SFT, "--set", 'sft.chat_template=""', "--set", "training.steps=1",
                        "--set", f"model.tokenizer_path={tokenizer}", "--set", f"checkpoint.initial_load_hf={chat_hf}",
                        "--set", f"training.dataset_path={data}", "--set", f"job.dump_folder={tmp_path / 'b'}",
                        env=ENV, check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "sft.chat_template is not set and" in proc.stderr and "tokenizer_config.json" in proc.stderr
    # No template anywhere.
    proc = sft(pretrained, tmp_path / "c", data, "--set", 'sft.chat_template=""', check=False)
    assert proc.returncode == 2 and "needs sft.chat_template" in proc.stderr and "looked in" in proc.stderr


@pytest.mark.parametrize("layout", [
    ["parallelism.tensor_parallel_degree=2", "parallelism.tensor_parallel_chunks=2"],
    ["parallelism.tensor_parallel_degree=2", "parallelism.tensor_parallel_chunks=2", "parallelism.sequence_parallel=true"],
    ["model.name=deepseek_v3", "parallelism.expert_parallel_degree=2"],
], ids=["tp2", "tp2-sp", "deepseek-ep2"])
def test_packed_sft_gives_one_ranks_bits_under_tensor_and_expert_parallelism(pretrained, tmp_path, layout):
    """Packed SFT on 2 ranks split by tensor (with and without sequence parallelism) or expert
    parallelism ends with the weights of one rank, bit for bit (one rank runs the same 2 chunks of
    each tensor-parallel product, as every tensor-parallel degree does: docs/parallelism.md)."""
    folder, tokenizer, hf = pretrained
    data = write_jsonl(tmp_path / "c.jsonl", CONVERSATIONS * 3)
    deepseek = "model.name=deepseek_v3" in layout
    items = [s for s in (MODEL + SFT)[1::2]] + [
        "training.steps=2", "sft.packing=true", "training.seq_len=128", f"model.tokenizer_path={tokenizer}",
        f"training.dataset_path={data}"] + ([] if deepseek else [f"checkpoint.initial_load_hf={hf}"])
    one = mpirun_train([str(crucible_binary()), "train"], 1, tmp_path / "one",
                       items + [x for x in layout if x.startswith("model.") or "chunks" in x])
    two = mpirun_train([str(crucible_binary()), "train"], 2, tmp_path / "two", items + layout)
    assert digest(one) == digest(two)
    assert losses(tmp_path / "one") == losses(tmp_path / "two")
