"""Interop of `crucible tokenizer` with Hugging Face `tokenizers`, both directions:
our tokenizer.json encodes the same under HF as under crucible, a tokenizer trained by HF encodes
the same under crucible as under HF, decoding agrees (also on cut UTF-8), and pre-tokenization
agrees on every Unicode code point."""
import json
import os
import subprocess
import sys

import pytest
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import tokenizer_corpus  # noqa: E402

CRUCIBLE = os.environ.get("CRUCIBLE", os.path.join(os.path.dirname(__file__), "..", "..",
                                                   "build", "crucible"))
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>"]

TRICKY = [
    "Hello world! It's a test. We'll see; they've done, I'm sure, you'd know. HE'S IT'LL WE'D",
    "café naïve résumé Ångström Straße ÉCOLE façade",
    "東京は日本の首都です。中文测试，标点！한국어 텍스트",
    "emoji 🎉🎉 👩‍👩‍👧 ✨ flags 🇫🇷🇩🇪 skin 👍🏽",
    "digits 1 12 123 1234 12345 123456 3.14159 1,000,000 ٣٤٥ ½ ²³ Ⅻ",
    "whitespace   runs\t\ttabs\n\n\nnewlines \r\n crlf   \n  trailing   ",
    "special <|begin_of_text|>inline<|end_of_text|> tokens <|end_of_text|><|end_of_text|>x",
    "near misses <|end_of_text <|begin_of_text|<|begin_of_text|>",
    "code: def f(x):\n    return x**2  # comment\n\tif a != b: pass\n",
    "odd spaces\u00a0nbsp\u2028line\u2029para\u0085nel\u3000ideo\u200bzwsp\u180emvs",
    "scripts Ελληνικά русский العربية עברית हिन्दी ไทย ქართული",
    "  leading spaces", "trailing spaces   ", "", " ", "\n", "\n\n", "  \n  ",
    "'s 's 'S 'Ll 'ſ 'K x's", "URL https://example.com/a?b=c&d=e#f <tag attr=\"v\">",
    "----==== long punctuation ******** ######## \\\\\\\\ ////",
    "a" * 300 + " " + "ab" * 200 + " " + "\u00e9" * 150,
]


def run(*args, **kwargs):
    return subprocess.run([CRUCIBLE, *args], check=True, capture_output=True, text=True, **kwargs)


def write_jsonl(path, docs):
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")


def crucible_encode(tokenizer_path, docs_path, tmp_path, threads=2):
    out = tmp_path / "ids.txt"
    run("tokenizer", "encode", "-t", str(tokenizer_path), str(docs_path), "-o", str(out),
        "--threads", str(threads))
    lines = out.read_text().split("\n")[:-1]
    return [[int(x) for x in line.split()] for line in lines]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    base = tmp_path_factory.mktemp("corpus")
    train_docs = list(tokenizer_corpus.documents(800_000)) + TRICKY * 3
    test_docs = TRICKY + list(tokenizer_corpus.documents(2_000_000))[-150:]
    write_jsonl(base / "train.jsonl", train_docs)
    write_jsonl(base / "test.jsonl", test_docs)
    return {"dir": base, "train": train_docs, "test": test_docs,
            "train_path": base / "train.jsonl", "test_path": base / "test.jsonl"}


def assert_same_ids(tokenizer_path, corpus, tmp_path):
    hf = Tokenizer.from_file(str(tokenizer_path))
    expected = [e.ids for e in hf.encode_batch(corpus["test"], add_special_tokens=False)]
    ours = crucible_encode(tokenizer_path, corpus["test_path"], tmp_path)
    assert len(ours) == len(expected)
    for i, (a, b) in enumerate(zip(ours, expected)):
        assert a == b, f"document {i} {corpus['test'][i][:60]!r}: crucible {a[:30]} hf {b[:30]}"
    return hf, ours


def assert_same_decode(hf, tokenizer_path, corpus, ids, tmp_path, exact_roundtrip=True):
    ids_path = tmp_path / "ids_for_decode.txt"
    ids_path.write_text("".join(" ".join(map(str, x)) + "\n" for x in ids))
    out = run("tokenizer", "decode", "-t", str(tokenizer_path), str(ids_path), "--jsonl").stdout
    decoded = [json.loads(line)["text"] for line in out.split("\n")[:-1]]
    expected = hf.decode_batch(ids, skip_special_tokens=False)
    assert decoded == expected
    if exact_roundtrip:
        assert decoded == corpus["test"]


@pytest.mark.parametrize("style", ["llama3", "gpt2"])
def test_crucible_trained_tokenizer_encodes_like_hf(style, corpus, tmp_path):
    path = tmp_path / "tokenizer.json"
    run("tokenizer", "train", str(corpus["train_path"]), "-o", str(path), "--vocab-size", "2048",
        "--pretokenizer", style, "--threads", "2")
    info = run("tokenizer", "info", str(path)).stdout
    assert "vocab_size=2048" in info and "<|end_of_text|>:2047" in info
    hf, ours = assert_same_ids(path, corpus, tmp_path)
    assert hf.get_vocab_size() == 2048
    assert "<|end_of_text|>" in TRICKY[6] and 2047 in ours[6] and 2046 in ours[6]
    assert_same_decode(hf, path, corpus, ours, tmp_path)


def hf_train(style, docs, path, vocab_size=2048, ignore_merges=False):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if style == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif style == "gpt2-prefix-space":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(docs, trainer)
    tok.save(str(path))


@pytest.mark.parametrize("style,ignore_merges", [("gpt2", False), ("llama3", False),
                                                 ("llama3", True), ("gpt2-prefix-space", False)])
def test_hf_trained_tokenizer_encodes_like_hf(style, ignore_merges, corpus, tmp_path):
    path = tmp_path / "hf.json"
    hf_train(style, corpus["train"], path, ignore_merges=ignore_merges)
    hf, ours = assert_same_ids(path, corpus, tmp_path)
    assert_same_decode(hf, path, corpus, ours, tmp_path,
                       exact_roundtrip=style != "gpt2-prefix-space")


def test_both_merges_spellings_encode_alike(corpus, tmp_path):
    path = tmp_path / "hf.json"
    hf_train("llama3", corpus["train"], path, vocab_size=1024)
    data = json.loads(path.read_text())
    merges = data["model"]["merges"]
    pairs = [m if isinstance(m, list) else m.split(" ") for m in merges]
    data["model"]["merges"] = [" ".join(p) for p in pairs]
    legacy = tmp_path / "legacy.json"
    legacy.write_text(json.dumps(data, ensure_ascii=False))
    data["model"]["merges"] = pairs
    arrays = tmp_path / "arrays.json"
    arrays.write_text(json.dumps(data, ensure_ascii=False, indent=1))
    assert_same_ids(legacy, corpus, tmp_path)
    assert_same_ids(arrays, corpus, tmp_path)
    sums = {p.name: [l for l in run("tokenizer", "info", str(p)).stdout.split("\n")
                     if l.startswith("checksum=")][0] for p in (legacy, arrays)}
    assert sums["legacy.json"] == sums["arrays.json"]


def test_decode_of_cut_utf8_matches_hf(corpus, tmp_path):
    path = tmp_path / "hf.json"
    hf_train("gpt2", corpus["train"], path, vocab_size=512)
    hf = Tokenizer.from_file(str(path))
    prefixes = []
    for text in TRICKY[1:5]:
        ids = hf.encode(text, add_special_tokens=False).ids
        prefixes += [ids[:k] for k in range(1, len(ids), 3)]
    ids_path = tmp_path / "prefixes.txt"
    ids_path.write_text("".join(" ".join(map(str, x)) + "\n" for x in prefixes))
    out = run("tokenizer", "decode", "-t", str(path), str(ids_path), "--jsonl").stdout
    decoded = [json.loads(line)["text"] for line in out.split("\n")[:-1]]
    assert any("\ufffd" in d for d in decoded)  # the test does cut inside characters
    assert decoded == hf.decode_batch(prefixes, skip_special_tokens=False)


def byte_level_to_text(piece, char_to_byte):
    return bytes(char_to_byte[c] for c in piece).decode("utf-8")


@pytest.mark.parametrize("style", ["llama3", "gpt2"])
def test_pre_tokenization_agrees_on_every_code_point(style, corpus, tmp_path):
    path = tmp_path / "tokenizer.json"
    run("tokenizer", "train", str(corpus["train_path"]), "-o", str(path), "--vocab-size", "300",
        "--pretokenizer", style)
    hf = Tokenizer.from_file(str(path))
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    assert len(alphabet) == 256
    # GPT-2's byte -> character table, rebuilt to read HF's byte-level pieces back as text.
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    char_to_byte = {c: b for b, c in chars.items()}
    separators = ["", " ", "a", "1", "\n", "'s", "  ", "!", "\t", "é"]
    docs, current = [], []
    for i, cp in enumerate(c for c in range(1, 0x110000) if not 0xD800 <= c < 0xE000):
        current.append(chr(cp) + separators[i % len(separators)])
        if len(current) == 8192:
            docs.append("".join(current))
            current = []
    docs.append("".join(current))
    docs_path = tmp_path / "unicode.jsonl"
    write_jsonl(docs_path, docs)
    out = tmp_path / "pieces.jsonl"
    run("tokenizer", "encode", "-t", str(path), str(docs_path), "--pieces", "-o", str(out))
    ours = [json.loads(line) for line in out.read_text(encoding="utf-8").split("\n")[:-1]]
    assert len(ours) == len(docs)
    for i, doc in enumerate(docs):
        expected = [byte_level_to_text(p, char_to_byte)
                    for p, _ in hf.pre_tokenizer.pre_tokenize_str(doc)]
        if ours[i] != expected:
            k = next(j for j in range(min(len(ours[i]), len(expected)))
                     if ours[i][j] != expected[j])
            pytest.fail(f"document {i}: piece {k}: crucible {ours[i][k - 2:k + 3]!r} "
                        f"hf {expected[k - 2:k + 3]!r}")


def test_added_token_flags_match_hf(corpus, tmp_path):
    from tokenizers import AddedToken
    path = tmp_path / "hf.json"
    hf_train("llama3", corpus["train"], path, vocab_size=600)
    hf = Tokenizer.from_file(str(path))
    hf.add_special_tokens([AddedToken("<m>", lstrip=True, rstrip=True, special=True,
                                      normalized=False)])
    hf.add_tokens([AddedToken("word", single_word=True, normalized=True),
                   AddedToken("zz", normalized=True), AddedToken("zzz!", normalized=False),
                   AddedToken("東京", single_word=True, normalized=True)])
    flagged = tmp_path / "flagged.json"
    hf.save(str(flagged))
    texts = ["a  <m>\n b", "<m><m> <m>", "word words sword word_ word!", "zz zzz zzz! zzzz!",
             "東京 東京都 (東京) x東京", "\t<m>\t", "no added tokens here", "word"]
    docs = tmp_path / "flags.jsonl"
    write_jsonl(docs, texts)
    ours = crucible_encode(flagged, docs, tmp_path)
    expected = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    assert ours == expected
