"""Interop of `crucible tokenizer` with Hugging Face `tokenizers`, both directions:
our tokenizer.json encodes the same under HF as under crucible, a tokenizer trained by HF encodes
the same under crucible as under HF, decoding agrees (also on cut UTF-8), and pre-tokenization
agrees on every Unicode code point."""
import json
import os
import re
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


# Every class a pre-tokenizer regex may name: the Unicode general categories (and LC), \d, \s.
UNICODE_CATEGORIES = ("L Lu Ll Lt Lm Lo LC M Mn Mc Me N Nd Nl No P Pc Pd Ps Pe Pi Pf Po S Sm Sc Sk "
                      "So Z Zs Zl Zp C Cc Cf Cs Co Cn").split()
EVERY_CODE_POINT = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]
UNICODE_TABLE = os.path.join(os.path.dirname(__file__), "..", "..", "src", "tokenizer",
                             "unicode_classes.inc")


@pytest.fixture(scope="module")
def byte_level_base():
    """A minimal byte-level BPE tokenizer.json (as a dict) to put pre-tokenizers into."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["ab"], trainers.BpeTrainer(
        vocab_size=257, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return json.loads(tok.to_str())


def byte_level_char_to_byte():
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return {c: b for b, c in chars.items()}


def split_step(pattern, behavior="Removed", invert=True):
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": behavior, "invert": invert}


def with_pre_tokenizer(base, steps, path):
    data = dict(base)
    data["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": steps + [
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
         "use_regex": False}]}
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path


def assert_same_pieces(tokenizer_path, docs, docs_path, tmp_path, what):
    """crucible's pre-tokens of every document are Hugging Face's."""
    hf = Tokenizer.from_file(str(tokenizer_path))
    out = tmp_path / "pieces.jsonl"
    run("tokenizer", "encode", "-t", str(tokenizer_path), str(docs_path), "--pieces", "-o", str(out))
    ours = [json.loads(line) for line in out.read_text(encoding="utf-8").split("\n")[:-1]]
    assert len(ours) == len(docs)
    char_to_byte = byte_level_char_to_byte()
    for i, doc in enumerate(docs):
        expected = [byte_level_to_text(p, char_to_byte)
                    for p, _ in hf.pre_tokenizer.pre_tokenize_str(doc)]
        if ours[i] != expected:
            k = next((j for j in range(min(len(ours[i]), len(expected)))
                      if ours[i][j] != expected[j]), min(len(ours[i]), len(expected)))
            show = lambda pieces: [" ".join("U+%04X" % ord(c) for c in p[:6])
                                   for p in pieces[max(0, k - 1):k + 2]]
            pytest.fail(f"{what}: document {i}, piece {k}: crucible {show(ours[i])} "
                        f"hf {show(expected)}")


def code_point_documents(code_points, tmp_path, name, per_document=65536):
    docs = ["".join(map(chr, code_points[i:i + per_document]))
            for i in range(0, len(code_points), per_document)]
    path = tmp_path / name
    write_jsonl(path, docs)
    return docs, path


@pytest.mark.parametrize("cls", [r"\p{%s}" % c for c in UNICODE_CATEGORIES] + [r"\d", r"\s"])
def test_every_regex_class_agrees_on_every_code_point(cls, byte_level_base, tmp_path):
    # Split(cls+, Removed, invert): the pieces are the runs of the class's members, so equal
    # pieces over all of U+0000..U+10FFFF mean the same members.
    docs, docs_path = code_point_documents(EVERY_CODE_POINT, tmp_path, "all.jsonl")
    path = with_pre_tokenizer(byte_level_base, [split_step(cls + "+")], tmp_path / "t.json")
    assert_same_pieces(path, docs, docs_path, tmp_path, cls)


def differing_code_points():
    """The code points where PCRE2 and Oniguruma disagree on some class (from the generated
    table), plus ASCII, Latin-1 and every 61st code point: where each form of a class must be
    checked again."""
    text = open(UNICODE_TABLE, encoding="utf-8").read()
    points = set(range(0x100)) | set(EVERY_CODE_POINT[::61])
    for first, last in re.findall(r"\{0x([0-9A-F]+), 0x([0-9A-F]+)\}", text):
        points.update(range(int(first, 16), int(last, 16) + 1))
    return sorted(points)


CLASS_FORMS = [r"\P{X}", r"\p{^X}", r"\P{^X}", r"[\p{X}]", r"[^\p{X}]", r"[\P{X}]", r"[^\P{X}]",
               r"[\p{X}a-c\-]", r"[^\p{X}a-c\-]", r"[\p{X}\p{Mc}]", r"[^\p{X}\p{Mc}\s]",
               r"[\p{X}\P{Cn}]", r"[^\p{^X}\p{Lo}]", r"(?i)\p{X}", r"(?i)\P{X}"]
ESCAPE_FORMS = [r"\D", r"[\d]", r"[^\d]", r"[\D]", r"\S", r"[\s]", r"[^\s]", r"[\S]", r"[^\S]",
                r"[^\S\r\n]", r"[\S\s]", r"(?i)[^\S\d]", r"[\d\p{L}]", r"[^\d\p{Cn}]"]


@pytest.mark.parametrize("cls", UNICODE_CATEGORIES + ["escapes"])
def test_every_form_of_a_class_agrees_where_unicode_versions_differ(cls, byte_level_base,
                                                                     tmp_path):
    points = differing_code_points()
    docs, docs_path = code_point_documents(points, tmp_path, "differing.jsonl")
    forms = ESCAPE_FORMS if cls == "escapes" else [f.replace("X", cls) for f in CLASS_FORMS]
    for k, form in enumerate(forms):
        path = with_pre_tokenizer(byte_level_base, [split_step(form + "+")],
                                  tmp_path / f"form{k}.json")
        assert_same_pieces(path, docs, docs_path, tmp_path, form)


def test_digits_pre_tokenizer_agrees_on_every_code_point(byte_level_base, tmp_path):
    docs, docs_path = code_point_documents(EVERY_CODE_POINT, tmp_path, "all.jsonl")
    for individual in (True, False):
        path = with_pre_tokenizer(byte_level_base,
                                  [{"type": "Digits", "individual_digits": individual}],
                                  tmp_path / f"digits{individual}.json")
        assert_same_pieces(path, docs, docs_path, tmp_path, f"Digits({individual})")


def test_single_word_added_tokens_agree_on_every_code_point(byte_level_base, tmp_path):
    # A single_word token matches only between non-word characters (Rust regex's \w): "qq" after
    # every code point, on both sides.
    from tokenizers import AddedToken
    hf = Tokenizer.from_str(json.dumps(byte_level_base))
    hf.add_tokens([AddedToken("qq", single_word=True, normalized=False)])
    path = tmp_path / "single_word.json"
    hf.save(str(path))
    points = [c for c in EVERY_CODE_POINT if c != ord("q")]
    docs = ["".join(chr(c) + "qq " for c in points[k:k + 20000])
            for k in range(0, len(points), 20000)]
    docs_path = tmp_path / "single_word.jsonl"
    write_jsonl(docs_path, docs)
    qq = hf.token_to_id("qq")
    expected = hf.encode_batch(docs, add_special_tokens=False)
    ours = crucible_encode(path, docs_path, tmp_path)
    assert len(ours) == len(docs)
    for i, (mine, theirs) in enumerate(zip(ours, expected)):
        if mine != theirs.ids:
            matched = {docs[i][start - 1] for t, (start, _) in zip(theirs.ids, theirs.offsets)
                       if t == qq}
            pytest.fail(f"document {i}: crucible matches qq {mine.count(qq)} times, hf "
                        f"{len(matched)} times (after e.g. "
                        f"{' '.join('U+%04X' % ord(c) for c in sorted(matched)[:5])})")


def table_ranges(name):
    """The code points of one array of the generated table."""
    text = open(UNICODE_TABLE, encoding="utf-8").read()
    body = re.search(r"%s\[\] = \{(.*?)\};" % name, text, re.S).group(1)
    return [c for first, last in re.findall(r"\{0x([0-9A-F]+), 0x([0-9A-F]+)\}", body)
            for c in range(int(first, 16), int(last, 16) + 1)]


def test_caseless_literals_agree_on_every_cased_code_point(byte_level_base, tmp_path):
    # Under (?i) a literal matches its case variants, each engine by its own Unicode version:
    # every cased code point crucible accepts there matches the same variants as in tokenizers,
    # and the ones whose variants differ are refused (exit 65) instead.
    differ = set(table_ranges("kCaseFoldDiffersRanges"))
    cased = {c for c in EVERY_CODE_POINT[0x21:]
             if any(f(chr(c)) != chr(c) for f in (str.lower, str.upper, str.casefold))}
    cased |= differ | {c for c in differing_code_points() if c > 0x7F and chr(c).isalpha()}
    cased = sorted(cased)
    docs, docs_path = code_point_documents(cased, tmp_path, "cased.jsonl")
    accepted = [c for c in cased if c not in differ]
    for chunk in range(0, len(accepted), 500):
        cls = "(?i)[" + "".join("\\x{%X}" % c for c in accepted[chunk:chunk + 500]) + "]+"
        path = with_pre_tokenizer(byte_level_base, [split_step(cls)], tmp_path / "caseless.json")
        assert_same_pieces(path, docs, docs_path, tmp_path, f"caseless chunk {chunk}")
    assert differ
    for c in sorted(differ):
        path = with_pre_tokenizer(byte_level_base, [split_step("(?i)\\x{%X}" % c)],
                                  tmp_path / "refused.json")
        result = subprocess.run([CRUCIBLE, "tokenizer", "info", str(path)], capture_output=True,
                                text=True)
        assert result.returncode == 65 and str(path) in result.stderr, result.stderr
        assert "U+%04X under (?i)" % c in result.stderr, result.stderr


# Pre-tokenizers of released tokenizers, as their tokenizer.json files write them.
O200K = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
         r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
         r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
         r"\s*[\r\n]+|\s+(?!\S)|\s+")
# DeepSeek-V3: CR and LF stand in the third pattern as the characters themselves.
DEEPSEEK_V3 = [r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
               "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
               "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"]
WILD_PRE_TOKENIZERS = {
    "gpt2": [],
    "llama3": [LLAMA3],
    "qwen2": [QWEN2],
    "deepseek-v3": DEEPSEEK_V3,
    "gpt-4o": [O200K],
}
# Text with code points newer than Debian's PCRE2 knows (Unicode 15 and 16).
NEWER_UNICODE = ["Love you 🩶!", "🩶🩶 grey hearts, 🫨 a shaking face, 🪿 a goose.",
                 "Ahom ra \U0001171e\U0001171e and U+1C89 \u1c89\u1c8aword, Ꟍ\ua7cdx",
                 "digits \U0001e5f1\U0001e5f2\U0001e5f3 7\U0001e5f1, Garay \U00010d40\U00010d41",
                 "Kannada \u0cf3 mark \u0cf3\u0cf3 \U00011f02 dot!\U0001fa76?"]


@pytest.mark.parametrize("name", list(WILD_PRE_TOKENIZERS))
def test_pre_tokenizers_from_the_wild_encode_like_hf(name, corpus, tmp_path):
    splits = [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False)
              for p in WILD_PRE_TOKENIZERS[name]]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=not splits)])
    tok.decoder = decoders.ByteLevel()
    newer = list(map(chr, differing_code_points()))
    # Every code point where a class changed, between letters, digits, spaces and punctuation.
    between = " a1!\n's\u00e9\t"
    mixed = ["".join(c + between[i % len(between)] for i, c in enumerate(newer[k:k + 4096]))
             for k in range(0, len(newer), 4096)]
    tok.train_from_iterator(corpus["train"] + NEWER_UNICODE * 5 + mixed, trainers.BpeTrainer(
        vocab_size=1024, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = tmp_path / "wild.json"
    tok.save(str(path))
    docs = NEWER_UNICODE + TRICKY + mixed + corpus["test"][-20:]
    docs_path = tmp_path / "wild.jsonl"
    write_jsonl(docs_path, docs)
    # The pre-tokens first (ids alone can agree by luck where a vocabulary has no merge), on the
    # documents without special tokens (HF's pre_tokenize_str does not cut added tokens out).
    unicode_docs = NEWER_UNICODE + mixed
    unicode_path = tmp_path / "unicode.jsonl"
    write_jsonl(unicode_path, unicode_docs)
    assert_same_pieces(path, unicode_docs, unicode_path, tmp_path, name)
    expected = [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)]
    ours = crucible_encode(path, docs_path, tmp_path)
    for i, (a, b) in enumerate(zip(ours, expected)):
        assert a == b, f"{name}: document {i} {docs[i][:40]!r}: crucible {a[:20]} hf {b[:20]}"
    assert len(ours) == len(expected)
