"""A small trained model for the eval tests: a 512-id BPE tokenizer and the `debug` Llama trained
for a few seconds on text of the demo tasks (configs/tasks), exported to Hugging Face."""
import json
from pathlib import Path

from conftest import REPO, run_crucible

TASKS = REPO / "configs" / "tasks"
ENV = {"OMP_NUM_THREADS": "1"}  # 2 threads on a loaded 2-core machine spin-wait (10x slower)


def small_task(name, out, items):
    """The first `items` lines of configs/tasks/<name>.jsonl."""
    lines = (TASKS / f"{name}.jsonl").read_text().splitlines()[:items]
    out.write_text("\n".join(lines) + "\n")
    return out


def task_text(limit=None):
    """Every string of the demo tasks, one document per item."""
    documents = []
    for path in sorted(TASKS.glob("*.jsonl")):
        for line in path.read_text().splitlines()[:limit]:
            doc = json.loads(line)
            parts = [doc.get("context") or doc.get("ctx") or doc.get("question", "")]
            choices = doc.get("choices", doc.get("endings"))
            parts += choices["text"] if isinstance(choices, dict) else choices
            documents.append(" ".join(parts))
    return documents


STEPS = 60
_trained = {}


def trained_model(tmp_path_factory):
    """train_model once per pytest process, shared by the eval test modules."""
    if "model" not in _trained:
        _trained["model"] = train_model(tmp_path_factory.mktemp("eval_model"))
    return _trained["model"]


def train_model(root: Path, steps=STEPS):
    """Returns (run directory, HF export folder, tokenizer.json)."""
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in task_text()))
    tokenizer = root / "tokenizer.json"
    run_crucible("tokenizer", "train", "--vocab-size", 512, "-o", tokenizer, corpus, env=ENV)
    run_crucible("data", "prepare", "-q", "-t", tokenizer, "-o", root / "shards" / "tasks", corpus, env=ENV)
    (root / "blend.txt").write_text("1.0 shards/tasks tasks\n")
    run = root / "run"
    run_crucible("train", "--set", "model.flavor=debug", "--set", "model.vocab_size=512",
                 "--set", f"model.tokenizer_path={tokenizer}", "--set", "training.dataset=blend",
                 "--set", f"training.dataset_path={root / 'blend.txt'}", "--set", "training.seq_len=128",
                 "--set", "training.local_batch_size=8", "--set", f"training.steps={steps}",
                 "--set", "optimizer.lr=3e-3", "--set", "lr_scheduler.warmup_steps=10",
                 "--set", f"checkpoint.interval={steps}", "--set", "metrics.peak_gflops=100",
                 "--set", f"job.dump_folder={run}", env=ENV)
    hf = root / "hf"
    run_crucible("export", "hf", run, hf)
    return run, hf, tokenizer
