"""The data pipeline through the real binary: prepare -> Megatron shards (read by megatron-core's
own reader, and the reverse), blend, verify, inspect, train on a blend, and bad input."""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, STACKS, crucible_binary, python_env, run_crucible

EOS_TOKEN = "<|end_of_text|>"

TEXTS = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void; and darkness was upon the face of the deep.",
    "A fortune: you will be hungry again in one hour. 1234567890 !?",
    "The Jargon File: hacker slang, kludge, cruft, foo, bar; \"quoted\" & <angled>.",
    "Unicode: na\u00efve caf\u00e9, \u00fcber, \u65e5\u672c\u8a9e, emoji \U0001F600.",
]


def corpus(n, salt=""):
    return [f"{TEXTS[i % len(TEXTS)]} ({salt}{i})" for i in range(n)]


@pytest.fixture(scope="session")
def tokenizer_json(tmp_path_factory):
    """A small byte-level BPE tokenizer.json trained by Hugging Face `tokenizers`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|begin_of_text|>", EOS_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(400), trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def hf(tokenizer_json):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(tokenizer_json))


def write_jsonl(path, docs, field="text"):
    with open(path, "w") as f:
        for d in docs:
            f.write(json.dumps({field: d, "meta": 1}) + "\n")
    return path


def prepare(tmp, tokenizer_json, name, docs, *extra):
    src = write_jsonl(tmp / f"{name}.jsonl", docs)
    run_crucible("data", "prepare", "-q", "-t", tokenizer_json, "-o", tmp / "shards" / name, src, *extra)
    return tmp / "shards" / name


@pytest.fixture(scope="module", params=STACKS)
def megatron(request):
    """megatron-core's own indexed_dataset, run in a subprocess: 0.16.1 on Debian's torch 1.13
    ("pinned") or 0.19 on torch 2.15 ("current"), through megatron_compat.py."""
    return python_env(request.param)


MEGATRON_READ = r"""
import json, sys
from importlib.metadata import version
import numpy as np
import megatron_compat
ds = megatron_compat.indexed_dataset().IndexedDataset(sys.argv[1])
print(json.dumps({"version": version("megatron-core"), "length": len(ds),
                  "sequence_lengths": np.dtype(ds.sequence_lengths.dtype).name,
                  "index": np.dtype(ds.index.dtype).name, "document_indices": ds.document_indices.tolist(),
                  "documents": [ds[i].tolist() for i in range(len(ds))]}))
"""

MEGATRON_WRITE = r"""
import json, sys
import numpy as np, torch
import megatron_compat
module = megatron_compat.indexed_dataset()
for prefix, dtype, docs in json.load(open(sys.argv[1])):
    builder = module.IndexedDatasetBuilder(prefix + ".bin", dtype=getattr(np, dtype))
    for d in docs:
        builder.add_document(torch.tensor(d, dtype=torch.int64), [len(d)])
    builder.finalize(prefix + ".idx")
"""


def megatron_write(megatron, tmp_path, *shards):
    """Writes each (prefix, dtype, documents) with Megatron's IndexedDatasetBuilder."""
    (tmp_path / "shards.json").write_text(json.dumps(shards))
    megatron.run(MEGATRON_WRITE, tmp_path / "shards.json")


def test_megatron_reads_our_shard(tmp_path, tokenizer_json, megatron):
    docs = corpus(257)
    prefix = prepare(tmp_path, tokenizer_json, "web", docs)
    tok = hf(tokenizer_json)
    eos = tok.token_to_id(EOS_TOKEN)
    ds = json.loads(megatron.run(MEGATRON_READ, prefix))
    requirements = {"pinned": "requirements-nodeps.txt", "current": "requirements-current.txt"}[megatron.stack]
    assert f"megatron-core=={ds['version']}\n" in (REPO / "scripts" / requirements).read_text()
    assert ds["length"] == len(docs)
    assert ds["sequence_lengths"] == "int32" and ds["index"] == "uint16"
    assert ds["document_indices"] == list(range(len(docs) + 1))
    for i, text in enumerate(docs):
        assert ds["documents"][i] == tok.encode(text).ids + [eos], f"document {i}"
    manifest = json.loads(Path(str(prefix) + ".manifest.json").read_text())
    assert manifest["documents"] == len(docs)
    assert manifest["tokens"] == sum(len(d) for d in ds["documents"])


def test_we_read_a_shard_megatron_wrote(tmp_path, megatron):
    rng = np.random.default_rng(5)
    docs = [rng.integers(0, 50000, size=int(rng.integers(0, 40))).tolist() for _ in range(123)]
    prefix = str(tmp_path / "meg")
    # uint16, and int32 (large vocabularies).
    megatron_write(megatron, tmp_path, (prefix, "uint16", docs),
                   (prefix + "32", "int32", [[x * 40 for x in d] for d in docs]))
    out = run_crucible("data", "dump", prefix).stdout.splitlines()
    assert [json.loads(line) for line in out] == docs
    out = run_crucible("data", "dump", prefix + "32").stdout.splitlines()
    assert [json.loads(line) for line in out] == [[x * 40 for x in d] for d in docs]


MEGATRON_WRITE_SPLIT = r"""
import json, sys
import numpy as np, torch
import megatron_compat
module = megatron_compat.indexed_dataset()
prefix, docs, pieces = json.load(open(sys.argv[1]))
builder = module.IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
for d, lengths in zip(docs, pieces):
    builder.add_document(torch.tensor(d, dtype=torch.int64), lengths)
builder.finalize(prefix + ".idx")
ds = module.IndexedDataset(prefix)
print(json.dumps({"sequences": len(ds), "documents": len(ds.document_indices) - 1}))
"""


def test_manifest_counts_megatron_documents_not_sequences(tmp_path, tokenizer_json, megatron):
    """A Megatron document may span several sequences: documents= is megatron's document count
    (len(document_indices) - 1), not the sequence count."""
    tok = hf(tokenizer_json)
    eos = tok.token_to_id(EOS_TOKEN)
    docs = [tok.encode(text).ids + [eos] for text in corpus(30, "s")]
    # Document i is cut into 1 + i % 3 sequences (the last one holds the rest).
    pieces = []
    for i, d in enumerate(docs):
        n = 1 + i % 3
        cuts = [len(d) * k // n for k in range(n + 1)]
        pieces.append([cuts[k + 1] - cuts[k] for k in range(n)])
    (tmp_path / "split.json").write_text(json.dumps([str(tmp_path / "meg"), docs, pieces]))
    counts = json.loads(megatron.run(MEGATRON_WRITE_SPLIT, tmp_path / "split.json"))
    assert counts == {"sequences": sum(len(p) for p in pieces), "documents": 30}
    out = run_crucible("data", "manifest", "-t", tokenizer_json, tmp_path / "meg").stdout
    assert "documents=30 " in out
    manifest = json.loads((tmp_path / "meg.manifest.json").read_text())
    assert manifest["documents"] == 30
    assert manifest["tokens"] == sum(len(d) for d in docs)
    lst = tmp_path / "blend.txt"
    lst.write_text("1 meg megatron\n")
    assert "verified shards=1 bad=0" in run_crucible("data", "verify", "--list", lst).stdout
    run_crucible("data", "inspect", "-q", "--list", lst, "--seq-len", 16, "--samples", 20,
                 "--tokenizer", tokenizer_json, "--decode", 0)


def test_megatron_written_shard_joins_a_blend(tmp_path, tokenizer_json, megatron):
    """A shard written by Megatron's IndexedDatasetBuilder, given a manifest, blends with ours."""
    tok = hf(tokenizer_json)
    eos = tok.token_to_id(EOS_TOKEN)
    docs = corpus(80, "m")
    encoded = [tok.encode(text).ids + [eos] for text in docs]
    megatron_write(megatron, tmp_path, (str(tmp_path / "meg"), "uint16", encoded))
    out = run_crucible("data", "manifest", "-t", tokenizer_json, tmp_path / "meg").stdout
    assert "documents=80" in out
    prepare(tmp_path, tokenizer_json, "ours", corpus(80, "o"))
    lst = tmp_path / "blend.txt"
    lst.write_text("1 meg megatron\n1 shards/ours crucible\n")
    assert "verified shards=2 bad=0" in run_crucible("data", "verify", "--list", lst).stdout
    report = run_crucible("data", "inspect", "-q", "--list", lst, "--seq-len", 16, "--samples", 200,
                          "--tokenizer", tokenizer_json, "--decode", 0).stdout
    assert "megatron" in report and "crucible" in report


def test_text_splits_and_field(tmp_path, tokenizer_json):
    (tmp_path / "book.txt").write_text("para one\nstill one\n\npara two\n")
    run_crucible("data", "prepare", "-q", "-t", tokenizer_json, "-o", tmp_path / "p", "--split", "paragraph",
                 tmp_path / "book.txt")
    tok = hf(tokenizer_json)
    eos = tok.token_to_id(EOS_TOKEN)
    got = [json.loads(x) for x in run_crucible("data", "dump", tmp_path / "p").stdout.splitlines()]
    assert got == [tok.encode("para one\nstill one").ids + [eos], tok.encode("para two").ids + [eos]]
    write_jsonl(tmp_path / "b.jsonl", ["alpha", "beta"], field="body")
    run_crucible("data", "prepare", "-q", "-t", tokenizer_json, "-o", tmp_path / "f", "--field", "body",
                 tmp_path / "b.jsonl")
    assert len(run_crucible("data", "dump", tmp_path / "f").stdout.splitlines()) == 2


def blend_setup(tmp_path, tokenizer_json):
    prepare(tmp_path, tokenizer_json, "web", corpus(300, "w"))
    prepare(tmp_path, tokenizer_json, "books", corpus(120, "b"))
    prepare(tmp_path, tokenizer_json, "dict", corpus(40, "d"))
    lst = tmp_path / "blend.txt"
    lst.write_text("0.5 shards/web web\n0.3 shards/books books\n0.2 shards/dict dict\n")
    return lst


def test_blend_verify_inspect_and_train(tmp_path, tokenizer_json):
    lst = blend_setup(tmp_path, tokenizer_json)
    out = run_crucible("data", "blend", "--list", lst, "--seq-len", 32, "--samples", 5000,
                       "--tokenizer", tokenizer_json).stdout
    assert "phase=index status=building" in out
    mixture = {l.split()[0].split("=")[1]: dict(kv.split("=", 1) for kv in l.split()) for l in out.splitlines()
               if l.startswith("corpus=")}
    assert set(mixture) == {"web", "books", "dict"}
    for name, weight in [("web", 0.5), ("books", 0.3), ("dict", 0.2)]:
        assert int(mixture[name]["samples"]) == round(5000 * weight)
        assert float(mixture[name]["max_prefix_error"]) <= 1.0
    again = run_crucible("data", "blend", "--list", lst, "--seq-len", 32, "--samples", 3000).stdout
    assert "status=cached" in again

    assert "verified shards=3 bad=0" in run_crucible("data", "verify", "--list", lst).stdout
    report = run_crucible("data", "inspect", "-q", "--list", lst, "--seq-len", 32, "--samples", 5000,
                          "--tokenizer", tokenizer_json, "--decode", 2).stdout
    assert "Realised mixture" in report and "Sample 1 (corpus" in report
    assert EOS_TOKEN in report  # samples are decoded with the tokenizer

    config = tmp_path / "train.toml"
    config.write_text(f"""
[job]
dump_folder = "{tmp_path / 'run'}"
[model]
flavor = "debug"
vocab_size = 640
tokenizer_path = "{tokenizer_json}"
[training]
steps = 3
seq_len = 32
local_batch_size = 4
dataset = "blend"
dataset_path = "{lst}"
[metrics]
peak_gflops = 100.0
[checkpoint]
enable = false
""")
    train = run_crucible("train", "--config", config).stdout
    assert "data=blend(" in train and "step=3 " in train


def test_verify_names_corrupted_and_truncated_shards(tmp_path, tokenizer_json):
    lst = blend_setup(tmp_path, tokenizer_json)
    bin_path = tmp_path / "shards" / "books.bin"
    data = bytearray(bin_path.read_bytes())
    data[7] ^= 0xFF
    bin_path.write_bytes(bytes(data))
    idx_path = tmp_path / "shards" / "dict.idx"
    idx_path.write_bytes(idx_path.read_bytes()[:-5])
    proc = run_crucible("data", "verify", "--list", lst, check=False)
    assert proc.returncode == 65
    assert "books.bin: corrupted" in proc.stderr and "blend.txt:2" in proc.stderr
    assert "dict.idx: truncated" in proc.stderr and "blend.txt:3" in proc.stderr
    assert "ok " + str(tmp_path / "shards" / "web") in proc.stdout


def test_weights_whose_sum_overflows_blend_and_train_like_their_ratios(tmp_path, tokenizer_json):
    blend_setup(tmp_path, tokenizer_json)
    lst = tmp_path / "huge.txt"
    lst.write_text("1e308 shards/web web\n1e308 shards/books books\n")
    proc = run_crucible("data", "blend", "--list", lst, "--seq-len", 32, "--samples", 1000, check=False)
    assert proc.returncode == 0, proc.stderr
    mixture = {l.split()[0].split("=")[1]: dict(kv.split("=", 1) for kv in l.split())
               for l in proc.stdout.splitlines() if l.startswith("corpus=")}
    assert {name: int(m["samples"]) for name, m in mixture.items()} == {"web": 500, "books": 500}
    config = tmp_path / "train.toml"
    config.write_text(f"""
[job]
dump_folder = "{tmp_path / 'run'}"
[model]
flavor = "debug"
vocab_size = 640
[training]
steps = 2
seq_len = 32
local_batch_size = 2
dataset = "blend"
dataset_path = "{lst}"
[metrics]
peak_gflops = 100.0
[checkpoint]
enable = false
""")
    train = run_crucible("train", "--config", config, check=False)
    assert train.returncode == 0, train.stderr
    assert "step=2 " in train.stdout


@pytest.mark.parametrize("case", ["missing", "zero_weight", "negative_weight", "unknown_corpus_file",
                                  "truncated_idx", "wrong_magic", "vocab_overflow", "empty_corpus",
                                  "nan_weight", "infinite_weight", "unrepresentable_share"])
def test_bad_blend_input_exits_65_naming_file_and_line(tmp_path, tokenizer_json, case):
    lst = blend_setup(tmp_path, tokenizer_json)
    shards = tmp_path / "shards"
    line = 2
    extra = []
    if case == "missing":
        lst.write_text("0.5 shards/web\n0.5 shards/nothing_here\n")
        needle = "nothing_here.bin: no such file"
    elif case == "zero_weight":
        lst.write_text("0.5 shards/web\n0 shards/books\n")
        needle = "weight 0 must be a positive"
    elif case == "negative_weight":
        lst.write_text("0.5 shards/web\n-1 shards/books\n")
        needle = "weight -1 must be a positive"
    elif case == "nan_weight":
        lst.write_text("0.5 shards/web\nnan shards/books\n")
        needle = "weight nan must be a positive finite number"
    elif case == "infinite_weight":
        lst.write_text("0.5 shards/web\n1e309 shards/books\n")
        needle = "weight 1e309 must be a positive finite number"
    elif case == "unrepresentable_share":
        lst.write_text("1e308 shards/web\n1e-10 shards/books\n")
        needle = "weight 1e-10 is too small next to the largest"
    elif case == "unknown_corpus_file":
        for ext in (".bin", ".idx"):
            (shards / ("stray" + ext)).write_bytes((shards / ("web" + ext)).read_bytes())
        lst.write_text("0.5 shards/web\n0.5 shards/stray\n")
        needle = "unknown corpus file"
    elif case == "truncated_idx":
        p = shards / "books.idx"
        p.write_bytes(p.read_bytes()[:-8])
        needle = "books.idx: truncated"
    elif case == "wrong_magic":
        p = shards / "books.idx"
        p.write_bytes(b"XXXXXXXXX" + p.read_bytes()[9:])
        needle = "wrong magic"
    elif case == "vocab_overflow":
        # A shard tokenized with ids the run's tokenizer/model cannot have: our 600-id tokenizer
        # against a model of 300 ids.
        lst.write_text("0.5 shards/web\n")
        line = 1
        extra = ["--set", "model.vocab_size=300"]
        needle = "vocabulary overflow"
    elif case == "empty_corpus":
        prepare(tmp_path, tokenizer_json, "tiny", ["x"])
        lst.write_text("0.5 shards/web\n0.5 shards/tiny\n")
        needle = "empty corpus"
    if case == "vocab_overflow":
        config = tmp_path / "t.toml"
        config.write_text(f'[training]\ndataset = "blend"\ndataset_path = "{lst}"\nseq_len = 32\nsteps = 1\n'
                          f'[metrics]\npeak_gflops = 1.0\n[job]\ndump_folder = "{tmp_path / "run"}"\n')
        proc = run_crucible("train", "--config", config, *extra, check=False)
    else:
        proc = run_crucible("data", "blend", "--list", lst, "--seq-len", 32, "--samples", 100, check=False)
    assert proc.returncode == 65, proc.stderr
    assert f"blend.txt:{line}" in proc.stderr and needle in proc.stderr, proc.stderr
    assert not list((tmp_path / ".crucible-cache").glob("*.tmp*")) if (tmp_path / ".crucible-cache").exists() else True


def test_prepare_bad_input_exits_65_and_leaves_nothing(tmp_path, tokenizer_json):
    (tmp_path / "empty.txt").write_text("")
    proc = run_crucible("data", "prepare", "-q", "-t", tokenizer_json, "-o", tmp_path / "out" / "e",
                        tmp_path / "empty.txt", check=False)
    assert proc.returncode == 65 and "empty corpus" in proc.stderr and "empty.txt" in proc.stderr
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"txt": "wrong field"}\n')
    proc = run_crucible("data", "prepare", "-q", "-t", tokenizer_json, "-o", tmp_path / "out" / "b",
                        tmp_path / "bad.jsonl", check=False)
    assert proc.returncode == 65 and "bad.jsonl:2: no field 'text'" in proc.stderr
    proc = run_crucible("data", "prepare", "-q", "-t", tokenizer_json, "-o", tmp_path / "out" / "m",
                        tmp_path / "missing.jsonl", check=False)
    assert proc.returncode == 65 and "missing.jsonl" in proc.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_interrupted_prepare_leaves_nothing_that_looks_complete(tmp_path, tokenizer_json):
    big = tmp_path / "big.jsonl"
    with open(big, "w") as f:
        line = json.dumps({"text": " ".join(TEXTS) * 4}) + "\n"
        for _ in range(60000):
            f.write(line)
    out = tmp_path / "out" / "big"
    proc = subprocess.Popen([crucible_binary(), "data", "prepare", "-t", str(tokenizer_json), "-o", str(out), str(big)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()  # the first progress line: encoding is under way
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert first.startswith("phase=prepare"), first
    for ext in (".bin", ".idx", ".manifest.json"):
        assert not Path(str(out) + ext).exists(), ext


def test_concurrent_blend_builders_agree(tmp_path, tokenizer_json):
    lst = blend_setup(tmp_path, tokenizer_json)
    cmd = [crucible_binary(), "data", "blend", "--list", str(lst), "--seq-len", "32", "--samples", "3000000"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    built = sum("status=built" in o for o, _ in outs)
    assert built >= 1
    summaries = {[l for l in o.splitlines() if l.startswith("blend ")][0].rsplit(" seconds=", 1)[0] for o, _ in outs}
    assert len(summaries) == 1
    cache = list((tmp_path / ".crucible-cache").iterdir())
    assert sorted(p.suffix for p in cache) == [".index", ".lock"], cache


def test_a_crashed_blend_builder_blocks_no_one_and_waiters_name_it(tmp_path, tokenizer_json):
    """The lock is an flock on <index>.lock: it dies with its process (here SIGSEGV), so the file
    left on disk blocks no one; while it is held, waiters name the holder."""
    lst = blend_setup(tmp_path, tokenizer_json)
    cmd = [crucible_binary(), "data", "blend", "--list", str(lst), "--seq-len", "32", "--samples", "3000000"]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().startswith("phase=index status=building")
        first.send_signal(signal.SIGSTOP)  # holds the lock, makes no progress
        second = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_line = second.stdout.readline()
        assert wait_line.startswith("phase=index_wait"), wait_line
        assert f'pid={first.pid}"' in wait_line, wait_line
        first.send_signal(signal.SIGSEGV)
        first.send_signal(signal.SIGCONT)
        assert first.wait(timeout=60) == -signal.SIGSEGV
        out, err = second.communicate(timeout=300)
    finally:
        first.kill()
    assert second.returncode == 0, err
    assert "status=built samples=3000000" in out
    cache = sorted(p.name for p in (tmp_path / ".crucible-cache").iterdir())
    assert len(cache) == 2 and cache[0].endswith(".index") and cache[1].endswith(".index.lock"), cache


@pytest.mark.parametrize("command", ["blend", "inspect"])
@pytest.mark.parametrize("samples", ["100000000000", "1e11", "9223372036854775807"])
def test_an_index_too_large_for_memory_is_refused_saying_how_large(tmp_path, tokenizer_json, command, samples):
    lst = blend_setup(tmp_path, tokenizer_json)
    proc = run_crucible("data", command, "-q", "--list", lst, "--seq-len", 32, "--samples", samples, check=False)
    assert proc.returncode == 2, proc.stderr
    exact = samples if samples != "1e11" else "100000000000"
    assert f"--samples {exact} needs " in proc.stderr and "of blend index" in proc.stderr, proc.stderr
    assert "out of memory" not in proc.stderr
    assert not (tmp_path / ".crucible-cache").exists() or not any((tmp_path / ".crucible-cache").iterdir())


@pytest.mark.parametrize("steps,needle", [
    ("100000000000", "training.steps x global batch (100000000000 x 4 = 400000000000 samples) needs "),
    # The trainer's own count of steps x batch x seq_len tokens overflows first.
    ("4611686018427387904", "training.steps x training.global_batch_size x training.seq_len = "
                            "4611686018427387904 x 4 x 32 = 5.9e+20 tokens: more than a 64-bit"),
])
def test_training_on_a_blend_too_large_for_memory_is_refused(tmp_path, tokenizer_json, steps, needle):
    lst = blend_setup(tmp_path, tokenizer_json)
    config = tmp_path / "train.toml"
    config.write_text(f"""
[job]
dump_folder = "{tmp_path / 'run'}"
[model]
flavor = "debug"
vocab_size = 640
[training]
steps = {steps}
seq_len = 32
local_batch_size = 4
dataset = "blend"
dataset_path = "{lst}"
[metrics]
peak_gflops = 100.0
[checkpoint]
enable = false
""")
    proc = run_crucible("train", "--config", config, check=False)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr, proc.stderr


def test_an_index_without_room_on_disk_is_refused_before_building(tmp_path, tokenizer_json):
    lst = blend_setup(tmp_path, tokenizer_json)
    cache = tmp_path / "small"
    cache.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(cache)],
                             capture_output=True).returncode == 0
    if not mounted:
        pytest.skip("mounting a tmpfs is not permitted here")
    try:
        proc = run_crucible("data", "blend", "--list", lst, "--seq-len", 32, "--samples", 500000,
                            "--cache-dir", cache, check=False)
        left = sorted(p.name for p in cache.iterdir())
    finally:
        subprocess.run(["umount", str(cache)], check=False)
    assert proc.returncode == 74, proc.stderr
    assert "the blend index for --samples 500000 needs 4.8 MiB on disk" in proc.stderr, proc.stderr
    assert "status=building" not in proc.stdout
    assert all(name.endswith(".lock") for name in left), left
