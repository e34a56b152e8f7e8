"""CRLF input reads exactly as its LF twin in every command that reads lines: tokenizer train,
encode and decode, data prepare (every --split), eval --text and eval --tasks."""
import json
import subprocess

import pytest

from conftest import crucible_binary, run_crucible
from eval_model import ENV, small_task, train_model

# Blank lines, a line of spaces, a line that is only "\r" in the CRLF twin, a lone "\r" inside a
# line (kept: it is text), and no line end after the last line.
LF_TEXT = ("In the beginning was the word.\n\nAnd the word was with text.\n   \n"
           "Second paragraph, line one.\nline two, with a\rcarriage return inside.\n\n\n"
           "Last line without an end")


def crlf(text):
    return text.replace("\n", "\r\n")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("line_endings")
    run, hf, tokenizer = train_model(root, steps=4)
    return {"root": root, "run": run, "tokenizer": tokenizer}


def twins(tmp_path, name, text):
    """The same text with LF and with CRLF line ends."""
    lf, cr = tmp_path / f"lf-{name}", tmp_path / f"crlf-{name}"
    lf.write_bytes(text.encode())
    cr.write_bytes(crlf(text).encode())
    return lf, cr


def output(*args):
    return run_crucible(*args, env=ENV).stdout


def test_tokenizer_train_encode_decode_read_crlf_as_lf(model, tmp_path):
    lf, cr = twins(tmp_path, "corpus.txt", LF_TEXT * 20)
    sums = []
    for path in (lf, cr):
        out = tmp_path / (path.name + ".json")
        line = output("tokenizer", "train", path, "-o", out, "--vocab-size", "300")
        sums.append([w for w in line.split() if w.startswith("checksum=")])
    assert sums[0] == sums[1]
    tok = str(model["tokenizer"])
    for extra in ([], ["--whole-file"], ["--eos"]):
        ids = [output("tokenizer", "encode", "-t", tok, p, *extra) for p in (lf, cr)]
        assert ids[0] == ids[1], extra
    # One line of ids per line of the file: the CRLF blank lines are empty documents too.
    assert output("tokenizer", "encode", "-t", tok, cr).count("\n") == (LF_TEXT * 20).count("\n") + 1
    docs = [json.dumps({"text": d}) for d in ["one", "", "two\nlines"]]
    jl, jc = twins(tmp_path, "docs.jsonl", "\n".join(docs[:1] + ["", "  "] + docs[1:]) + "\n")
    assert output("tokenizer", "encode", "-t", tok, jl) == output("tokenizer", "encode", "-t", tok, jc)
    ids_lf, ids_cr = twins(tmp_path, "ids.txt", output("tokenizer", "encode", "-t", tok, lf))
    for extra in ([], ["--jsonl"]):
        assert (output("tokenizer", "decode", "-t", tok, ids_lf, *extra) ==
                output("tokenizer", "decode", "-t", tok, ids_cr, *extra))


@pytest.mark.parametrize("split", ["line", "paragraph", "file"])
def test_data_prepare_reads_crlf_as_lf(model, tmp_path, split):
    lf, cr = twins(tmp_path, "book.txt", LF_TEXT)
    contents = []
    for path in (lf, cr):
        line = output("data", "prepare", "-q", "-t", model["tokenizer"], "-o",
                      tmp_path / ("shard-" + path.name), "--split", split, path)
        contents.append([w for w in line.split() if w.startswith(("content=", "documents="))])
    assert contents[0] == contents[1]


def test_whole_file_documents_are_the_same_in_tokenizer_and_data_prepare(model, tmp_path):
    # tokenizer encode --whole-file gives the ids data prepare --split file stores (EOS added).
    lf, cr = twins(tmp_path, "book.txt", LF_TEXT + "\n")
    tok = str(model["tokenizer"])
    for path in (lf, cr):
        ids = [int(x) for x in output("tokenizer", "encode", "-t", tok, path, "--whole-file",
                                      "--eos").split()]
        prefix = tmp_path / ("whole-" + path.name)
        output("data", "prepare", "-q", "-t", tok, "-o", prefix, "--split", "file", path)
        assert json.loads(output("data", "dump", prefix)) == ids


def scores(result):
    """The numbers of an eval result, without timings and paths, by section and file order."""
    if isinstance(result, dict):
        return {k: ([scores(x) for x in v.values()] if k in ("tasks", "perplexity") else scores(v))
                for k, v in result.items() if k not in ("seconds", "path")}
    return result


def test_eval_reads_crlf_task_and_text_files_as_lf(model, tmp_path):
    task = small_task("kjv_next_verse", tmp_path / "task.jsonl", 4)
    task_lf, task_cr = twins(tmp_path, "task.jsonl", task.read_text() + "\n")
    held = "\n".join(json.dumps({"text": t}) for t in LF_TEXT.split("\n\n")) + "\n\n"
    held_lf, held_cr = twins(tmp_path, "held.jsonl", held)
    results = []
    for t, h in ((task_lf, held_lf), (task_cr, held_cr)):
        out = tmp_path / (t.name + ".json")
        run_crucible("eval", model["run"], "--tasks", t, "--text", h, "--json", out, env=ENV)
        results.append(scores(json.loads(out.read_text())))
    assert results[0] == results[1] and results[0]
