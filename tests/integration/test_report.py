"""crucible report: two real runs (one trained with [validation] and scored by `crucible eval`, one
trained under `crucible launch` whose first attempt fails) make one report.html, which headless
Chromium opens without console errors; every chart has one point per record of its source, the
runs overlay, the eval scores have error bars, and nothing is fetched from the network.
Bad input exits with one line naming it. See docs/report.md."""
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import crucible_binary, run_crucible

TEXT = "/usr/share/common-licenses/GPL-3"
ENV = {"OMP_NUM_THREADS": "1"}
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}
CHROMEDRIVER = "/usr/bin/chromedriver"


def settings(root, run_dir, steps, *extra):
    items = ["model.flavor=debug", "model.vocab_size=512", "training.dataset=tokens",
             f"training.dataset_path={root / 'tokens.u32'}", "training.token_dtype=uint32",
             "training.seq_len=64", "training.local_batch_size=4",
             f"model.tokenizer_path={root / 'tokenizer.json'}", "metrics.peak_gflops=10000",
             "checkpoint.interval=5", f"job.dump_folder={run_dir}", *extra]
    if steps is not None:
        items.append(f"training.steps={steps}")
    return sum((["--set", s] for s in items), [])


def lines(path):
    return [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(root, run A, run B): A trained with validation and scored by eval --json; B launched with a
    first attempt that fails after step 10 and a second that resumes to step 20."""
    root = tmp_path_factory.mktemp("report")
    run_crucible("tokenizer", "train", "--vocab-size", "512", "--whole-file", "-o", root / "tokenizer.json",
                 TEXT, env=ENV)
    run_crucible("tokenizer", "encode", "-t", root / "tokenizer.json", "--whole-file", "--out-bin",
                 root / "tokens.u32", TEXT, env=ENV)
    with open(root / "task.jsonl", "w") as f:
        sentences = [s.strip() for s in re.split(r"(?<=[.;:])\s+", open(TEXT).read()) if 20 < len(s) < 120]
        for i in range(12):
            f.write(json.dumps({"context": sentences[i], "choices": [sentences[i + 1], sentences[i + 40],
                                                                     sentences[i + 80]], "gold": 0}) + "\n")
    (root / "held_out.jsonl").write_text(json.dumps({"text": " ".join(sentences[-30:])}) + "\n")
    run_a = root / "run-a"
    run_crucible("train", *settings(root, run_a, 20, "validation.enable=true", "validation.freq=10",
                                     f"validation.tasks=[\"{root / 'task.jsonl'}\"]",
                                     f"validation.held_out={root / 'held_out.jsonl'}"), env=ENV)
    run_crucible("eval", run_a, "--tasks", root / "task.jsonl", "--json", run_a / "eval" / "final.json", "-q",
                 env=ENV)

    run_b = root / "run-b"
    crucible = crucible_binary()
    args = " ".join(f"'{a}'" for a in settings(root, run_b, None)) + ' --set "training.steps=$STEPS"'
    job = root / "job.sh"
    job.write_text(f"""#!/bin/sh
# Attempt 1 trains to step 10 and then fails as a lost node would; attempt 2 resumes to step 20.
if [ "$CRUCIBLE_ATTEMPT" = 1 ]; then
  STEPS=10; {crucible} train {args} || exit $?
  echo "simulated failure after step 10" >&2
  exit 1
fi
STEPS=20; exec {crucible} train {args}
""")
    job.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_", "CRUCIBLE_", "OMPI_"))}
    env.update(ENV, **MPI_ENV)
    proc = subprocess.run([crucible, "launch", "--run-dir", str(run_b), "--retries", "2", "--backoff-base", "0.5",
                           "--", str(job)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root, run_a, run_b


def test_two_runs_make_one_page_that_chromium_renders_with_every_point(runs, tmp_path):
    root, run_a, run_b = runs
    attempts = [r for r in lines(run_b / "launch" / "attempts.jsonl") if r["kind"] == "attempt"]
    assert [(r["exit_code"], r["action"]) for r in attempts] == [(1, "retry"), (0, "done")]

    out = tmp_path / "report.html"
    proc = run_crucible("report", run_a, run_b, "-o", out, "--title", "Two runs")
    assert proc.stdout.strip() == f"wrote {out} (self-contained: open it in a browser, no network needed)"
    html = out.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.I), "a network reference"
    assert "<title>Two runs</title>" in html
    # The default output: report.html in the first run's folder.
    run_crucible("report", run_b)
    assert (run_b / "report.html").stat().st_size > 100_000

    if not (shutil.which("chromium") and Path(CHROMEDRIVER).exists()):
        pytest.skip("chromium and chromium-driver are not installed (scripts/install-deps.sh chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not in the venv (make venv)")
    options = webdriver.ChromeOptions()
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1400,2400"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER), options=options)
    try:
        driver.get(out.as_uri())
        errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert not errors, errors
        shot = tmp_path / "report.png"
        assert driver.save_screenshot(str(shot))
        png = shot.read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 50_000, len(png)

        charts = driver.execute_script("""
            const out = {};
            for (const canvas of document.querySelectorAll('canvas[data-chart]')) {
              const chart = Chart.getChart(canvas);
              out[canvas.dataset.chart] = {
                id: canvas.id,
                datasets: chart.data.datasets.map((d) => ({label: d.label, points: d.data.length,
                                                           values: d.data})),
                errorBars: (chart.$errorBars || []).length,
                drawn: chart.getDatasetMeta(0).data.length};
            }
            out.empty = [...document.querySelectorAll('[data-empty]')].map((e) => e.dataset.empty);
            return out;""")
    finally:
        driver.quit()

    metrics = {name: lines(run / "metrics.jsonl") for name, run in (("run-a", run_a), ("run-b", run_b))}
    assert len(metrics["run-a"]) == 20 and len(metrics["run-b"]) == 20

    def points(chart):
        return {d["label"]: d["points"] for d in charts[chart]["datasets"]}

    # Every chart is there, with one point per record of its source, the runs overlaid.
    assert set(charts) - {"empty"} == {"loss", "lr", "grad_norm", "tokens_per_second", "mfu", "eval_accuracy",
                                       "validation_accuracy", "checkpoint_stall", "memory_over_steps", "memory",
                                       "launch_timeline"}
    assert charts["empty"] == []
    assert all(c["id"] == "chart-" + name for name, c in charts.items() if name != "empty")
    validation = lines(run_a / "eval" / "validation.jsonl")
    assert points("loss") == {"run-a train": 20, "run-b train": 20, "run-a held-out": len(validation)}
    for chart in ("lr", "tokens_per_second", "mfu", "memory_over_steps"):
        assert points(chart) == {"run-a": 20, "run-b": 20}, chart
    assert points("grad_norm") == {f"{r} {w} clipping": 20 for r in ("run-a", "run-b") for w in ("before", "after")}
    losses = [d["values"] for d in charts["loss"]["datasets"] if d["label"] == "run-b train"][0]
    assert [p["y"] for p in losses] == pytest.approx([m["loss"] for m in metrics["run-b"]])
    assert points("checkpoint_stall") == {"run-a": len(lines(run_a / "checkpoints.jsonl")),
                                          "run-b": len(lines(run_b / "checkpoints.jsonl"))}
    assert len(lines(run_b / "checkpoints.jsonl")) == 4  # steps 5 and 10 of attempt 1, 15 and 20 of 2
    assert points("memory") == {"run-b": 7}  # only a launched run keeps the trainer's memory lines
    assert points("launch_timeline") == {"run-b attempts": 2, "run-b downtime": 1}
    # Eval: the eval --json scores and the last validation's, one task each, each with its error bar.
    assert points("eval_accuracy") == {"run-a eval/final.json": 1, "run-a validation step 20": 1}
    assert charts["eval_accuracy"]["errorBars"] == 2
    assert points("validation_accuracy") == {"run-a task": len(validation)}
    assert charts["validation_accuracy"]["errorBars"] == len(validation)


def test_missing_sources_say_no_data_and_bad_input_is_named(runs, tmp_path):
    root, run_a, run_b = runs
    only_eval = tmp_path / "only-eval"
    (only_eval / "eval").mkdir(parents=True)
    shutil.copy(run_a / "eval" / "final.json", only_eval / "eval" / "final.json")
    run_crucible("report", only_eval)
    data = re.search(r'<script type="application/json" id="report-data">(.*?)</script>',
                     (only_eval / "report.html").read_text(), re.S).group(1)
    specs = {c["id"]: c for c in json.loads(data)}
    assert specs["eval_accuracy"]["empty"] == ""
    assert specs["loss"]["empty"].startswith("no data") and specs["launch_timeline"]["empty"].startswith("no data")

    empty = tmp_path / "empty"
    empty.mkdir()
    for target, message in [(empty, f"{empty}: not a run directory (no metrics.jsonl, eval/ or launch/)"),
                            (tmp_path / "missing", f"{tmp_path / 'missing'}: not a run directory (no such file)")]:
        proc = run_crucible("report", run_a, target, "-o", tmp_path / "r.html", check=False)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "r.html").exists()

    bad = tmp_path / "bad"
    bad.mkdir()
    text = (run_a / "metrics.jsonl").read_text().splitlines()
    (bad / "metrics.jsonl").write_text("\n".join(text[:3] + ["{\"step\": 4, \"loss\": "] + text[4:]) + "\n")
    proc = run_crucible("report", bad, check=False)
    assert proc.returncode == 65 and f"{bad / 'metrics.jsonl'}:4: not a JSON record" in proc.stderr, proc.stderr

    proc = run_crucible("report", run_a, "-o", tmp_path / "r.html", env={"CRUCIBLE_CHART_JS": "/nonexistent/chart.js"},
                        check=False)
    assert proc.returncode == 1 and "libjs-chart.js" in proc.stderr and "scripts/install-deps.sh" in proc.stderr
