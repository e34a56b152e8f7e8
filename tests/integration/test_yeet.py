"""crucible yeet on the local Slurm cluster (n1..n4 on this machine, the fixture of
test_launch_slurm.py): every node gets an identical tree under its own folder (/…/node-%N), a
re-run moves only what changed, a node that fails its first try is retried, one that always fails
is left out under --min-success-fraction and named in the failed-hosts file (which crucible launch
takes), the sbcast transport gives the same trees, an unsafe archive is refused, and `crucible launch --yeet` runs crucible train from the
node-local copies."""
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from test_launch_slurm import CRUCIBLE, cluster  # noqa: F401 (the module-scoped Slurm cluster)

NODES = ["n1", "n2", "n3", "n4"]


def tree_hashes(root):
    root = Path(root)
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def yeet(env, tmp_path, *args, nodes=4, extra_env=None, timeout=120):
    return subprocess.run(["salloc", "-N", str(nodes), "--time=5", CRUCIBLE, "yeet",
                           "--work-dir", str(tmp_path / "work"), "--backoff", "0.1", *map(str, args)],
                          env=dict(env, CRUCIBLE_MPI="openmpi", **(extra_env or {})),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def sources(tmp_path):
    data = tmp_path / "src" / "data"
    (data / "sub").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for k in range(3):
        (data / f"shard-{k}.bin").write_bytes(rng.bytes(300_000 + k))
    (data / "sub" / "notes.txt").write_text("hello\n")
    (data / "empty").write_bytes(b"")
    tok = tmp_path / "src" / "tok.json"
    tok.write_text('{"vocab": 256}')
    env_tar = tmp_path / "src" / "env.tar.gz"
    with tarfile.open(env_tar, "w:gz") as tar:
        payload = b"print('hi')\n"
        info = tarfile.TarInfo("bin/tool.py")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    return [data, tok, env_tar]


def test_every_node_gets_an_identical_tree_and_a_rerun_sends_only_the_change(cluster, tmp_path, sources):
    folder, env = cluster
    dest = tmp_path / "stage" / "node-%N"
    summary = tmp_path / "summary.json"
    proc = yeet(env, tmp_path, *sources, "--to", dest, "--summary", summary)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expected = {**{f"data/{k}": v for k, v in tree_hashes(sources[0]).items()},
                "tok.json": tree_hashes(sources[1].parent)["tok.json"],
                "env.tar.gz": tree_hashes(sources[2].parent)["env.tar.gz"],
                "env/bin/tool.py": hashlib.sha256(b"print('hi')\n").hexdigest()}
    for node in NODES:
        assert tree_hashes(tmp_path / "stage" / f"node-{node}") == expected, node
    assert not list((tmp_path / "stage").glob("*.partial-*"))
    first = json.loads(summary.read_text())
    source_bytes = sum(p.stat().st_size for s in sources for p in ([s] if s.is_file() else s.rglob("*"))
                       if p.is_file())
    assert first["bytes_sent"] == source_bytes and first["files_sent"] == 7
    assert sorted(first["nodes_ok"]) == NODES and first["nodes_failed"] == []
    assert [p["name"] for p in first["phases"]] == ["launch", "scan", "read", "broadcast", "verify", "unpack",
                                                    "rename"]
    assert first["transport"] == "mpi"
    assert "phase=broadcast" in proc.stderr and "nodes_done=4/4" in proc.stderr

    changed = sources[0] / "shard-1.bin"
    changed.write_bytes(b"changed" + changed.read_bytes()[7:])
    proc = yeet(env, tmp_path, *sources, "--to", dest, "--summary", summary)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    second = json.loads(summary.read_text())
    assert second["bytes_sent"] == changed.stat().st_size and second["files_sent"] == 1
    expected["data/shard-1.bin"] = hashlib.sha256(changed.read_bytes()).hexdigest()
    for node in NODES:
        assert tree_hashes(tmp_path / "stage" / f"node-{node}") == expected, node


def test_the_sbcast_transport_stages_identical_trees_and_resends_only_the_change(cluster, tmp_path, sources):
    """The same manifests, verification and rename as the MPI transport, with the bytes sent by
    Slurm's sbcast: one file, the needed files back to back, landed beside DIR on every node (on
    this cluster one shared path, named after the job) and removed once every node has read it."""
    folder, env = cluster
    dest = tmp_path / "stage" / "node-%N"
    summary = tmp_path / "summary.json"
    proc = yeet(env, tmp_path, *sources, "--to", dest, "--transport", "sbcast", "--summary", summary)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first = json.loads(summary.read_text())
    assert first["transport"] == "sbcast" and sorted(first["nodes_ok"]) == NODES
    assert first["files_sent"] == 7
    trees = [tree_hashes(tmp_path / "stage" / f"node-{node}") for node in NODES]
    assert trees[0]["data/shard-2.bin"] == hashlib.sha256((sources[0] / "shard-2.bin").read_bytes()).hexdigest()
    assert "env/bin/tool.py" in trees[0] and all(tree == trees[0] for tree in trees)
    assert sorted(p.name for p in (tmp_path / "stage").iterdir()) == [f"node-{n}" for n in NODES]

    changed = sources[0] / "shard-0.bin"
    changed.write_bytes(changed.read_bytes()[:-5] + b"tail!")
    proc = yeet(env, tmp_path, *sources, "--to", dest, "--transport", "sbcast", "--summary", summary)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    second = json.loads(summary.read_text())
    assert second["bytes_sent"] == changed.stat().st_size and second["files_sent"] == 1
    for node in NODES:
        tree = tree_hashes(tmp_path / "stage" / f"node-{node}")
        assert tree["data/shard-0.bin"] == hashlib.sha256(changed.read_bytes()).hexdigest(), node
        assert {k: v for k, v in tree.items() if k != "data/shard-0.bin"} == \
            {k: v for k, v in trees[0].items() if k != "data/shard-0.bin"}, node
    assert sorted(p.name for p in (tmp_path / "stage").iterdir()) == [f"node-{n}" for n in NODES]

    # Outside Slurm the option is a usage error naming it.
    proc = subprocess.run([CRUCIBLE, "yeet", str(sources[1]), "--to", str(tmp_path / "x"), "--transport", "sbcast",
                           "--work-dir", str(tmp_path / "work")], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in env.items() if not k.startswith("SLURM_JOB")})
    assert proc.returncode == 2 and "--transport sbcast" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_failing_node_is_retried_and_one_that_always_fails_is_excluded(cluster, tmp_path, sources):
    folder, env = cluster
    failed = tmp_path / "failed_hosts.txt"
    summary = tmp_path / "summary.json"
    proc = yeet(env, tmp_path, *sources, "--to", tmp_path / "stage" / "node-%N", "--retries", "1",
                "--min-success-fraction", "0.75", "--failed-hosts", failed, "--summary", summary,
                extra_env={"CRUCIBLE_YEET_FAIL": "n2:1,n3:always"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(summary.read_text())
    assert sorted(result["nodes_ok"]) == ["n1", "n2", "n4"] and result["nodes_failed"] == ["n3"]
    assert "phase=retry node=n2 try=2 exit=0 result=ok" in proc.stderr
    assert failed.read_text() == "n3\n"
    assert (tmp_path / "stage" / "node-n2" / "tok.json").exists()
    assert not (tmp_path / "stage" / "node-n3").exists()
    # Without the floor lowered, the same failure is exit 1.
    proc = yeet(env, tmp_path, sources[1], "--to", tmp_path / "again" / "node-%N", "--retries", "0",
                "--failed-hosts", failed, extra_env={"CRUCIBLE_YEET_FAIL": "n3:always"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert failed.read_text() == "n3\n" and "below the floor" in proc.stderr
    # crucible launch leaves the failed hosts out.
    proc = subprocess.run(["salloc", "-N", "4", "--time=5", CRUCIBLE, "launch", "--exclude-file", str(failed),
                           "--dry-run", "--", "true"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "active:      n1,n2,n4" in proc.stdout


def test_a_tar_slip_archive_is_refused_before_any_node_is_touched(tmp_path):
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as tar:
        info = tarfile.TarInfo("../escaped.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    proc = subprocess.run([CRUCIBLE, "yeet", str(bad), "--to", str(tmp_path / "stage"), "--work-dir",
                           str(tmp_path / "work")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 65, proc.stderr
    assert "../escaped.txt" in proc.stderr
    assert not (tmp_path / "stage").exists() and not (tmp_path / "escaped.txt").exists()


def test_launch_yeet_runs_train_from_the_node_local_copies(cluster, tmp_path):
    """Two ranks on n1 and n2 each open their own node's copy (%N expanded at rank start); then
    crucible train as 2 MPI ranks on n1 and n2 reads its data from there: on this
    shared-filesystem cluster the node-local paths differ by node name, which the trainer's
    config check takes as the one pattern (DIR with %N) it came from."""
    folder, env = cluster
    data = tmp_path / "shared" / "data"
    data.mkdir(parents=True)
    np.random.default_rng(1).integers(0, 250, 4000, dtype=np.uint16).tofile(data / "tokens.bin")
    env = dict(env, CRUCIBLE_MPI="openmpi", OMP_NUM_THREADS="1")
    local = tmp_path / "local" / "node-%N"
    opener = "import os, sys; print('opened', os.path.realpath(sys.argv[1]), len(open(sys.argv[1], 'rb').read()))"
    proc = subprocess.run(
        ["salloc", "-N", "2", "--time=5", CRUCIBLE, "launch", "--run-dir", str(tmp_path / "probe"),
         "--mpi", "none", "--yeet", str(data), "--to", str(local), "--",
         sys.executable, "-c", opener, f"{data}/tokens.bin"],
        env=dict(env, CRUCIBLE_MPI="none"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for node in ["n1", "n2"]:
        assert f"opened {tmp_path}/local/node-{node}/data/tokens.bin 8000" in proc.stdout, proc.stdout
        assert (tmp_path / "local" / f"node-{node}" / "data" / "tokens.bin").read_bytes() == \
            (data / "tokens.bin").read_bytes()

    run_dir = tmp_path / "run"
    proc = subprocess.run(
        ["salloc", "-N", "2", "--time=5", CRUCIBLE, "launch", "--run-dir", str(run_dir),
         "--yeet", str(data), "--to", str(local), "--",
         CRUCIBLE, "train", "--set", "model.flavor=debug", "--set", "training.seq_len=16",
         "--set", "training.local_batch_size=2", "--set", "training.steps=2",
         "--set", "metrics.peak_gflops=100", "--set", "training.dataset=tokens",
         "--set", f"training.dataset_path={data}/tokens.bin", "--set", f"job.dump_folder={run_dir}"],
        env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = [json.loads(l) for l in (run_dir / "launch" / "attempts.jsonl").read_text().splitlines()][-1]
    assert f"training.dataset_path={local}/data/tokens.bin" in record["argv"]
    assert str(data) not in " ".join(record["argv"])
    assert "ranks=2" in proc.stdout, proc.stdout
    # Rank 0 (on n1) writes the config it trained with: its own node's copy.
    config = (run_dir / "config.toml").read_text()
    assert f"{tmp_path}/local/node-n1/data/tokens.bin" in config, config
