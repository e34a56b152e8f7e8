#!/usr/bin/env python3
"""Generation throughput on the CPU: `crucible generate` against llama.cpp (F32 and F16 GGUF, through
llama-cpp-python) and transformers `generate`, on the same exported models, prompts and threads.

    python3 bench/generate_vs_peers.py [--flavors small,base] [--quick] [--threads N]
        [--prompt-tokens 128] [--new-tokens 64] [--batch 8] [--repeats 1] [--no-profile]
        [--json OUT.json]

Models. Each Llama flavor (src/model/llama_config.cc, bench/llama_flavors.py) gets weights from
`crucible model init` (random: the speed of a product does not depend on its values), a run folder
around them (config.toml with the flavor, a 1024-id byte-level BPE tokenizer trained by `crucible
tokenizer train` on the repository's docs, training.seq_len 256), and its exports: `crucible export
hf` (what crucible and transformers load) and `crucible export gguf --dtype f32|f16` (what llama.cpp
loads); all cached under ~/.cache/crucible-bench/generate/<flavor>-v1 (delete it to rebuild). The
model's vocabulary keeps the flavor's size (ids past the tokenizer's 1024 are padding), so the
head costs what the flavor's head costs.

Prompts. --batch prompts (different text: consecutive slices of the docs), each exactly
--prompt-tokens ids under the model's tokenizer: cut from `crucible tokenizer encode`, decoded
with `crucible tokenizer decode` and checked to re-encode to the same ids. Every side gets the same
ids (crucible the text, the peers the ids); batch 1 uses the first prompt.

What is timed, per (side, batch B in {1, --batch}): P = --prompt-tokens, D = --new-tokens, greedy,
EOS ignored, the model loaded before the clock starts.
- crucible: `crucible generate HF --prompts F --ignore-eos --batch-size B --max-length 256`; its
  `phase=generate ... seconds=` covers prefill and decode together (the CLI does not report them
  apart), so it runs with --max-new-tokens 1 (the prefills of the B prompts and the first token;
  three runs, t1 their median) and once with 1 + D (t); prefill tokens/s = B*P / t1, decode
  tokens/s = B*D / (t - t1) (a warning when t - t1 is under a fifth of t: then noise decides).
- llama.cpp: llama-cpp-python's low-level binding of llama.cpp's C API (llama_decode on a
  llama_batch), the way llama.cpp's own batched examples and server run several sequences: one
  context with n_seq_max = B, n_threads = n_threads_batch = --threads; prefill = one llama_decode
  of the B x P prompt tokens (sequence ids 0..B-1, logits at each last position; n_batch = B*P,
  n_ubatch 512), then D steps of one llama_decode of B tokens, one per sequence, greedy by numpy
  argmax over llama_get_logits_ith. Timed in the process around those calls, after one warm-up
  (prefill + 4 steps) whose cache is cleared. llama-cpp-python's high-level Llama class decodes
  one sequence at a time and has no batch of sequences; this is the batching llama.cpp itself has.
- transformers: AutoModelForCausalLM (float32, attn_implementation="sdpa"), torch.set_num_threads,
  `generate(do_sample=False, min_new_tokens=max_new_tokens)` on a (B, P) batch (equal lengths, no
  padding) after a warm-up call; t1 and t as for crucible, from the wall clock around generate.

Then: the ratios crucible / llama.cpp F32, / llama.cpp F16, / transformers, and the issue's targets
(decode at batch 1 >= 1.0x llama.cpp at the same precision, F32; >= 5x transformers). The memory
bandwidth each side's batch-1 decode reached: bytes a decoded token must read at least (every
weight matrix once, at its precision, one embedding row, the KV cache at the mean length;
llama.cpp's cache is F16) x tokens/s, against a measured ceiling: a small C program (built here
with gcc -O3 -march=native -fopenmp, --threads threads) that reads (sum) and triads 3 arrays of
256 MiB, best of 5. And where crucible's decode time goes: `crucible generate` has no switch for
the kernel profile ([metrics] profile is the trainer's), so `perf record` (when perf is there and
allowed) samples a batch-1 run decoding 256 - P tokens; the flat self-time table by symbol is
grouped into kernels (that run includes the model load and one prefill; their symbols are
separate rows).

The 1-minute load average is printed before each run: on a machine shared with other jobs an
OpenMP program whose threads wait at a barrier for a descheduled thread slows down by far more
than its share, so read the numbers with the load.

--quick: the small flavor only, P = 64, D = 16: a smoke run of a couple of minutes.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from llama_flavors import FLAVORS

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "crucible-bench" / "generate"
CACHE_VERSION = "v1"
CRUCIBLE_DTYPE = {"crucible": "f32", "crucible-f16": "f16", "crucible-bf16": "bf16"}
MAX_LENGTH = 256
TOKENIZER_VOCAB = 1024

# ---------------------------------------------------------------------------------------------
# The peers: this file is also their entry point (`python generate_vs_peers.py peer-llama JOB`),
# run by the peer's own interpreter; only the standard library is imported above.

def peer_llama(job):
    import numpy as np
    import llama_cpp as L

    prompts, B, P, D, T = job["prompts"], job["batch"], job["prompt_tokens"], job["new_tokens"], job["threads"]
    L.llama_backend_init()
    quiet = L.llama_log_callback(lambda level, text, data: None)  # kept alive: llama.cpp holds it
    L.llama_log_set(quiet, None)
    mparams = L.llama_model_default_params()
    model = L.llama_model_load_from_file(job["gguf"].encode(), mparams)
    if not model:
        sys.exit(f"peer-llama: llama.cpp could not load {job['gguf']}")
    cparams = L.llama_context_default_params()
    cparams.n_ctx = B * MAX_LENGTH
    cparams.n_batch = B * P
    cparams.n_ubatch = min(512, B * P)
    cparams.n_seq_max = B
    cparams.n_threads = T
    cparams.n_threads_batch = T
    ctx = L.llama_init_from_model(model, cparams)
    if not ctx:
        sys.exit("peer-llama: llama_init_from_model failed")
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    batch = L.llama_batch_init(B * P, 0, B)

    def decode(entries):  # entries: (token, position, sequence, wants logits)
        batch.n_tokens = len(entries)
        for i, (token, pos, seq, logits) in enumerate(entries):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, logits
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            sys.exit(f"peer-llama: llama_decode returned {rc}")

    def argmax(index):
        return int(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, index), shape=(n_vocab,)).argmax())

    def run(steps):
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        start = time.perf_counter()
        decode([(t, p, s, p == P - 1) for s in range(B) for p, t in enumerate(prompts[s][:P])])
        last = [argmax(s * P + P - 1) for s in range(B)]
        prefill = time.perf_counter() - start
        out = [[t] for t in last]
        start = time.perf_counter()
        for step in range(steps):
            decode([(last[s], P + step, s, True) for s in range(B)])
            last = [argmax(s) for s in range(B)]
            for s in range(B):
                out[s].append(last[s])
        return prefill, time.perf_counter() - start, out

    run(min(4, D))  # warm-up
    prefill, decode_s, out = run(D)
    L.llama_batch_free(batch)
    return {"prefill_s": prefill, "decode_s": decode_s, "tokens": out,
            "system_info": L.llama_print_system_info().decode(errors="replace")}


def peer_hf(job):
    import torch
    import transformers

    B, P, D, T = job["batch"], job["prompt_tokens"], job["new_tokens"], job["threads"]
    torch.set_num_threads(T)
    model = transformers.AutoModelForCausalLM.from_pretrained(job["hf"], dtype=torch.float32,
                                                              attn_implementation="sdpa").eval()
    ids = torch.tensor([p[:P] for p in job["prompts"][:B]], dtype=torch.long)
    mask = torch.ones_like(ids)

    def generate(new):
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new,
                                 min_new_tokens=new, pad_token_id=0)
        return time.perf_counter() - start, out[:, P:].tolist()

    generate(2)  # warm-up
    t1, _ = generate(1)
    t, out = generate(1 + D)
    return {"prefill_s": t1, "decode_s": t - t1, "tokens": out, "torch": torch.__version__,
            "transformers": transformers.__version__, "sdpa": model.config._attn_implementation}


# ---------------------------------------------------------------------------------------------
# The driver.

def crucible(args, *argv, env=None, check=True):
    proc = subprocess.run([args.crucible, *map(str, argv)], capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})))
    if check and proc.returncode != 0:
        sys.exit(f"generate_vs_peers: crucible {' '.join(map(str, argv[:2]))} exited {proc.returncode}:\n"
                 f"{proc.stderr[-2000:]}")
    return proc


def prepare_model(args, flavor):
    """The cached folder of `flavor`: tok.json, hf/, f32.gguf, f16.gguf."""
    folder = CACHE / f"{flavor}-{CACHE_VERSION}"
    if (folder / "done").exists():
        return folder
    print(f"phase=prepare flavor={flavor} folder={folder}", flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    corpus = folder / "corpus.txt"
    corpus.write_text("".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))))
    crucible(args, "tokenizer", "train", corpus, "-o", folder / "tok.json", "--vocab-size", TOKENIZER_VOCAB)
    run = folder / "run"
    run.mkdir()
    crucible(args, "model", "init", "--set", "model.name=llama", "--set", f"model.flavor={flavor}",
             "--out", run / "model.safetensors")
    (run / "config.toml").write_text(f"[model]\nname = 'llama'\nflavor = '{flavor}'\n"
                                     f"tokenizer_path = '{folder / 'tok.json'}'\n\n"
                                     f"[training]\nseq_len = {MAX_LENGTH}\n")
    crucible(args, "export", "hf", run, folder / "hf")
    for dtype in ["f32", "f16"]:
        crucible(args, "export", "gguf", run, folder / f"{dtype}.gguf", "--dtype", dtype, "--name", flavor)
    (run / "model.safetensors").unlink()  # hf/ holds the same weights
    config = json.loads((folder / "hf" / "config.json").read_text())
    f = FLAVORS[flavor]
    for key, value in [("hidden_size", f["dim"]), ("num_hidden_layers", f["layers"]),
                       ("num_attention_heads", f["heads"]), ("num_key_value_heads", f["kv"]),
                       ("vocab_size", f["vocab"]), ("intermediate_size", f["ffn"])]:
        if config[key] != value:
            sys.exit(f"generate_vs_peers: bench/llama_flavors.py's {flavor} has {key} = {value}, the export "
                     f"{config[key]}: make them agree")
    (folder / "done").write_text("")
    return folder


def make_prompts(args, folder, count, length):
    """`count` prompts of exactly `length` ids: (texts, ids)."""
    words = " ".join((folder / "corpus.txt").read_text().split()).split(" ")
    work = Path(tempfile.mkdtemp(prefix="gvp-prompts-"))
    try:
        texts, ids, start = [], [], 0
        while len(texts) < count:
            if start >= len(words):
                sys.exit("generate_vs_peers: the docs corpus is too short for the prompts asked for")
            chunk = " ".join(words[start:start + 4 * length])
            start += 4 * length
            (work / "in.jsonl").write_text(json.dumps({"prompt": chunk}) + "\n")
            encoded = crucible(args, "tokenizer", "encode", work / "in.jsonl", "-t", folder / "tok.json",
                               "--field", "prompt").stdout.split()
            if len(encoded) < length:
                continue
            cut = [int(t) for t in encoded[:length]]
            (work / "ids.txt").write_text(" ".join(map(str, cut)) + "\n")
            crucible(args, "tokenizer", "decode", work / "ids.txt", "-t", folder / "tok.json", "--jsonl",
                     "--field", "prompt", "-o", work / "text.jsonl")
            text = json.loads((work / "text.jsonl").read_text().splitlines()[0])["prompt"]
            again = crucible(args, "tokenizer", "encode", work / "text.jsonl", "-t", folder / "tok.json",
                             "--field", "prompt").stdout.split()
            if [int(t) for t in again] == cut:  # else the cut changed a merge: take the next slice
                texts.append(text)
                ids.append(cut)
        return texts, ids
    finally:
        shutil.rmtree(work)


def run_crucible(args, folder, texts, ids, B, dtype="f32"):
    P, D = args.prompt_tokens, args.new_tokens
    with tempfile.TemporaryDirectory(prefix="gvp-") as work:
        prompts = Path(work) / "prompts.jsonl"
        prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts[:B]))
        seconds, tokens = {}, None
        for new in [1, 1, 1, 1 + D]:  # t1: the median of 3 (the difference t - t1 is what decode is)
            proc = crucible(args, "generate", folder / "hf", "--prompts", prompts, "--ignore-eos", "--json",
                            "--batch-size", B, "--max-length", MAX_LENGTH, "--max-new-tokens", new, "--dtype", dtype,
                            env={"OMP_NUM_THREADS": str(args.threads)})
            line = next(l for l in proc.stderr.splitlines() if l.startswith("phase=generate "))
            seconds.setdefault(new, []).append(float(re.search(r"seconds=([0-9.]+)", line).group(1)))
            results = json.loads(proc.stdout)["results"]
            for r, want in zip(results, ids):
                if r["prompt_tokens"] != want or len(r["tokens"]) != new:
                    sys.exit(f"generate_vs_peers: crucible generate read prompt {r['index']} as "
                             f"{len(r['prompt_tokens'])} ids and made {len(r['tokens'])} tokens (expected "
                             f"{P} and {new})")
            tokens = [r["tokens"] for r in results]
    t1, t = statistics.median(seconds[1]), seconds[1 + D][0]
    if t - t1 < 0.2 * t:
        print(f"generate_vs_peers: warning: crucible's decode time is {t - t1:.3f} s of {t:.3f} s "
              f"(the prefill-only runs took {', '.join(f'{x:.3f}' for x in seconds[1])} s): the difference is "
              "within the machine's noise; raise --new-tokens or lower the load", flush=True)
    return {"prefill_s": t1, "decode_s": t - t1, "tokens": tokens, "t1_s": seconds[1], "t_s": t}


def run_peer(args, python, mode, job):
    with tempfile.TemporaryDirectory(prefix="gvp-") as work:
        (Path(work) / "job.json").write_text(json.dumps(job))
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
        proc = subprocess.run([python, __file__, mode, Path(work) / "job.json"], capture_output=True,
                              text=True, env=env)
        if proc.returncode != 0:
            sys.exit(f"generate_vs_peers: {mode} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])


def bytes_per_token(flavor, weight_bytes, kv_bytes, mean_length):
    """What one batch-1 decode step reads at least: every matrix once, one embedding row, the cache."""
    f = FLAVORS[flavor]
    C, F, V, L, H, KV = f["dim"], f["ffn"], f["vocab"], f["layers"], f["heads"], f["kv"]
    D = C // H
    matrices = L * (C * H * D + 2 * C * KV * D + H * D * C + 3 * C * F) + V * C
    norms = (2 * L + 1) * C * 4
    cache = L * 2 * KV * D * mean_length * kv_bytes
    return matrices * weight_bytes + C * weight_bytes + norms + cache


STREAM_C = r"""
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char** argv) {
  const long n = atol(argv[1]);
  float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float)), *c = malloc(n * sizeof(float));
#pragma omp parallel for schedule(static)
  for (long i = 0; i < n; ++i) { a[i] = 1.0f; b[i] = 2.0f; c[i] = 0.5f; }
  double best_read = 1e30, best_triad = 1e30, sink = 0;
  for (int r = 0; r < 5; ++r) {
    double t = omp_get_wtime();
    float sum = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : sum)
    for (long i = 0; i < n; ++i) sum += b[i];
    t = omp_get_wtime() - t; sink += sum;
    if (t < best_read) best_read = t;
    t = omp_get_wtime();
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; ++i) a[i] = b[i] + 3.0f * c[i];
    t = omp_get_wtime() - t;
    if (t < best_triad) best_triad = t;
  }
  printf("{\"read_gb_per_s\": %.2f, \"triad_gb_per_s\": %.2f, \"sink\": %g}\n",
         n * 4.0 / best_read / 1e9, n * 12.0 / best_triad / 1e9, sink + a[n / 2]);
  return 0;
}
"""


def stream_ceiling(args):
    exe = CACHE / "stream-triad"
    if not exe.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        source = CACHE / "stream-triad.c"
        source.write_text(STREAM_C)
        subprocess.run(["gcc", "-O3", "-march=native", "-fopenmp", source, "-o", exe], check=True)
    proc = subprocess.run([exe, str(64 << 20)], capture_output=True, text=True, check=True,
                          env=dict(os.environ, OMP_NUM_THREADS=str(args.threads), OMP_PROC_BIND="false"))
    return json.loads(proc.stdout)


KERNELS = [  # (kernel, regex on the symbol), first match wins
    ("matmul_rows (decode products)", r"matmul_rows"),
    ("decode_attention", r"decode_attention"),
    ("lane_dot/lane_sum (inlined helpers)", r"lane_(dot|sum|max)"),
    ("matmul_forward / sgemm (prefill products)", r"matmul_forward|sgemm|gemm|mkl|openblas|dnnl"),
    ("attention_forward (prefill)", r"attention_forward|flash"),
    ("rmsnorm", r"rmsnorm"),
    ("swiglu", r"swiglu"),
    ("rope", r"rope"),
    ("embedding", r"embedding"),
    ("sampling / engine", r"[Ss]ampl|Engine|softmax|Philox|argmax"),
    ("OpenMP runtime (spin/barrier/fork)", r"gomp|GOMP|omp_|kmp|__kmp"),
    ("tokenizer", r"[Tt]okeniz|Bpe|bpe"),
    ("load (safetensors, json, memcpy)", r"safetensors|json|memcpy|memmove|memset|ReadFile|read"),
    ("kernel (page faults, syscalls)", r"^\[k\]|\[kernel"),
]


def profile_decode(args, folder, texts):
    """perf record of a batch-1 crucible decode; (rows of (kernel, share %), top symbols) or None."""
    if not shutil.which("perf"):
        return None, "perf is not installed"
    with tempfile.TemporaryDirectory(prefix="gvp-perf-") as work:
        prompts = Path(work) / "p.jsonl"
        prompts.write_text(json.dumps({"prompt": texts[0]}) + "\n")
        data = Path(work) / "perf.data"
        new = MAX_LENGTH - args.prompt_tokens
        cmd = ["perf", "record", "-F", "499", "-o", data, "--", args.crucible, "generate", folder / "hf",
               "--prompts", prompts, "--ignore-eos", "--max-length", MAX_LENGTH, "--max-new-tokens", new]
        proc = subprocess.run(list(map(str, cmd)), capture_output=True, text=True,
                              env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
        if proc.returncode != 0:
            return None, f"perf record failed: {proc.stderr.strip().splitlines()[-1:]}"
        gen = next((l for l in proc.stderr.splitlines() if l.startswith("phase=generate ")), "")
        report = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--no-children", "--sort",
                                 "dso,symbol", "--percent-limit", "0.05"], capture_output=True, text=True)
    symbols = []
    for line in report.stdout.splitlines():
        m = re.match(r"\s*([0-9.]+)%\s+(\S+)\s+(\[[.k]\])\s+(.*)$", line)
        if m:
            symbol = re.sub(r"(\s+-)+\s*$", "", m.group(4)).strip()  # perf's empty extra columns
            symbols.append((float(m.group(1)), m.group(2), m.group(3), symbol))
    groups = {}
    for share, dso, kind, symbol in symbols:
        name = "kernel (page faults, syscalls)" if kind == "[k]" else \
            "OpenMP runtime (spin/barrier/fork)" if re.search(r"lib(g|i)?omp", dso) else \
            "oneDNN (prefill GEMM)" if "dnnl" in dso else next(
            (k for k, pattern in KERNELS if re.search(pattern, symbol)), f"other ({dso})")
        groups[name] = groups.get(name, 0.0) + share
    rows = sorted(groups.items(), key=lambda kv: -kv[1])
    return {"rows": rows, "top": symbols[:15], "new_tokens": new, "generate_line": gen}, None


def fmt(x):
    return f"{x:.1f}" if x is not None else "-"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flavors", default="small,base")
    parser.add_argument("--quick", action="store_true", help="small only, 64 prompt tokens, 16 new")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1, help="runs per measurement; the median is kept")
    parser.add_argument("--sides", default="crucible,crucible-f16,llama-f32,llama-f16,transformers",
                        help="crucible (f32 weights), crucible-f16, crucible-bf16 (generate --dtype), "
                             "llama-f32, llama-f16, transformers")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--crucible", default=os.environ.get("CRUCIBLE", str(ROOT / "build" / "crucible")))
    parser.add_argument("--llama-python", help="default: scripts/setup-llama-cpp.sh --find")
    parser.add_argument("--hf-python", help="default: the environment scripts/setup-current.sh builds")
    parser.add_argument("--json", help="also write every measurement here")
    args = parser.parse_args()
    if args.quick:
        args.flavors, args.prompt_tokens, args.new_tokens = "small", 64, 16
    if args.prompt_tokens + 1 + args.new_tokens > MAX_LENGTH:
        sys.exit(f"generate_vs_peers: --prompt-tokens + 1 + --new-tokens must fit the context of {MAX_LENGTH}")
    sides = args.sides.split(",")
    batches = [1] + ([args.batch] if args.batch > 1 else [])
    if any(s.startswith("llama") for s in sides) and not args.llama_python:
        proc = subprocess.run([ROOT / "scripts" / "setup-llama-cpp.sh", "--find"], capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit("generate_vs_peers: the llama.cpp venv is missing: run `make llama-env` "
                     "(scripts/setup-llama-cpp.sh), or leave llama-* out of --sides")
        args.llama_python = proc.stdout.strip().splitlines()[-1]
    if "transformers" in sides and not args.hf_python:
        args.hf_python = subprocess.run([ROOT / "scripts" / "setup-current.sh"], check=True, capture_output=True,
                                        text=True).stdout.strip().splitlines()[-1]
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"phase=start cpu=\"{cpu}\" cores={os.cpu_count()} threads={args.threads} prompt_tokens="
          f"{args.prompt_tokens} new_tokens={args.new_tokens} batches={','.join(map(str, batches))} "
          f"repeats={args.repeats} load={os.getloadavg()[0]:.2f}", flush=True)
    ceiling = stream_ceiling(args)
    print(f"phase=stream threads={args.threads} read_gb_per_s={ceiling['read_gb_per_s']} "
          f"triad_gb_per_s={ceiling['triad_gb_per_s']} (C, 3 x 256 MiB float arrays, best of 5)", flush=True)
    everything = {"cpu": cpu, "threads": args.threads, "stream": ceiling, "flavors": {}}
    for flavor in args.flavors.split(","):
        folder = prepare_model(args, flavor)
        texts, ids = make_prompts(args, folder, max(batches), args.prompt_tokens)
        results = {}  # (side, batch) -> {"prefill": tok/s, "decode": tok/s, "tokens": ..., "load": ...}
        for repeat in range(args.repeats):
            order = sides[repeat % len(sides):] + sides[:repeat % len(sides)]
            for B in batches:
                for side in order:
                    load = os.getloadavg()[0]
                    job = {"prompts": ids[:B], "batch": B, "prompt_tokens": args.prompt_tokens,
                           "new_tokens": args.new_tokens, "threads": args.threads}
                    if side.startswith("crucible"):
                        r = run_crucible(args, folder, texts, ids, B, CRUCIBLE_DTYPE[side])
                    elif side.startswith("llama-"):
                        r = run_peer(args, args.llama_python, "peer-llama",
                                     dict(job, gguf=str(folder / f"{side[len('llama-'):]}.gguf")))
                    else:
                        r = run_peer(args, args.hf_python, "peer-hf", dict(job, hf=str(folder / "hf")))
                    prefill = B * args.prompt_tokens / r["prefill_s"]
                    decode = B * args.new_tokens / r["decode_s"] if r["decode_s"] > 0 else None
                    entry = results.setdefault((side, B), {"prefill": [], "decode": [], "load": []})
                    entry["prefill"].append(prefill)
                    entry["decode"].append(decode)
                    entry["load"].append(load)
                    entry["tokens"] = r["tokens"]
                    entry["info"] = {k: v for k, v in r.items() if k not in ("tokens", "prefill_s", "decode_s")}
                    print(f"phase=run flavor={flavor} side={side} batch={B} repeat={repeat + 1}/{args.repeats} "
                          f"prefill_tok_s={prefill:.1f} decode_tok_s={fmt(decode)} load={load:.2f}", flush=True)
        report_flavor(args, flavor, sides, batches, results, ceiling, everything)
        if not args.no_profile:
            profile, why = profile_decode(args, folder, texts)
            if profile is None:
                print(f"\nprofile: skipped ({why})")
            else:
                print(f"\n### where crucible's batch-1 decode time goes ({flavor}; perf record -F 499 of "
                      f"`crucible generate` decoding {profile['new_tokens']} tokens after a {args.prompt_tokens}-"
                      f"token prompt; {profile['generate_line']})")
                print("| kernel | share of samples |\n|---|---|")
                for name, share in profile["rows"]:
                    print(f"| {name} | {share:.1f}% |")
                print("top symbols (self time):")
                for share, dso, kind, symbol in profile["top"]:
                    print(f"  {share:5.1f}%  {dso}  {kind} {symbol[:110]}")
                everything["flavors"][flavor]["profile"] = profile
    if args.json:
        Path(args.json).write_text(json.dumps(everything, indent=2))


def report_flavor(args, flavor, sides, batches, results, ceiling, everything):
    med = {key: {k: statistics.median([x for x in v[k] if x is not None]) if any(x is not None for x in v[k])
                 else None for k in ("prefill", "decode")} for key, v in results.items()}
    mean_length = args.prompt_tokens + args.new_tokens / 2
    precision = {"crucible": (4, 4), "crucible-f16": (2, 4), "crucible-bf16": (2, 4), "llama-f32": (4, 2),
                 "llama-f16": (2, 2), "transformers": (4, 4)}
    print(f"\n## {flavor} (threads {args.threads}; prompt {args.prompt_tokens} tokens, {args.new_tokens} new, "
          f"greedy; tokens/s, median of {args.repeats})")
    head = "| side | " + " | ".join(f"prefill b{B} | decode b{B}" for B in batches) + \
           " | b1 decode GB/s (% of read ceiling) | load |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for side in sides:
        cells = []
        for B in batches:
            m = med.get((side, B), {})
            cells += [fmt(m.get("prefill")), fmt(m.get("decode"))]
        b1 = med.get((side, 1), {}).get("decode")
        gbs = bytes_per_token(flavor, *precision[side], mean_length) * b1 / 1e9 if b1 else None
        loads = [l for B in batches for l in results.get((side, B), {}).get("load", [])]
        print(f"| {side} | " + " | ".join(cells) +
              (f" | {gbs:.1f} ({100 * gbs / ceiling['read_gb_per_s']:.0f}%)" if gbs else " | -") +
              f" | {min(loads):.2f}-{max(loads):.2f} |")
    print(f"bytes a batch-1 decode step reads at least: crucible/transformers (F32 weights, F32 cache) "
          f"{bytes_per_token(flavor, 4, 4, mean_length) / 2**20:.1f} MiB, llama.cpp F32 "
          f"{bytes_per_token(flavor, 4, 2, mean_length) / 2**20:.1f} MiB, F16 "
          f"{bytes_per_token(flavor, 2, 2, mean_length) / 2**20:.1f} MiB; measured ceiling: read "
          f"{ceiling['read_gb_per_s']} GB/s, triad {ceiling['triad_gb_per_s']} GB/s")
    ratios = {}
    ours = [s for s in sides if s.startswith("crucible")]
    for mine in ours:
        for peer in [s for s in sides if not s.startswith("crucible")]:
            parts = []
            for B in batches:
                for phase in ("prefill", "decode"):
                    c, p = med.get((mine, B), {}).get(phase), med.get((peer, B), {}).get(phase)
                    if c and p:
                        ratios[(mine, peer, B, phase)] = c / p
                        parts.append(f"{phase} b{B} {c / p:.2f}x")
            print(f"{mine} / {peer}: " + ", ".join(parts))
    # The targets: batch-1 decode at the same precision as llama.cpp (crucible's f32 and
    # f16 weights against its F32 and F16 files), and 5x transformers (fp32, its default).
    targets = [("crucible", "llama-f32", 1.0), ("crucible-f16", "llama-f16", 1.0),
               ("crucible", "transformers", 5.0), ("crucible-f16", "transformers", 5.0),
               ("crucible-bf16", "transformers", 5.0)]
    for mine, peer, want in targets:
        got = ratios.get((mine, peer, 1, "decode"))
        if got is not None:
            print(f"target decode b1 {mine} >= {want:.1f}x {peer}: {got:.2f}x -> "
                  f"{'HOLDS' if got >= want else 'MISSED'}")
    if "crucible" in sides:
        agree = []
        for peer in [s for s in sides if s != "crucible"]:
            a, b = results.get(("crucible", 1), {}).get("tokens"), results.get((peer, 1), {}).get("tokens")
            if a and b:
                n = next((i for i, (x, y) in enumerate(zip(a[0], b[0])) if x != y), min(len(a[0]), len(b[0])))
                agree.append(f"{peer} {n}/{len(a[0])}")
        if agree:
            print("greedy tokens equal to crucible's before the first difference (batch 1; random weights "
                  "make near-ties, so a difference is no error): " + ", ".join(agree))
    everything["flavors"][flavor] = {
        "medians": {f"{s}/b{B}": v for (s, B), v in med.items()},
        "runs": {f"{s}/b{B}": {k: v for k, v in r.items() if k != "tokens"} for (s, B), r in results.items()},
        "ratios": {f"{m}/{p}/b{B}/{ph}": v for (m, p, B, ph), v in ratios.items()}}


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("peer-llama", "peer-hf"):
        result = (peer_llama if sys.argv[1] == "peer-llama" else peer_hf)(json.loads(Path(sys.argv[2]).read_text()))
        print(json.dumps(result))
        sys.exit(0)
    sys.exit(main())
