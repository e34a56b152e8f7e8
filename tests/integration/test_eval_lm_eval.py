"""Cross-check of `crucible eval` against lm-evaluation-harness itself: a trained tiny model is
exported to Hugging Face, lm-eval (HF backend) scores our JSONL tasks through custom task YAMLs
(dataset_path: json), and crucible scores the same tasks on the same export. acc, acc_norm, their
standard errors and every item's prediction must be identical; per-choice log-likelihoods agree
within 1e-3 nats. The bits-per-byte of held-out text is computed by lm-eval's
loglikelihood_rolling (transformers' forward pass) and must agree within 1e-4 relative.

It runs twice (conftest.py, STACKS): "pinned" is lm-eval 0.4.3 with transformers 4.40.2 on
Debian's torch 1.13, in .venv/lm-eval (scripts/setup-lm-eval.sh, run by the fixture), given
dtype=float32 and the prefix token explicitly (that transformers has no bos_token without it in
tokenizer_config.json); "current" is lm-eval 0.4.13 with transformers 5 on torch 2.15
(scripts/setup-current.sh) with lm-eval's default model arguments (`pretrained=` alone: dtype
auto, the tokenizer's own BOS/EOS), as a user runs it. lm-eval runs only in a subprocess,
offline."""
import json
import re

import numpy as np
import pytest

from conftest import REPO, STACKS, python_env, run_crucible
from eval_model import ENV, small_task, trained_model

ITEMS = 32
LL_ATOL = 1e-3
BPB_RTOL = 1e-4

# One YAML per shape, as lm-eval's own tasks read such docs (the arc one is lm-eval's arc_easy).
YAMLS = {
    "kjv_next_verse": ("generic", 'doc_to_text: "{{context}}"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: "{{gold}}"'),
    "fortune_ending": ("hellaswag", 'doc_to_text: "{{ctx}}"\ndoc_to_choice: "{{endings}}"\ndoc_to_target: "{{label}}"'),
    "jargon_term": ("arc", 'doc_to_text: "Question: {{question}}\\nAnswer:"\ndoc_to_choice: "{{choices.text}}"\n'
                           'doc_to_target: "{{choices.label.index(answerKey)}}"'),
}

LM_EVAL = r"""
import json, sys
import lm_eval
from lm_eval.tasks import TaskManager
model_args, include, tasks, out = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4]
results = lm_eval.simple_evaluate(
    model="hf", model_args=model_args,
    tasks=tasks, batch_size=16, device="cpu", log_samples=True, task_manager=TaskManager(include_path=include))
samples = {t: [{"doc_id": s["doc_id"], "lls": [r[0] for r in s["filtered_resps"]],
                "acc": s.get("acc"), "acc_norm": s.get("acc_norm")} for s in results["samples"][t]]
           for t in tasks if t in results["samples"] and results["samples"][t] and "acc" in results["samples"][t][0]}
from importlib.metadata import version
versions = " ".join(f"{p} {version(p)}" for p in ("lm_eval", "transformers", "torch"))
json.dump({"results": results["results"], "samples": samples, "versions": versions}, open(out, "w"), default=float)
"""


@pytest.fixture(scope="module", params=STACKS)
def lm_eval_env(request):
    return python_env(request.param, "setup-lm-eval.sh", "lm-eval")


def run_lm_eval(lm_eval_env, hf, include, names, out, home):
    if lm_eval_env.stack == "pinned":
        bos = json.loads((hf / "config.json").read_text())["bos_token_id"]
        model_args = f"pretrained={hf},dtype=float32,prefix_token_id={bos}"
    else:
        model_args = f"pretrained={hf}"
    env = dict(HF_HOME=str(home), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_DATASETS_CACHE=str(home / "datasets"), TOKENIZERS_PARALLELISM="false")
    lm_eval_env.run(LM_EVAL, model_args, include, ",".join(names), out, env=env)
    return json.loads(out.read_text())


def test_crucible_eval_matches_lm_eval(tmp_path, tmp_path_factory, lm_eval_env):
    run, hf, tokenizer = trained_model(tmp_path_factory)
    include = tmp_path / "lm_eval_tasks"
    include.mkdir()
    tasks = []
    for name, (shape, fields) in YAMLS.items():
        data = small_task(name, tmp_path / f"{name}.jsonl", ITEMS)
        (include / f"{name}.yaml").write_text(
            f"task: crucible_{name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
            f"test_split: test\noutput_type: multiple_choice\n{fields}\n"
            "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
            "  - metric: acc_norm\n    aggregation: mean\n    higher_is_better: true\n")
        tasks.append((name, data))
    held = tmp_path / "held.jsonl"
    verses = [json.loads(line)["context"] for line in (REPO / "configs/tasks/kjv_next_verse.jsonl").read_text().splitlines()]
    # Verses the model saw in training: the check is agreement with lm-eval, not the model's quality.
    documents = [" ".join(verses[i:i + 6]) for i in range(200, 248, 6)]
    documents.append(" ".join(verses[:30]))  # longer than 128 tokens: several rolling windows
    held.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents))
    (include / "held.yaml").write_text(
        f"task: crucible_held\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {held}\n"
        'test_split: test\noutput_type: loglikelihood_rolling\ndoc_to_text: "{{text}}"\ndoc_to_target: "{{text}}"\n'
        "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n")

    names = [f"crucible_{n}" for n, _ in tasks] + ["crucible_held"]
    theirs = run_lm_eval(lm_eval_env, hf, include, names, tmp_path / "lm_eval.json", tmp_path / "hf_home")

    run_crucible("eval", hf, "--tasks", *[d for _, d in tasks], "--text", held, "--json", tmp_path / "ours.json",
                 "--predictions", tmp_path / "ours.jsonl", env=ENV)
    ours = json.loads((tmp_path / "ours.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "ours.jsonl").read_text().splitlines()]

    worst = 0.0
    for name, _ in tasks:
        summary, reference = ours["tasks"][name], theirs["results"][f"crucible_{name}"]
        mine = [r for r in rows if r["task"] == name]
        samples = sorted(theirs["samples"][f"crucible_{name}"], key=lambda s: s["doc_id"])
        assert len(samples) == len(mine) == ITEMS
        for row, sample in zip(mine, samples):
            lls = np.array(sample["lls"])
            worst = max(worst, float(np.abs(lls - np.array(row["loglikelihoods"])).max()))
            assert (row["acc"], row["acc_norm"]) == (sample["acc"], sample["acc_norm"]), (name, row, sample)
            assert row["pred"] == int(np.argmax(lls)), (name, row, sample)
        print(f"{lm_eval_env.stack} {name}: crucible acc={summary['acc']:.4f}±{summary['acc_stderr']:.4f} "
              f"acc_norm={summary['acc_norm']:.4f}±{summary['acc_norm_stderr']:.4f} | lm-eval "
              f"acc={reference['acc,none']:.4f}±{reference['acc_stderr,none']:.4f} "
              f"acc_norm={reference['acc_norm,none']:.4f}±{reference['acc_norm_stderr,none']:.4f}")
        assert summary["acc"] == pytest.approx(reference["acc,none"], abs=1e-12)
        assert summary["acc_norm"] == pytest.approx(reference["acc_norm,none"], abs=1e-12)
        assert summary["acc_stderr"] == pytest.approx(reference["acc_stderr,none"], abs=1e-9)
        assert summary["acc_norm_stderr"] == pytest.approx(reference["acc_norm_stderr,none"], abs=1e-9)
    print(f"{lm_eval_env.stack} ({theirs['versions']}): max |ll_crucible - ll_lm_eval| = {worst:.3g} nats")
    assert worst < LL_ATOL

    held_ours, held_theirs = ours["perplexity"]["held"], theirs["results"]["crucible_held"]
    print(f"bits_per_byte: crucible {held_ours['bits_per_byte']:.8f} lm-eval {held_theirs['bits_per_byte,none']:.8f}; "
          f"byte_perplexity {held_ours['byte_perplexity']:.8f} vs {held_theirs['byte_perplexity,none']:.8f}; "
          f"word_perplexity {held_ours['word_perplexity']:.6f} vs {held_theirs['word_perplexity,none']:.6f}")
    assert held_ours["windows"] > len(documents)
    assert held_ours["bits_per_byte"] == pytest.approx(held_theirs["bits_per_byte,none"], rel=BPB_RTOL)
    assert held_ours["byte_perplexity"] == pytest.approx(held_theirs["byte_perplexity,none"], rel=BPB_RTOL)
    assert held_ours["word_perplexity"] == pytest.approx(held_theirs["word_perplexity,none"], rel=BPB_RTOL)


# Text where Python's str differs from ASCII rules: capitalize() with full case mappings and the
# final sigma, strip()/rstrip() and re's \s with Unicode whitespace.
CTX_B_STARTS = ["\u00e9t\u00e9 ", "la \u00c9COLE ", "\u039f\u0394\u039f\u03a3 ", "\u00df ", "\ufb03 ", "\u01c6 ",
                "\u0130STANBUL ", "\u0149 ", "\u039f\u03a3'\u0391 ", "\u00c0 LA CAF\u00c9 ", "\u1f80 ", "\u03a3\u03a3 "]
SPACES = ["\u00a0", "\u3000", "\u2009", "\u0085", "\u2028", "\x1c", "\u202f", "\u1680"]


def unicode_hellaswag(out):
    """HellaSwag items (activity_label, ctx_a, ctx_b, endings) from the fortune task, with non-ASCII
    text where str.capitalize() and str.strip() act."""
    lines = (REPO / "configs/tasks/fortune_ending.jsonl").read_text().splitlines()
    docs = []
    for i, start in enumerate(CTX_B_STARTS):
        doc = json.loads(lines[i])
        words = doc["ctx"].split(" ")
        half = len(words) // 2
        space = SPACES[i % len(SPACES)]
        ctx_a = " ".join(words[:half]) + (space if i % 3 == 0 else "")
        ctx_b = start + " ".join(words[half:]) + (space if i % 2 else "")
        endings = [e.replace("[", "(").replace("]", ")") for e in doc["endings"]]  # none preprocesses to ""
        endings = [space + e if k == 0 else e + SPACES[(i + k) % len(SPACES)] for k, e in enumerate(endings)]
        if i % 4 == 1:
            endings[2] = "[note\n" + endings[2] + "] " + endings[2]  # "." does not cross the newline
        docs.append({"activity_label": ("\u3000" if i % 2 else "") + "Fortune", "ctx_a": ctx_a, "ctx_b": ctx_b,
                     "ctx": ctx_a + " " + ctx_b, "endings": endings, "label": doc["label"]})
    out.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return out


def unicode_generic(out):
    """Verse items whose context ends in Unicode whitespace (moved to the continuation by rstrip())."""
    docs = []
    for i, line in enumerate((REPO / "configs/tasks/kjv_next_verse.jsonl").read_text().splitlines()[:len(SPACES)]):
        doc = json.loads(line)
        docs.append(dict(doc, context=doc["context"] + SPACES[i]))
    out.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return out


def test_unicode_whitespace_and_case_mapping_match_lm_eval(tmp_path, tmp_path_factory, lm_eval_env):
    run, hf, tokenizer = trained_model(tmp_path_factory)
    include = tmp_path / "lm_eval_tasks"
    include.mkdir()
    # lm-eval's own hellaswag processing (utils.process_docs and the fields of hellaswag.yaml).
    (include / "hellaswag_utils.py").write_text("from lm_eval.tasks.hellaswag.utils import process_docs  # noqa\n")
    metrics = ("metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
               "  - metric: acc_norm\n    aggregation: mean\n    higher_is_better: true\n")
    tasks = {"hs_unicode": unicode_hellaswag(tmp_path / "hs_unicode.jsonl"),
             "verse_spaces": unicode_generic(tmp_path / "verse_spaces.jsonl")}
    fields = {"hs_unicode": 'process_docs: !function hellaswag_utils.process_docs\ndoc_to_text: "{{query}}"\n'
                            'doc_to_target: "{{label}}"\ndoc_to_choice: "choices"',
              "verse_spaces": YAMLS["kjv_next_verse"][1]}
    for name, data in tasks.items():
        (include / f"{name}.yaml").write_text(
            f"task: crucible_{name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
            f"test_split: test\noutput_type: multiple_choice\n{fields[name]}\n{metrics}")
    verses = [json.loads(line)["context"] for line in (REPO / "configs/tasks/kjv_next_verse.jsonl").read_text().splitlines()]
    documents = [space.join(verses[10 * i + k] for k in range(10)).replace(" ", space if i % 2 else " ")
                 for i, space in enumerate(SPACES)]
    documents.append("\u00a0".join(verses[100:110]) + "\u3000\u2028")
    held = tmp_path / "held_unicode.jsonl"
    held.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents))
    (include / "held_unicode.yaml").write_text(
        f"task: crucible_held_unicode\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {held}\n"
        'test_split: test\noutput_type: loglikelihood_rolling\ndoc_to_text: "{{text}}"\ndoc_to_target: "{{text}}"\n'
        "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n")

    names = [f"crucible_{n}" for n in tasks] + ["crucible_held_unicode"]
    theirs = run_lm_eval(lm_eval_env, hf, include, names, tmp_path / "lm_eval.json", tmp_path / "hf_home")
    run_crucible("eval", hf, "--tasks", *tasks.values(), "--text", held, "--json", tmp_path / "ours.json",
                 "--predictions", tmp_path / "ours.jsonl", env=ENV)
    ours = json.loads((tmp_path / "ours.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "ours.jsonl").read_text().splitlines()]

    for name in tasks:
        mine = [r for r in rows if r["task"] == name]
        samples = sorted(theirs["samples"][f"crucible_{name}"], key=lambda s: s["doc_id"])
        assert len(samples) == len(mine) > 0
        worst = max(float(np.abs(np.array(s["lls"]) - np.array(r["loglikelihoods"])).max())
                    for r, s in zip(mine, samples))
        print(f"{lm_eval_env.stack} {name}: max |ll_crucible - ll_lm_eval| = {worst:.3g} nats")
        assert worst < LL_ATOL, name
        for row, sample in zip(mine, samples):
            assert (row["acc"], row["acc_norm"]) == (sample["acc"], sample["acc_norm"]), (name, row, sample)
    held_ours, held_theirs = ours["perplexity"]["held_unicode"], theirs["results"]["crucible_held_unicode"]
    words = sum(len(re.split(r"\s+", d)) for d in documents)
    print(f"{lm_eval_env.stack} words: crucible {held_ours['words']} Python {words}; word_perplexity "
          f"{held_ours['word_perplexity']:.6f} vs lm-eval {held_theirs['word_perplexity,none']:.6f}")
    assert held_ours["words"] == words
    assert held_ours["word_perplexity"] == pytest.approx(held_theirs["word_perplexity,none"], rel=BPB_RTOL)
    assert held_ours["bits_per_byte"] == pytest.approx(held_theirs["bits_per_byte,none"], rel=BPB_RTOL)
