"""`make demo-post` (scripts/demo-post.sh, docs/post-training.md "Worked path"): pre-training, two
CPT runs (rewarm, gentle) with boundary evaluations printed side by side, SFT on conversations
built from the corpora, and `generate --chat` on held-out questions. Here on small synthetic corpora
in the demo corpora's shapes (DEMO_POST_CORPORA; no Debian packages needed) and a few steps per
phase, so it runs in well under a minute and a half on 2 cores."""
import json
import os
import subprocess

from conftest import REPO, crucible_binary

WORDS = ("light water earth heaven king people house city land spirit word voice fire night day stone "
         "bread wine field sheep gold silver servant child mountain river tree hand heart").split()


def corpora(folder):
    """kjv, fortunes, jargon and gcide .jsonl in the shapes of scripts/demo_corpora.py's."""
    folder.mkdir()

    def write(name, texts):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))

    def letters(i):  # GCIDE headwords are letters
        return chr(97 + i // 26) + chr(97 + i % 26)

    def words(i, n):
        return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n))

    write("kjv", [f"Chapter {i}\n1:1 And the {words(i, 12)}.\n1:2 And it was so, {words(i + 1, 10)}."
                  for i in range(100)])
    write("fortunes", [f"A {words(i, 8)} is worth {words(i + 2, 6)}. -- Anonymous" for i in range(100)])
    write("jargon", [f":term{i} {WORDS[i % len(WORDS)]}: /term/, n.\n\n[common] The {words(i, 9)} of a hacker. "
                     f"See {{term{i + 1}}}." for i in range(200)])
    write("gcide", [f"Word{letters(i)} \\Word{letters(i)}\\ n.\n   The {words(i, 8)}; a {words(i + 3, 4)}.\n   [1913 Webster]"
                    for i in range(100)])
    return folder


def test_demo_post_runs_every_phase(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, CRUCIBLE=crucible_binary(), OMP_NUM_THREADS="2", DEMO_POST_OUT=str(out),
               DEMO_POST_CORPORA=str(corpora(tmp_path / "corpora")), DEMO_POST_PRE_STEPS="6",
               DEMO_POST_CPT_STEPS="4", DEMO_POST_SFT_STEPS="4", DEMO_POST_EVAL_ITEMS="6",
               DEMO_POST_QUESTIONS="2", DEMO_POST_SFT_ARGS="--gcide 40")
    proc = subprocess.run([REPO / "scripts" / "demo-post.sh"], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    for phase in ["pre-training tiny on blend A for 6 steps", "lr_policy=rewarm: stages cpt1 (2 steps) and cpt2 (2)",
                  "lr_policy=gentle", "boundary evaluations, eval/stages.jsonl of both runs", "SFT from",
                  "phase=sft conversations=", "packing=on", "crucible generate --chat (template chatml)",
                  "demo-post: chat model"]:
        assert phase in log, (phase, log[-3000:])
    # The side-by-side table: a column per boundary of each run, a row per task and held-out text.
    header = next(line for line in log.splitlines() if "rewarm:cpt1" in line)
    assert header.split()[1:] == ["start", "rewarm:cpt1", "rewarm:cpt2", "gentle:cpt1", "gentle:cpt2"], header
    for row in ["acc jargon_term", "acc kjv_next_verse", "held-out loss kjv", "held-out loss jargon"]:
        line = next(line for line in log.splitlines() if row in line)
        assert len(line.split()) == len(row.split()) + 1 + 5, line
    assert "rewarm: held-out loss of blend A's corpora rose on" in log
    for run in ["cpt-rewarm", "cpt-gentle"]:
        boundaries = [json.loads(line) for line in open(out / run / "eval" / "stages.jsonl")]
        assert [b["stage"] for b in boundaries] == [None, "cpt1", "cpt2"]
    # Held-out questions and the model's answers.
    assert log.count("demo-post:   Q: What does the Jargon File say about") == 2, log[-2000:]
    assert log.count("demo-post:   A:") == 2
    answers = json.loads((out / "answers.json").read_text())
    assert answers["chat_template"] == "chatml" and len(answers["results"]) == 2
    trained = {json.loads(line)["messages"][0]["content"] for line in open(out / "sft" / "sft-train.jsonl")}
    asked = [json.loads(line)["messages"][0]["content"] for line in open(out / "questions.jsonl")]
    assert not set(asked) & trained
