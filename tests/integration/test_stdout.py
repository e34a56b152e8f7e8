"""Every command that writes to stdout, with stdout on a full disk (/dev/full): exit 74 and a
one-line error, never exit 0 with the output lost."""
import json
import os
import subprocess

import numpy as np
import pytest
from safetensors.numpy import save_file

from conftest import REPO, crucible_binary
from eval_model import ENV, small_task, train_model

FULL_DISK_ERROR = "crucible: error: cannot write to stdout: No space left on device"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("stdout")
    run, hf, tokenizer = train_model(root, steps=4)
    return {"root": root, "run": run, "tokenizer": tokenizer, "corpus": root / "corpus.jsonl",
            "shard": root / "shards" / "tasks", "blend": root / "blend.txt"}


def train_settings(t, run_dir, steps=2):
    items = ["model.flavor=debug", "model.vocab_size=512", f"model.tokenizer_path={t['tokenizer']}",
             "training.dataset=blend", f"training.dataset_path={t['blend']}",
             "training.seq_len=32", "training.local_batch_size=2", f"training.steps={steps}",
             f"checkpoint.interval={steps}", "metrics.peak_gflops=100", f"job.dump_folder={run_dir}"]
    return sum((["--set", s] for s in items), [])


def commands(t, tmp):
    """(name, argv) of every command that prints to stdout."""
    tok, corpus, shard, blend = (str(t[k]) for k in ("tokenizer", "corpus", "shard", "blend"))
    ids = tmp / "ids.txt"
    ids.write_text("1 2 3\n4 5\n")
    small = tmp / "small.txt"
    small.write_text("one short line\n")
    ids_bin = tmp / "ids.bin"
    np.array([1, 2, 3], dtype=np.uint32).tofile(ids_bin)
    copy = tmp / "copy"
    for ext in (".bin", ".idx"):
        (tmp / ("copy" + ext)).write_bytes((t["shard"].parent / ("tasks" + ext)).read_bytes())
    batch = tmp / "batch.safetensors"
    save_file({"tokens": np.ones((1, 8), np.int32), "targets": np.ones((1, 8), np.int32)},
              str(batch))
    weights = tmp / "init.safetensors"
    subprocess.run([crucible_binary(), "model", "init", "--set", "model.flavor=debug", "--set",
                    "model.vocab_size=512", "--out", str(weights)], check=True, capture_output=True)
    task = small_task("kjv_next_verse", tmp / "task.jsonl", 3)
    samples = ["--list", blend, "--seq-len", "32", "--samples", "8"]
    return [
        ("help", ["--help"]),
        ("version", ["--version"]),
        ("config keys", ["config", "keys"]),
        ("tokenizer train", ["tokenizer", "train", corpus, "-o", str(tmp / "t.json"),
                             "--vocab-size", "300"]),
        ("tokenizer encode", ["tokenizer", "encode", "-t", tok, corpus]),
        ("tokenizer encode (small)", ["tokenizer", "encode", "-t", tok, str(small)]),
        ("tokenizer encode --pieces", ["tokenizer", "encode", "-t", tok, corpus, "--pieces"]),
        ("tokenizer decode", ["tokenizer", "decode", "-t", tok, str(ids)]),
        ("tokenizer decode --in-bin", ["tokenizer", "decode", "-t", tok, "--in-bin", str(ids_bin)]),
        ("tokenizer info", ["tokenizer", "info", tok]),
        ("data prepare", ["data", "prepare", "-q", "-t", tok, "-o", str(tmp / "p"), corpus]),
        ("data blend", ["data", "blend", "-q", *samples, "--cache-dir", str(tmp / "cache1")]),
        ("data verify", ["data", "verify", shard]),
        ("data inspect", ["data", "inspect", "-q", *samples, "--cache-dir", str(tmp / "cache2")]),
        ("data dump", ["data", "dump", shard]),
        ("data manifest", ["data", "manifest", "-t", tok, str(copy)]),
        ("model info", ["model", "info", "--set", "model.flavor=debug"]),
        ("model grads", ["model", "grads", "--set", "model.flavor=debug", "--set",
                         "model.vocab_size=512", "--weights", str(weights), "--batch", str(batch),
                         "--out", str(tmp / "grads.safetensors")]),
        ("train --print-config", ["train", "--print-config", *train_settings(t, tmp / "r0")]),
        ("train", ["train", *train_settings(t, tmp / "r1")]),
        ("eval", ["eval", str(t["run"]), "--tasks", str(task)]),
        ("export hf", ["export", "hf", str(t["run"]), str(tmp / "hf")]),
        ("export gguf", ["export", "gguf", str(t["run"]), str(tmp / "model.gguf")]),
        ("generate", ["generate", str(t["run"]), "--prompt", "In the beginning", "--max-new-tokens", "4"]),
        ("generate --json", ["generate", str(t["run"]), "--prompt", "the", "--max-new-tokens", "2", "--json"]),
        ("report", ["report", str(t["run"]), "-o", str(tmp / "report.html")]),
        ("top --once", ["top", str(t["run"]), "--once"]),
        ("smoke", ["smoke", "--golden", str(REPO / "tests" / "golden" / "smoke.json")]),
        ("launch --dry-run", ["launch", "--run-dir", str(tmp / "l0"), "--np", "1", "--dry-run",
                              "--", "true"]),
        # The job's output, relayed by the launcher (it keeps the job running meanwhile).
        ("launch", ["launch", "--run-dir", str(tmp / "l1"), "--np", "1", "--mpi", "none", "--",
                    "echo", "hello"]),
    ]


def test_every_command_that_prints_exits_74_when_stdout_is_full(trained, tmp_path):
    failures = []
    for name, argv in commands(trained, tmp_path):
        with open("/dev/full", "w") as full:
            proc = subprocess.run([crucible_binary(), *argv], stdout=full, stderr=subprocess.PIPE,
                                  text=True, env=dict(os.environ, **ENV), timeout=300)
        last = proc.stderr.strip().split("\n")[-1]
        if proc.returncode != 74 or last != FULL_DISK_ERROR:
            failures.append(f"{name}: exit {proc.returncode}, last stderr line {last!r}")
    assert not failures, "\n".join(failures)


def test_output_to_a_working_stdout_still_exits_0(trained, tmp_path):
    # The same check does not fire on a good stdout (a pipe here), for a command that prints a
    # lot and one that prints one line.
    proc = subprocess.run([crucible_binary(), "data", "dump", str(trained["shard"])],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.count("\n") > 10
    proc = subprocess.run([crucible_binary(), "tokenizer", "info", str(trained["tokenizer"])],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "vocab_size=512" in proc.stdout
