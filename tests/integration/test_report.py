"""crucible report: two real runs (one trained with [validation] and scored by `crucible eval`, one
trained under `crucible launch` whose first attempt fails) make one report.html, which headless
Chromium opens without console errors; every chart has one point per record of its source, the
runs overlay, the eval scores have error bars, and nothing is fetched from the network.
Bad input exits with one line naming it. A GRPO run's metrics.jsonl (synthetic) adds the GRPO
charts, first, with a right-hand axis and a stacked step time split. See docs/report.md."""
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


def chromium():
    """A headless Chromium (selenium), or a skip when it or chromium-driver is not installed."""
    if not (shutil.which("chromium") and Path(CHROMEDRIVER).exists()):
        pytest.skip("chromium and chromium-driver are not installed (scripts/install-deps.sh chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not in the venv (make venv)")
    options = webdriver.ChromeOptions()
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1400,2400"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER), options=options)


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

    driver = chromium()
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


def test_a_grpo_run_adds_reward_kl_length_and_stacked_step_time_charts(tmp_path):
    """Synthetic metrics.jsonl lines with the fields `crucible grpo` writes (rl/grpo_trainer.cc)."""
    grpo = tmp_path / "grpo"
    grpo.mkdir()
    parts = ("generation_s", "reward_s", "score_s", "train_s")
    records = [{"step": step, "loss": 0.5 / step, "lr": 1e-5, "grad_norm": 0.3, "tok_per_s": 50.0,
                "rollout_step": step, "reward_mean": 0.1 * step, "reward_std": 0.3, "accuracy": 0.05 * step,
                "format_rate": 1.0, "completion_length": 40.0 - step, "truncated_rate": 0.5 / step,
                "grpo_loss": -0.01, "kl": 0.001 * (step - 1), "entropy": 2.0 - 0.1 * step, "mean_ratio": 1.0,
                "generation_s": 2.0, "reward_s": 0.05, "score_s": 0.5, "train_s": 1.0 + 0.1 * step}
               for step in range(1, 9)]
    (grpo / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "report.html"
    run_crucible("report", grpo, "-o", out)
    data = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', out.read_text(), re.S)
    specs = json.loads(data.group(1))
    assert [c["id"] for c in specs[:4]] == ["grpo_reward", "grpo_kl_entropy", "grpo_completion_length",
                                           "grpo_step_time"]

    driver = chromium()
    try:
        driver.get(out.as_uri())
        errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert not errors, errors
        charts = driver.execute_script("""
            const out = {};
            for (const canvas of document.querySelectorAll('canvas[data-chart^="grpo"]')) {
              const chart = Chart.getChart(canvas);
              out[canvas.dataset.chart] = {
                axes: Object.keys(chart.scales).sort(),
                datasets: chart.data.datasets.map((d, i) => {
                  const meta = chart.getDatasetMeta(i), scale = chart.scales[meta.yAxisID];
                  return {label: d.label, axis: meta.yAxisID, y: d.data.map((p) => p.y),
                          drawn: meta.data.map((e) => scale.getValueForPixel(e.y))};
                })};
            }
            return out;""")
    finally:
        driver.quit()

    def column(key):
        return [r[key] for r in records]

    def datasets(chart):
        return {d["label"]: d for d in charts[chart]["datasets"]}

    reward = datasets("grpo_reward")
    assert reward["grpo reward_mean"]["y"] == pytest.approx(column("reward_mean"))
    assert reward["grpo accuracy"]["y"] == pytest.approx(column("accuracy"))
    kl = datasets("grpo_kl_entropy")
    assert kl["grpo kl"]["y"] == pytest.approx(column("kl")) and kl["grpo kl"]["axis"] == "y"
    assert kl["grpo entropy"]["y"] == pytest.approx(column("entropy")) and kl["grpo entropy"]["axis"] == "y2"
    assert charts["grpo_kl_entropy"]["axes"] == ["x", "y", "y2"]
    length = datasets("grpo_completion_length")
    assert length["grpo completion_length"]["y"] == pytest.approx(column("completion_length"))
    assert length["grpo truncated_rate"]["y"] == pytest.approx(column("truncated_rate"))
    # Stacked: each part is drawn at the sum of the parts up to it (to a pixel's worth).
    time = datasets("grpo_step_time")
    assert list(time) == [f"grpo {p}" for p in parts]
    total = [0.0] * len(records)
    for p in parts:
        assert time[f"grpo {p}"]["y"] == pytest.approx(column(p))
        total = [t + r[p] for t, r in zip(total, records)]
        assert time[f"grpo {p}"]["drawn"] == pytest.approx(total, abs=0.05), p
