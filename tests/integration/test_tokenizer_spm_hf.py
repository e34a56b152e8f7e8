"""SentencePiece-style BPE and normalizers against Hugging Face `tokenizers` 0.23.3: tokenizers
trained here by `tokenizers` itself in the layouts of Llama 2 (Prepend + Replace normalizer,
ByteFallback/Fuse/Strip decoder), Mistral (Metaspace prepend_scheme=first), Gemma (Replace
normalizer) and a Metaspace(always, split) one with an unk token instead of byte_fallback, plus
byte-level and character-level tokenizers behind NFC, NFKC, Lowercase, Replace and Sequence
normalizers. Each encodes every code point (in chunks) and a few MB of multilingual text to the
ids `tokenizers` gives, and decodes ids to the same strings."""
import json
import os
import random
import subprocess
import sys
import unicodedata

import pytest
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import tokenizer_corpus  # noqa: E402

CRUCIBLE = os.environ.get("CRUCIBLE", os.path.join(os.path.dirname(__file__), "..", "..",
                                                   "build", "crucible"))
SPECIALS = ["<unk>", "<s>", "</s>"]
BYTE_TOKENS = ["<0x%02X>" % b for b in range(256)]

TRICKY = [
    "Hello world! It's a test.  Two  spaces, trailing ", " leading space", "  two leading",
    "café naïve résumé Ångström Straße ÉCOLE façade e\u0301 A\u030a \u212b \u00c5",
    "東京は日本の首都です。中文测试，标点！한국어 텍스트 \u1100\u1161\u11a8 \u3099\u304b\u3099",
    "emoji 🎉🎉 👩‍👩‍👧 ✨ flags 🇫🇷🇩🇪 skin 👍🏽 rare 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 🩶",
    "digits 1 12 123 ٣٤٥ ½ ²³ Ⅻ ﬁ ﬀ ＦＵＬＬ ｗｉｄｔｈ ㍿ ㈱",
    "whitespace   runs\t\ttabs\n\n\nnewlines \r\n crlf   \n  trailing   ",
    "special <s>inline</s> tokens </s></s>x <unk> <0x41> ▁ ▁▁x",
    "İstanbul ΣΊΣΥΦΟΣ ß ẞ Ǆ ǅ ǆ ﬃ ΐ Ω K Å",
    "", " ", "\n", "▁", "a" * 300 + " " + "ab" * 200,
]


def run(*args, **kwargs):
    return subprocess.run([CRUCIBLE, *args], check=True, capture_output=True, text=True, **kwargs)


def write_jsonl(path, docs):
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    return path


def multilingual_text(megabytes, seed=26):
    """Deterministic text in many scripts: words of letters (precomposed and decomposed Latin,
    Greek, Cyrillic, Armenian, Hebrew, Arabic, Devanagari, Bengali, Thai, Georgian, Hangul
    syllables and conjoining jamo, kana with combining voicing marks, CJK), digits of several
    scripts, compatibility characters (fullwidth, ligatures, circled, superscripts), emoji with
    joiners and modifiers, punctuation and odd spaces."""
    rng = random.Random(seed)
    ranges = [(0x41, 0x5A), (0x61, 0x7A), (0xC0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF),
              (0x531, 0x587), (0x5D0, 0x5EA), (0x620, 0x64A), (0x900, 0x97F), (0x980, 0x9FF),
              (0xE01, 0xE3A), (0x10D0, 0x10FA), (0x1E00, 0x1EFF), (0xAC00, 0xD7A3),
              (0x3041, 0x3096), (0x30A1, 0x30FA), (0x4E00, 0x9FFF), (0xFF01, 0xFF5E),
              (0x2460, 0x24FF), (0x1D400, 0x1D7FF), (0x1F300, 0x1F64F), (0x2070, 0x209C),
              (0xFB00, 0xFB4F), (0x3300, 0x33FF), (0x1100, 0x11FF), (0x2150, 0x218B)]
    marks = ["\u0300", "\u0301", "\u0308", "\u0323", "\u0327", "\u030a", "\u3099", "\u309a",
             "\u0334", "\u05b4", "\u0651", "\u093c", "\u200d"]
    spaces = [" "] * 20 + ["  ", "\t", "\n", "\u00a0", "\u3000", "\u2009", " \n", "\r\n"]
    puncts = [".", ",", "!", "?", ";", ":", "'", "\"", "(", ")", "-", "...", "。", "、", "「", "」"]
    docs, size = [], 0
    while size < megabytes * 1_000_000:
        words = []
        for _ in range(rng.randint(20, 400)):
            lo, hi = rng.choice(ranges)
            word = "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 8)))
            if rng.random() < 0.2:
                word += rng.choice(marks)
            if rng.random() < 0.05:
                word = unicodedata.normalize(rng.choice(["NFD", "NFKD"]), word)
            if rng.random() < 0.1:
                word += rng.choice(puncts)
            if rng.random() < 0.05:
                word = word.upper()
            words.append(word + rng.choice(spaces))
        doc = "".join(words)
        docs.append(doc)
        size += len(doc.encode("utf-8"))
    return docs


def code_point_documents(per_document=4096):
    """Every code point (no surrogates), each followed by a separator from a list that holds
    combining marks, jamo, spaces and letters, so composition and casing see real contexts."""
    separators = ["", " ", "a", "\u0301", "\u0323\u0301", "\u1161", "\u11a8", "\u3099", "  ",
                  "\u0334", "A", "\u00e9", "\n", "\u0345"]
    code_points = [c for c in range(1, 0x110000) if not 0xD800 <= c < 0xE000]
    docs, current = [], []
    for i, cp in enumerate(code_points):
        current.append(chr(cp) + separators[i % len(separators)])
        if len(current) == per_document:
            docs.append("".join(current))
            current = []
    docs.append("".join(current))
    return docs


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    base = tmp_path_factory.mktemp("spm")
    train = list(tokenizer_corpus.documents(600_000)) + multilingual_text(0.4, seed=1) + TRICKY
    test = TRICKY + list(tokenizer_corpus.documents(1_500_000))[-100:] + multilingual_text(3.0)
    every = code_point_documents()
    return {"dir": base, "train": train, "test": test, "every": every,
            "test_path": write_jsonl(base / "test.jsonl", test),
            "every_path": write_jsonl(base / "every.jsonl", every)}


def trained_model(texts, vocab_size=3000, limit_alphabet=300):
    """A BPE over characters (no byte-level map) trained by `tokenizers` on Metaspace words, its
    alphabet limited so that many characters are left out of the vocabulary."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always",
                                                 split=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, limit_alphabet=limit_alphabet,
                                  show_progress=False)
    tok.train_from_iterator(texts["train"], trainer)
    model = json.loads(tok.to_str())["model"]
    return model["vocab"], model["merges"]


def sentencepiece_json(texts, layout, path, byte_fallback=True):
    """A tokenizer.json laid out as the released SentencePiece-converted ones: <unk> <s> </s>,
    then the 256 <0xNN> byte tokens (byte_fallback), then the trained pieces."""
    vocab, merges = trained_model(texts)
    ids = {}
    for token in SPECIALS + (BYTE_TOKENS if byte_fallback else []):
        ids[token] = len(ids)
    for token in sorted(vocab, key=vocab.get):
        if token not in ids:
            ids[token] = len(ids)
    added = [{"id": ids[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for t in SPECIALS]
    replace_decoder = {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}
    spm_decoder = {"type": "Sequence", "decoders": [
        replace_decoder, {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    normalizer = pre_tokenizer = None
    fuse_unk = True
    if layout == "llama2":
        normalizer = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
        decoder = spm_decoder
    elif layout == "mistral":
        pre_tokenizer = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                         "split": False}
        decoder = spm_decoder
    elif layout == "gemma":
        normalizer = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
        decoder = {"type": "Sequence", "decoders": [replace_decoder, {"type": "ByteFallback"},
                                                    {"type": "Fuse"}]}
    elif layout == "metaspace-always":
        pre_tokenizer = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                         "split": True}
        decoder = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                   "split": True}
        fuse_unk = False
    else:
        raise ValueError(layout)
    data = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": normalizer, "pre_tokenizer": pre_tokenizer, "post_processor": None,
            "decoder": decoder,
            "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": fuse_unk, "byte_fallback": byte_fallback,
                      "ignore_merges": False, "vocab": ids, "merges": merges}}
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path


def crucible_encode(tokenizer_path, docs_path, tmp_path, threads=2):
    out = tmp_path / "ids.txt"
    run("tokenizer", "encode", "-t", str(tokenizer_path), str(docs_path), "-o", str(out),
        "--threads", str(threads))
    return [[int(x) for x in line.split()] for line in out.read_text().split("\n")[:-1]]


def crucible_decode(tokenizer_path, ids, tmp_path, skip_special=False):
    ids_path = tmp_path / "ids_for_decode.txt"
    ids_path.write_text("".join(" ".join(map(str, x)) + "\n" for x in ids))
    args = ["tokenizer", "decode", "-t", str(tokenizer_path), str(ids_path), "--jsonl"]
    out = run(*args, *(["--skip-special"] if skip_special else [])).stdout
    return [json.loads(line)["text"] for line in out.split("\n")[:-1]]


def assert_same(tokenizer_path, docs, docs_path, tmp_path, what):
    """Same ids as `tokenizers` on every document, and the same decoded strings."""
    hf = Tokenizer.from_file(str(tokenizer_path))
    expected = [e.ids for e in hf.encode_batch(docs, add_special_tokens=False)]
    ours = crucible_encode(tokenizer_path, docs_path, tmp_path)
    assert len(ours) == len(expected)
    bad = [i for i, (a, b) in enumerate(zip(ours, expected)) if a != b]
    if bad:
        i = bad[0]
        k = next((j for j in range(min(len(ours[i]), len(expected[i])))
                  if ours[i][j] != expected[i][j]), 0)
        pytest.fail(f"{what}: {len(bad)} of {len(docs)} documents differ; document {i} "
                    f"{docs[i][:40]!r} at token {k}: crucible {ours[i][max(0, k - 3):k + 5]} "
                    f"hf {expected[i][max(0, k - 3):k + 5]}")
    decoded = crucible_decode(tokenizer_path, expected, tmp_path)
    hf_decoded = hf.decode_batch(expected, skip_special_tokens=False)
    bad = [i for i, (a, b) in enumerate(zip(decoded, hf_decoded)) if a != b]
    assert not bad, f"{what}: decode differs on {len(bad)} documents, first {bad[0]}: " \
                    f"crucible {decoded[bad[0]][:80]!r} hf {hf_decoded[bad[0]][:80]!r}"
    return hf, expected


@pytest.mark.parametrize("layout", ["llama2", "mistral", "gemma", "metaspace-always"])
def test_sentencepiece_style_bpe_encodes_and_decodes_like_hf(layout, texts, tmp_path):
    path = sentencepiece_json(texts, layout, tmp_path / f"{layout}.json",
                              byte_fallback=layout != "metaspace-always")
    hf, ids = assert_same(path, texts["test"], texts["test_path"], tmp_path, layout)
    vocab = hf.get_vocab()
    flat = [i for doc in ids for i in doc]
    if layout != "metaspace-always":
        assert sum(1 for i in flat if 3 <= i < 259) > 1000  # byte fallback did happen
    else:
        assert flat.count(vocab["<unk>"]) > 1000  # so did unknown characters
    assert_same(path, texts["every"], texts["every_path"], tmp_path, layout + " every code point")


@pytest.mark.parametrize("layout", ["llama2", "metaspace-always"])
def test_sentencepiece_decode_of_any_ids_matches_hf(layout, texts, tmp_path):
    """Random id sequences (byte tokens that cut characters, specials, unk) and skip_special."""
    path = sentencepiece_json(texts, layout, tmp_path / f"{layout}.json",
                              byte_fallback=layout != "metaspace-always")
    hf = Tokenizer.from_file(str(path))
    rng = random.Random(3)
    n = hf.get_vocab_size()
    seqs = [[rng.randrange(n) for _ in range(rng.randint(0, 30))] for _ in range(400)]
    seqs += [[rng.choice([3 + 0xE6, 3 + 0x9D, 3 + 0xB1, 3 + 0x41, 1, 2, 0, 300])
              for _ in range(rng.randint(1, 12))] for _ in range(400)]
    for skip in (False, True):
        assert crucible_decode(path, seqs, tmp_path, skip) == hf.decode_batch(
            seqs, skip_special_tokens=skip)


NORMALIZERS = {
    "NFC": {"type": "NFC"},
    "NFD": {"type": "NFD"},
    "NFKC": {"type": "NFKC"},
    "NFKD": {"type": "NFKD"},
    "Lowercase": {"type": "Lowercase"},
    "nfkc-lower-spaces": {"type": "Sequence", "normalizers": [
        {"type": "NFKC"}, {"type": "Lowercase"},
        {"type": "Replace", "pattern": {"Regex": r"\s+"}, "content": " "}]},
    "strip-accents-by-regex": {"type": "Sequence", "normalizers": [
        {"type": "NFD"}, {"type": "Replace", "pattern": {"Regex": r"\p{Mn}"}, "content": ""},
        {"type": "NFC"}]},
    "prepend-strip-replace": {"type": "Sequence", "normalizers": [
        {"type": "Strip", "strip_left": True, "strip_right": True},
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": "  "}, "content": "\u2581\u2581"}]},
}


def character_bpe_json(normalizer, path, pre_tokenizer=None, added=()):
    """A tiny character-level BPE (a few letters, byte_fallback) behind a normalizer."""
    vocab = {t: i for i, t in enumerate(["<unk>"] + BYTE_TOKENS + list("abcdefgh") + ["ab"])}
    data = {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [dict(a, id=len(vocab) + i) for i, a in enumerate(added)],
            "normalizer": normalizer, "pre_tokenizer": pre_tokenizer, "post_processor": None,
            "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"},
                                                         {"type": "Fuse"}]},
            "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                      "vocab": vocab, "merges": [["a", "b"]]}}
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path


@pytest.mark.parametrize("name", sorted(NORMALIZERS))
def test_normalizer_matches_hf_on_every_code_point(name, texts, tmp_path):
    """The text BPE sees (a tokenizer without a pre-tokenizer: one piece, the normalized text)
    is Hugging Face's normalize_str of it, for every code point in context and the test text;
    the ids follow."""
    path = character_bpe_json(NORMALIZERS[name], tmp_path / "norm.json")
    hf = Tokenizer.from_file(str(path))
    for docs, docs_path in ((texts["every"], texts["every_path"]),
                            (texts["test"], texts["test_path"])):
        out = tmp_path / "pieces.jsonl"
        run("tokenizer", "encode", "-t", str(path), str(docs_path), "--pieces", "-o", str(out))
        ours = ["".join(json.loads(line)) for line in
                out.read_text(encoding="utf-8").split("\n")[:-1]]
        assert len(ours) == len(docs)
        for i, doc in enumerate(docs):
            expected = hf.normalizer.normalize_str(doc)
            if ours[i] != expected:
                k = next((j for j in range(min(len(ours[i]), len(expected)))
                          if ours[i][j] != expected[j]), min(len(ours[i]), len(expected)))
                show = lambda s: " ".join("U+%04X" % ord(c) for c in s[max(0, k - 2):k + 4])
                pytest.fail(f"{name}: document {i} at character {k}: crucible {show(ours[i])} "
                            f"hf {show(expected)}")
    assert_same(path, texts["every"], texts["every_path"], tmp_path, name)


def test_normalized_added_tokens_match_by_their_normalized_content(texts, tmp_path):
    """An added token with normalized=true is cut from the normalized text by its normalized
    content, and decodes to that content (tokenizers 0.23); one with normalized=false is cut
    from the raw text first, and a Metaspace "first" prepends only to the piece that starts it."""
    flags = {"single_word": False, "lstrip": False, "rstrip": False}
    added = [dict(flags, content="HELLO", normalized=True, special=False),
             dict(flags, content="ＳＰ", normalized=True, special=True),
             dict(flags, content="<X>", normalized=False, special=True)]
    normalizer = {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]}
    metaspace = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                 "split": True}
    path = character_bpe_json(normalizer, tmp_path / "added.json", metaspace, added)
    docs = ["HELLO hello HeLLo", "ＳＰ sp SP x<X>HELLO<X>", "<X> a b", "ab<X>ab", "  abc",
            "ＨＥＬＬＯ!", "\u212b<X>\u00c5", "<X>"] + TRICKY
    docs_path = write_jsonl(tmp_path / "added.jsonl", docs)
    hf, ids = assert_same(path, docs, docs_path, tmp_path, "added tokens")
    assert any(len(x) > 0 and x[0] == hf.token_to_id("HELLO") for x in ids)
    for skip in (False, True):
        assert crucible_decode(path, ids, tmp_path, skip) == hf.decode_batch(
            ids, skip_special_tokens=skip)


@pytest.mark.parametrize("style", ["byte-level", "characters"])
def test_tokenizer_trained_behind_a_normalizer_encodes_like_hf(style, texts, tmp_path):
    """Trained by tokenizers with NFKC + Lowercase (byte-level, Llama 3 pre-tokenizer) or NFC
    (characters, Metaspace, byte_fallback): same ids on the multilingual text and every code
    point."""
    if style == "byte-level":
        tok = Tokenizer(models.BPE())
        tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
                                       r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        from tokenizers import decoders
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=2000, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    else:
        tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
        from tokenizers import decoders
        tok.decoder = decoders.Sequence([decoders.Metaspace(prepend_scheme="first"),
                                         decoders.ByteFallback(), decoders.Fuse()])
        trainer = trainers.BpeTrainer(vocab_size=2000, show_progress=False, limit_alphabet=200,
                                      special_tokens=["<unk>"] + BYTE_TOKENS)
    tok.train_from_iterator(texts["train"], trainer)
    path = tmp_path / "trained.json"
    tok.save(str(path))
    assert_same(path, texts["test"], texts["test_path"], tmp_path, style)
    assert_same(path, texts["every"], texts["every_path"], tmp_path, style + " every code point")
