"""Tokenizer throughput: `crucible tokenizer encode` against Hugging Face `tokenizers`
encode_batch, on the same text, the same tokenizer.json and the same thread count.

The corpus is built by bench/tokenizer_corpus.py from text every Debian machine has (licenses,
copyright files, changelogs and READMEs under /usr/share/doc, Python's standard library), as
jsonl documents of about 4 KB. The tokenizer is trained by crucible on that corpus (Llama-3
pre-tokenization unless --pretokenizer gpt2). Both sides must produce the same ids (checked).

Figures printed: MB/s of text (UTF-8 bytes) for each side and their ratio, and the CPU seconds
(all threads) per MB, which a busy machine disturbs less than wall time. Crucible is timed as
the whole process (reading and parsing the jsonl, encoding, writing the ids), Hugging Face as
encode_batch alone on strings already in memory, so the ratio is conservative.

  .venv/bin/python bench/tokenizer_vs_hf.py [--mb 30] [--threads 2] [--pretokenizer llama3]
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_corpus  # noqa: E402

HF_SCRIPT = r"""
import json, sys, time
import numpy as np
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
docs = [json.loads(line)["text"] for line in open(sys.argv[2], encoding="utf-8")]
best, cpu = None, None
for _ in range(int(sys.argv[4])):
    start, start_cpu = time.perf_counter(), time.process_time()
    encodings = tok.encode_batch(docs, add_special_tokens=False)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
    if best is None or seconds < best:
        best, cpu = seconds, cpu_seconds
ids = np.concatenate([np.asarray(e.ids, dtype=np.uint32) for e in encodings])
ids.tofile(sys.argv[3])
print(json.dumps({"seconds": best, "cpu_seconds": cpu, "tokens": int(ids.size)}))
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--crucible", default=os.environ.get("CRUCIBLE", "build/crucible"))
    parser.add_argument("--mb", type=float, default=30, help="corpus size in MB")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--pretokenizer", default="llama3", choices=["llama3", "gpt2"])
    parser.add_argument("--repeat", type=int, default=2, help="best of N runs for each side")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()

    work = args.workdir or tempfile.mkdtemp(prefix="crucible-tokenizer-bench-")
    os.makedirs(work, exist_ok=True)
    corpus = os.path.join(work, "corpus.jsonl")
    documents = 0
    with open(corpus, "w", encoding="utf-8") as f:
        for doc in tokenizer_corpus.documents(int(args.mb * 1e6)):
            f.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
            documents += 1
    text_bytes = sum(len(json.loads(line)["text"].encode("utf-8"))
                     for line in open(corpus, encoding="utf-8"))

    tokenizer = os.path.join(work, "tokenizer.json")
    start = time.perf_counter()
    subprocess.run([args.crucible, "tokenizer", "train", corpus, "-o", tokenizer,
                    "--vocab-size", str(args.vocab_size), "--pretokenizer", args.pretokenizer,
                    "--threads", str(args.threads)], check=True, stdout=subprocess.DEVNULL)
    train_seconds = time.perf_counter() - start

    ours_bin = os.path.join(work, "crucible.bin")
    best, best_cpu = None, None
    for _ in range(args.repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run([args.crucible, "tokenizer", "encode", "-t", tokenizer, corpus,
                        "--out-bin", ours_bin, "--threads", str(args.threads)], check=True,
                       stderr=subprocess.DEVNULL)
        seconds = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if best is None or seconds < best:
            best, best_cpu = seconds, cpu
    crucible_seconds, crucible_cpu = best, best_cpu

    hf_bin = os.path.join(work, "hf.bin")
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="true")
    out = subprocess.run([sys.executable, "-c", HF_SCRIPT, tokenizer, corpus, hf_bin,
                          str(args.repeat)], check=True, env=env, capture_output=True, text=True)
    hf = json.loads(out.stdout.strip().split("\n")[-1])

    with open(ours_bin, "rb") as a, open(hf_bin, "rb") as b:
        same = a.read() == b.read()
    mb = text_bytes / 1e6
    crucible_rate, hf_rate = mb / crucible_seconds, mb / hf["seconds"]
    print(f"corpus: {documents} documents, {mb:.1f} MB (bench/tokenizer_corpus.py), "
          f"tokenizer: {args.pretokenizer} vocab {args.vocab_size} "
          f"(crucible train: {train_seconds:.1f} s), threads={args.threads}")
    print(f"tokens={hf['tokens']} identical_ids={same}")
    print(f"hf_tokenizers_MB/s={hf_rate:.1f} crucible_MB/s={crucible_rate:.1f} "
          f"ratio={crucible_rate / hf_rate:.2f}")
    # CPU time (all threads) per MB: the same comparison, less sensitive to a busy machine.
    print(f"hf_tokenizers_cpu_s/MB={hf['cpu_seconds'] / mb:.3f} "
          f"crucible_cpu_s/MB={crucible_cpu / mb:.3f} "
          f"cpu_ratio={hf['cpu_seconds'] / crucible_cpu:.2f}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    if not same:
        sys.exit("crucible and Hugging Face produced different ids")


if __name__ == "__main__":
    main()
