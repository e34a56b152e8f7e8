"""`crucible generate --chat` and the chat template of `crucible export hf` (docs/generation.md,
docs/post-training.md "Chat templates"): a tokenizer trained by `crucible tokenizer train` with the
templates' markers as special tokens, a tiny run on it. `generate --chat --chat-template chatml`
renders the prompt as the template does and encodes each marker as its one special id; the export
with --chat-template carries crucible's own Jinja in tokenizer_config.json, which crucible detects
as the template and transformers' apply_chat_template renders as crucible's RenderChat does; on the
exported folder `generate --chat` detects the template and gives the same tokens. Refusals: no
template and no --chat-template, a tokenizer without a marker, --chat-template without --chat, a
"messages" line without --chat (one line, exit 2)."""
import json

import pytest

from conftest import run_crucible
from test_chat_template import CONVERSATIONS, crucible_render, hf, hf_run  # noqa: F401 (fixture)
from test_generate import ENV, MODEL, TEXT

CHATML = ["<|im_start|>", "<|im_end|>"]
LLAMA3 = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
DEEPSEEK = ["<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"]
NAMES = ["llama3", "chatml", "deepseek-v3"]


def train_tokenizer(folder, name, specials):
    text = folder / "text.txt"
    text.write_text(TEXT)
    out = folder / name
    run_crucible("tokenizer", "train", text, "-o", out, "--vocab-size", "300", "--min-frequency", "1",
                 *[a for s in specials for a in ("--special", s)], env=ENV)
    return out


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory):
    """(folder, run, tokenizer.json): a 5-step run whose tokenizer has every named template's markers
    as special tokens (<|endoftext|> first: the EOS)."""
    folder = tmp_path_factory.mktemp("generate_chat")
    (folder / "tok").mkdir()
    tokenizer = train_tokenizer(folder / "tok", "tokenizer.json", ["<|endoftext|>"] + CHATML + LLAMA3 + DEEPSEEK)
    run = folder / "run"
    run_crucible("train", *MODEL, "--set", "training.steps=5", "--set", "checkpoint.interval=5",
                 "--set", f"model.tokenizer_path={tokenizer}", "--set", f"job.dump_folder={run}", env=ENV)
    return folder, run, tokenizer


def generate(model, *args, check=True):
    proc = run_crucible("generate", model, "--json", "--max-new-tokens", "6", *args, env=ENV, check=check)
    return proc if not check else json.loads(proc.stdout)


def token_ids(tokenizer):
    added = json.loads(tokenizer.read_text())["added_tokens"]
    return {t["content"]: t["id"] for t in added}


def test_chat_renders_the_template_and_encodes_markers_as_single_ids(chat_run, tmp_path):
    folder, run, tokenizer = chat_run
    ids = token_ids(tokenizer)
    out = generate(run, "--chat", "--chat-template", "chatml", "--prompt", "the quick brown fox")
    assert out["chat_template"] == "chatml" and out["end_of_turn_id"] == ids["<|im_end|>"]
    result = out["results"][0]
    assert result["prompt"] == "<|im_start|>user\nthe quick brown fox<|im_end|>\n<|im_start|>assistant\n"
    assert result["messages"] == [{"role": "user", "content": "the quick brown fox"}]
    prompt = result["prompt_tokens"]
    assert prompt.count(ids["<|im_start|>"]) == 2 and prompt.count(ids["<|im_end|>"]) == 1
    assert prompt[0] == ids["<|im_start|>"] and prompt[-1] != ids["<|im_start|>"]
    # The same ids as the `tokenizers` library gives the rendered text.
    from tokenizers import Tokenizer
    assert prompt == Tokenizer.from_file(str(tokenizer)).encode(result["prompt"], add_special_tokens=False).ids

    # A --prompts line with "messages", and a plain one (one user message).
    prompts = tmp_path / "prompts.jsonl"
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"},
                    {"role": "assistant", "content": "hi"}, {"role": "user", "content": "the lazy dog"}]
    prompts.write_text(json.dumps({"messages": conversation}) + "\n" + json.dumps({"prompt": "hello"}) + "\n")
    out = generate(run, "--chat", "--chat-template", "chatml", "--prompts", prompts)["results"]
    assert out[0]["prompt"] == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n"
                                "<|im_start|>assistant\nhi<|im_end|>\n<|im_start|>user\nthe lazy dog<|im_end|>\n"
                                "<|im_start|>assistant\n")
    assert out[0]["prompt_tokens"].count(ids["<|im_end|>"]) == 4
    assert out[1]["prompt"] == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    # llama3 writes the tokenizer's BOS first, as one id.
    out = generate(run, "--chat", "--chat-template", "llama3", "--prompt", "hello")["results"][0]
    assert out["prompt"] == ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhello<|eot_id|>"
                             "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert out["prompt_tokens"][:2] == [ids["<|begin_of_text|>"], ids["<|start_header_id|>"]]


@pytest.fixture(scope="module")
def exports(chat_run):
    """The run exported once per named template (--chat-template NAME)."""
    folder, run, _ = chat_run
    out = {}
    for name in NAMES:
        out[name] = folder / f"hf-{name}"
        proc = run_crucible("export", "hf", run, out[name], "--chat-template", name)
        assert f"chat_template={name}" in proc.stdout
    return out


END_OF_TURN = {"llama3": "<|eot_id|>", "chatml": "<|im_end|>", "deepseek-v3": "<｜end▁of▁sentence｜>"}


def test_export_carries_a_template_detected_as_its_name(chat_run, exports):
    ids = token_ids(chat_run[2])
    for name, folder in exports.items():
        config = json.loads((folder / "tokenizer_config.json").read_text())
        assert "{%" in config["chat_template"]
        proc = run_crucible("chat-template", "detect", folder / "tokenizer_config.json")
        assert proc.stdout.startswith(f"chat_template={name} "), proc.stdout
        # generate in transformers ends a turn where crucible does: the EOS and the end-of-turn
        # marker, as instruct models ship generation_config.json.
        generation = json.loads((folder / "generation_config.json").read_text())
        assert generation["eos_token_id"] == [ids["<|endoftext|>"], ids[END_OF_TURN[name]]], name
    # Without a template, the EOS alone.
    plain = chat_run[0] / "hf-plain"
    run_crucible("export", "hf", chat_run[1], plain)
    assert json.loads((plain / "generation_config.json").read_text())["eos_token_id"] == ids["<|endoftext|>"]


def test_generate_chat_on_the_export_detects_the_template_and_gives_the_same_tokens(chat_run, exports):
    _, run, _ = chat_run
    args = ["--chat", "--prompt", "the quick brown fox", "--prompt", "hello"]
    from_run = generate(run, *args, "--chat-template", "chatml")
    from_hf = generate(exports["chatml"], *args)
    assert from_hf["chat_template"] == "chatml"
    for a, b in zip(from_run["results"], from_hf["results"]):
        assert a["prompt"] == b["prompt"] and a["prompt_tokens"] == b["prompt_tokens"]
        assert a["tokens"] == b["tokens"]
    # A run whose tokenizer has a tokenizer_config.json with a named template beside it: detected
    # there, and exported by default.
    tokenizer_folder = chat_run[2].parent
    (tokenizer_folder / "tokenizer_config.json").write_text((exports["llama3"] / "tokenizer_config.json").read_text())
    try:
        assert generate(run, "--chat", "--prompt", "hello")["chat_template"] == "llama3"
        out = chat_run[0] / "hf-default"
        assert "chat_template=llama3" in run_crucible("export", "hf", run, out).stdout
        assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == \
            json.loads((exports["llama3"] / "tokenizer_config.json").read_text())["chat_template"]
    finally:
        (tokenizer_folder / "tokenizer_config.json").unlink()


HF_APPLY = r"""
import json, sys
from transformers import AutoTokenizer, GenerationConfig
folders, conversations = json.loads(sys.stdin.read())
out = {}
for name, folder in folders.items():
    tokenizer = AutoTokenizer.from_pretrained(folder)
    out[name] = {"bos_token": tokenizer.bos_token, "eos_token": tokenizer.eos_token,
                 "generation_eos": GenerationConfig.from_pretrained(folder).eos_token_id,
                 "texts": [tokenizer.apply_chat_template(c["messages"], tokenize=False,
                                                         add_generation_prompt=c["add_generation_prompt"])
                           for c in conversations]}
print(json.dumps(out))
"""


def test_exported_template_renders_in_transformers_as_crucible_does(hf, exports):  # noqa: F811
    got = hf_run(hf, HF_APPLY, [{n: str(f) for n, f in exports.items()}, CONVERSATIONS])
    for name, folder in exports.items():
        proc, expected = crucible_render("--template", name, "--tokenizer-config", folder / "tokenizer_config.json",
                                         lines=CONVERSATIONS)
        assert proc.returncode == 0, proc.stderr
        assert got[name]["texts"] == [e["text"] for e in expected], name
        eos = json.loads((folder / "generation_config.json").read_text())["eos_token_id"]
        assert got[name]["generation_eos"] == eos and len(eos) == 2, name
    assert got["llama3"]["bos_token"] == "<|begin_of_text|>"
    assert got["llama3"]["texts"][0].startswith("<|begin_of_text|><|start_header_id|>user")


def test_refusals_are_one_line_and_exit_2(chat_run, exports, tmp_path):
    folder, run, tokenizer = chat_run
    plain = train_tokenizer(tmp_path, "plain.json", ["<|endoftext|>", "<|im_start|>"])
    messages = tmp_path / "messages.jsonl"
    messages.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    cases = [
        (run, ["--chat", "--prompt", "hello"], "has no chat template"),
        (run, ["--chat", "--chat-template", "chatml", "--tokenizer", plain, "--prompt", "hello"],
         "writes <|im_end|> as one special token, but the tokenizer of"),
        (run, ["--chat", "--chat-template", "zephyr", "--prompt", "hello"], "unknown chat template 'zephyr'"),
        (run, ["--chat-template", "chatml", "--prompt", "hello"], "--chat-template needs --chat"),
        (run, ["--prompts", messages], "\"messages\" needs --chat"),
    ]
    for model, args, message in cases:
        proc = generate(model, *args, check=False)
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, (args, proc.stderr)
        assert proc.stdout == ""
    proc = run_crucible("export", "hf", run, tmp_path / "bad", "--chat-template", "zephyr", check=False)
    assert proc.returncode == 2 and "unknown chat template 'zephyr'" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "bad").exists()
