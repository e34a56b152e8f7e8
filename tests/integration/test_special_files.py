"""Special files (issue 26): every command that writes a file writes a character device or FIFO
through and never replaces it (a directory is refused, exit 2); every config-like read refuses a
FIFO, a device or a directory at once (exit 2, naming the file) and caps its size; a symlink loop
is said to be one; lr-find --apply refuses a missing folder and an existing file without
--overwrite. The device nodes are made here (mknod, as root), never the system's /dev."""
import json
import os
import resource
import stat
import subprocess
import threading

import pytest

from conftest import crucible_binary, run_crucible
from eval_model import small_task, task_text

ENV = {"OMP_NUM_THREADS": "1"}
NULL, ZERO, FULL = 3, 5, 7  # minor numbers of /dev/null, /dev/zero, /dev/full (major 1)


def char_device(path, minor):
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
    except PermissionError:
        pytest.skip("mknod needs root")
    return path


def is_char_device(path):
    return stat.S_ISCHR(os.lstat(path).st_mode)


def capped_memory():
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))  # a runaway read fails, not the host


def crucible(*args, timeout=300):
    return subprocess.run([crucible_binary(), *map(str, args)], capture_output=True, text=True,
                          env=dict(os.environ, **ENV), timeout=timeout, preexec_fn=capped_memory)


def error_lines(proc):
    return [line for line in proc.stderr.splitlines() if line.startswith("crucible: error:")]


class World:
    """A tokenizer, a shard, a blend, a 4-step debug run and its config, made once."""

    def __init__(self, root):
        self.root = root
        self.corpus = root / "corpus.jsonl"
        self.corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in task_text(20)))
        self.tokenizer = root / "tokenizer.json"
        run_crucible("tokenizer", "train", "--vocab-size", 300, "-o", self.tokenizer, self.corpus, env=ENV)
        run_crucible("data", "prepare", "-q", "-t", self.tokenizer, "-o", root / "shards" / "c", self.corpus,
                     env=ENV)
        self.blend = root / "blend.txt"
        self.blend.write_text("1.0 shards/c c\n")
        self.task = small_task("kjv_next_verse", root / "task.jsonl", 4)
        self.config = root / "run.toml"
        self.config.write_text(f"""[job]
dump_folder = "{root / 'run'}"
[model]
flavor = "debug"
vocab_size = 300
tokenizer_path = "{self.tokenizer}"
[training]
steps = 4
seq_len = 32
local_batch_size = 2
dataset = "blend"
dataset_path = "{self.blend}"
[checkpoint]
interval = 4
[metrics]
peak_gflops = 100
""")
        run_crucible("train", "--config", self.config, env=ENV)
        self.run = root / "run"
        self.count = 0

    def scratch(self, name):
        self.count += 1
        folder = self.root / f"{name}-{self.count}"
        folder.mkdir()
        return folder


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return World(tmp_path_factory.mktemp("special_files"))


# An LR sweep long enough for a suggestion (lr-find refuses one from under 12 points, or from a
# flat curve) on the world's debug model and text.
SWEEP = ["--min", "1e-4", "--max", "10", "--steps", 40]

# Each command that writes a file, with the file it writes at `target`.
WRITERS = {
    "tokenizer train -o": lambda w, t: ["tokenizer", "train", "--vocab-size", 300, "-o", t, w.corpus],
    "tokenizer encode -o": lambda w, t: ["tokenizer", "encode", "-t", w.tokenizer, "-o", t, w.corpus],
    "tokenizer decode -o": lambda w, t: ["tokenizer", "decode", "-t", w.tokenizer, "-o", t,
                                         w.root / "ids.txt"],
    "model init --out": lambda w, t: ["model", "init", "--set", "model.flavor=debug", "--set",
                                      "model.vocab_size=300", "--out", t],
    "eval --json": lambda w, t: ["eval", "-q", w.run, "--tasks", w.task, "--json", t],
    "eval --predictions": lambda w, t: ["eval", "-q", w.run, "--tasks", w.task, "--predictions", t],
    "lr-find --apply": lambda w, t: ["lr-find", "--config", w.config, *SWEEP, "--out",
                                     w.scratch("lr-find"), "--apply", t],
    "smoke --update --golden": lambda w, t: ["smoke", "--update", "--golden", t, "--work-dir",
                                             w.scratch("smoke")],
}


def writer_args(world, name, target):
    if name == "tokenizer decode -o" and not (world.root / "ids.txt").exists():
        ids = run_crucible("tokenizer", "encode", "-t", world.tokenizer, world.corpus, env=ENV).stdout
        (world.root / "ids.txt").write_text("\n".join(l for l in ids.splitlines() if l[:1].isdigit()) + "\n")
    return WRITERS[name](world, target)


@pytest.mark.parametrize("name", WRITERS)
def test_a_null_device_as_output_is_written_through_and_stays_a_device(world, name):
    target = char_device(world.scratch("null") / "null", NULL)
    proc = crucible(*writer_args(world, name, target))
    assert proc.returncode == 0, proc.stderr
    assert is_char_device(target), f"{name} replaced the device node with a regular file"
    assert sorted(os.listdir(target.parent)) == ["null"]  # no temporary left beside it


@pytest.mark.parametrize("name", ["tokenizer train -o", "model init --out", "eval --json", "lr-find --apply"])
def test_a_full_device_as_output_is_an_io_error_naming_it_and_stays_a_device(world, name):
    target = char_device(world.scratch("full") / "full", FULL)
    proc = crucible(*writer_args(world, name, target))
    assert proc.returncode == 74, proc.stderr
    errors = error_lines(proc)
    assert len(errors) == 1 and f"cannot write {target}: No space left on device" in errors[0], proc.stderr
    assert is_char_device(target)
    assert "status=applied" not in proc.stdout


@pytest.mark.parametrize("name", ["tokenizer train -o", "eval --json"])
def test_a_fifo_as_output_streams_the_file_to_its_reader_and_stays_a_fifo(world, name):
    target = world.scratch("fifo") / "fifo"
    os.mkfifo(target)
    received = []
    reader = threading.Thread(target=lambda: received.append(open(target).read()), daemon=True)
    reader.start()
    proc = crucible(*writer_args(world, name, target), timeout=120)
    reader.join(timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert received and json.loads(received[0])  # the whole file, through the pipe
    assert stat.S_ISFIFO(os.lstat(target).st_mode)


def test_a_dataset_prefix_whose_bin_is_a_device_writes_through_it_and_replaces_only_files(world):
    folder = world.scratch("prepare")
    char_device(folder / "c.bin", NULL)
    proc = crucible("data", "prepare", "-q", "-t", world.tokenizer, "-o", folder / "c", world.corpus)
    assert proc.returncode == 0, proc.stderr
    assert is_char_device(folder / "c.bin")
    assert (folder / "c.idx").is_file() and (folder / "c.manifest.json").is_file()


def test_a_run_directory_whose_config_toml_is_a_device_keeps_the_device(world):
    run = world.scratch("train-run")
    char_device(run / "config.toml", NULL)
    proc = crucible("train", "--config", world.config, "--set", f"job.dump_folder={run}")
    assert proc.returncode == 0, proc.stderr
    assert is_char_device(run / "config.toml")


@pytest.mark.parametrize("name", ["eval --json", "model init --out", "tokenizer train -o"])
def test_a_directory_as_output_is_refused_with_exit_2_naming_it(world, name):
    target = world.scratch("folder") / "out"
    target.mkdir()
    proc = crucible(*writer_args(world, name, target))
    assert proc.returncode == 2, proc.stderr
    errors = error_lines(proc)
    assert len(errors) == 1 and f"{target}: a directory" in errors[0], proc.stderr
    assert target.is_dir() and not list(target.iterdir())


def test_export_hf_onto_a_device_is_refused_and_the_device_stays(world):
    target = char_device(world.scratch("export") / "null", NULL)
    proc = crucible("export", "hf", world.run, target)
    assert proc.returncode == 2, proc.stderr
    assert f"{target}: exists and is not a folder" in proc.stderr
    assert is_char_device(target)


# Each command that reads a config-like input, with that input at `source`.
READERS = {
    "train --config": lambda w, s: ["train", "--config", s],
    "lr-find --config": lambda w, s: ["lr-find", "--config", s],
    "tokenizer info": lambda w, s: ["tokenizer", "info", s],
    "data blend --list": lambda w, s: ["data", "blend", "--list", s, "--seq-len", 32, "--samples", 10],
    "smoke --golden": lambda w, s: ["smoke", "--golden", s, "--work-dir", w.scratch("smoke")],
    "eval --tasks": lambda w, s: ["eval", "-q", w.run, "--tasks", s],
}


@pytest.mark.parametrize("kind", ["zero", "fifo", "folder"])
@pytest.mark.parametrize("name", READERS)
def test_a_special_file_as_input_is_refused_at_once_with_exit_2_naming_it(world, name, kind):
    folder = world.scratch("read")
    source = folder / "input"
    if kind == "zero":
        char_device(source, ZERO)
    elif kind == "fifo":
        os.mkfifo(source)  # no writer: a read would wait for ever
    else:
        source.mkdir()
    proc = crucible(*READERS[name](world, source), timeout=60)
    assert proc.returncode == 2, proc.stderr
    errors = error_lines(proc)
    assert len(errors) == 1 and str(source) in errors[0], proc.stderr
    what = {"zero": "a character device", "fifo": "a FIFO", "folder": "a directory"}[kind]
    assert what in errors[0] or "not a regular file" in errors[0], errors[0]
    assert "step=" not in proc.stdout


def test_a_config_larger_than_the_cap_is_refused_stating_the_cap(world):
    big = world.scratch("big") / "big.toml"
    with open(big, "wb") as f:
        f.truncate((64 << 20) + 1)  # sparse: 64 MiB + 1 byte
    proc = crucible("train", "--config", big, timeout=60)
    assert proc.returncode == 2, proc.stderr
    errors = error_lines(proc)
    assert len(errors) == 1 and f"{big}: larger than 64 MiB" in errors[0], proc.stderr


def test_a_symlink_loop_in_a_file_list_is_reported_as_a_loop(world):
    folder = world.scratch("loop")
    (folder / "shards").mkdir()
    os.symlink("loop.bin", folder / "shards" / "loop.bin")  # points at itself
    os.symlink(world.root / "shards" / "c.idx", folder / "shards" / "loop.idx")
    (folder / "blend.txt").write_text("1.0 shards/loop loop\n")
    proc = crucible("data", "blend", "--list", folder / "blend.txt", "--seq-len", 32, "--samples", 10)
    assert proc.returncode == 65, proc.stderr
    errors = error_lines(proc)
    assert len(errors) == 1 and "loop.bin: a symlink loop (ELOOP)" in errors[0], proc.stderr
    assert "no such file" not in errors[0]


def test_lr_find_apply_into_a_missing_folder_is_refused_before_the_sweep(world):
    folder = world.scratch("apply")
    target = folder / "missing" / "deeper" / "tuned.toml"
    proc = crucible("lr-find", "--config", world.config, *SWEEP, "--out", folder / "out", "--apply", target)
    assert proc.returncode == 2, proc.stderr
    errors = error_lines(proc)
    assert len(errors) == 1 and f"the folder {target.parent} does not exist" in errors[0], proc.stderr
    assert not (folder / "missing").exists()
    assert "step=" not in proc.stdout  # refused before the sweep


def test_lr_find_apply_over_an_existing_file_is_refused_unless_overwrite(world):
    folder = world.scratch("apply")
    target = folder / "tuned.toml"
    target.write_text("# mine\n")
    proc = crucible("lr-find", "--config", world.config, *SWEEP, "--out", folder / "out", "--apply", target)
    assert proc.returncode == 2, proc.stderr
    errors = error_lines(proc)
    assert len(errors) == 1 and f"--apply {target}: exists; give --overwrite" in errors[0], proc.stderr
    assert target.read_text() == "# mine\n" and "step=" not in proc.stdout

    proc = crucible("lr-find", "--config", world.config, *SWEEP, "--out", folder / "out2", "--apply", target,
                    "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert f"status=applied path={target}" in proc.stdout
    assert "optimizer" in target.read_text()
