#include "report/html.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <set>

#include "common/strings.h"

namespace crucible {
namespace {

using Json = nlohmann::json;

Json NumberOrNull(double value) {
  return std::isfinite(value) ? Json(value) : Json(nullptr);
}

Json Chart(const char* id, const char* title, const char* type, const char* x_title,
           const char* y_title) {
  return {{"id", id},           {"title", title},     {"type", type},
          {"x_title", x_title}, {"y_title", y_title}, {"datasets", Json::array()}};
}

Json LineDataset(const std::string& label, const RunData& run, size_t index, const Series& s,
                 bool dash = false) {
  Json points = Json::array();
  for (size_t i = 0; i < s.size(); ++i) points.push_back({s.x[i], NumberOrNull(s.y[i])});
  Json dataset = {{"label", label},
                  {"run", run.name},
                  {"color", RunColor(index)},
                  {"dash", dash},
                  {"points", points}};
  if (!s.error.empty()) {
    Json errors = Json::array();
    for (double e : s.error) errors.push_back(NumberOrNull(e));
    dataset["errors"] = errors;
  }
  return dataset;
}

// A chart of one series of every run that has it; `empty` says why there is none.
Json SeriesChart(const std::vector<RunData>& runs, const char* id, const char* title,
                 const char* y_title, Series RunData::*series, const char* empty) {
  Json chart = Chart(id, title, "line", "step", y_title);
  for (size_t i = 0; i < runs.size(); ++i)
    if ((runs[i].*series).HasValues())
      chart["datasets"].push_back(LineDataset(runs[i].name, runs[i], i, runs[i].*series));
  chart["empty"] = chart["datasets"].empty() ? empty : "";
  return chart;
}

Json LossChart(const std::vector<RunData>& runs) {
  Json chart = Chart("loss", "Loss: train and held-out", "line", "step", "loss (nats per token)");
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].loss.HasValues())
      chart["datasets"].push_back(LineDataset(runs[i].name + " train", runs[i], i, runs[i].loss));
    if (runs[i].held_out_loss.HasValues())
      chart["datasets"].push_back(
          LineDataset(runs[i].name + " held-out", runs[i], i, runs[i].held_out_loss, true));
  }
  chart["empty"] = chart["datasets"].empty()
                       ? "no data: no run has metrics.jsonl or eval/validation.jsonl losses"
                       : "";
  return chart;
}

Json GradNormChart(const std::vector<RunData>& runs) {
  Json chart = Chart("grad_norm", "Gradient norm", "line", "step", "L2 norm");
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].grad_norm.HasValues())
      chart["datasets"].push_back(
          LineDataset(runs[i].name + " before clipping", runs[i], i, runs[i].grad_norm));
    if (runs[i].grad_norm_clipped.HasValues())
      chart["datasets"].push_back(LineDataset(runs[i].name + " after clipping", runs[i], i,
                                              runs[i].grad_norm_clipped, true));
  }
  chart["empty"] = chart["datasets"].empty() ? "no data: no run has metrics.jsonl" : "";
  return chart;
}

// Accuracy per task (categories) with standard-error bars: a dataset per run and evaluation.
Json EvalChart(const std::vector<RunData>& runs) {
  Json chart = Chart("eval_accuracy", "Eval accuracy per task (± standard error)", "bar", "task",
                     "accuracy");
  std::vector<std::string> tasks;
  std::set<std::string> seen;
  for (const RunData& run : runs)
    for (const EvalSet& set : run.evals)
      for (const EvalScore& s : set.scores)
        if (seen.insert(s.task).second) tasks.push_back(s.task);
  chart["categories"] = tasks;
  chart["y_min"] = 0;
  chart["y_max"] = 1;
  for (size_t i = 0; i < runs.size(); ++i)
    for (const EvalSet& set : runs[i].evals) {
      Json values = Json::array(), errors = Json::array();
      for (const std::string& task : tasks) {
        const EvalScore* found = nullptr;
        for (const EvalScore& s : set.scores)
          if (s.task == task) found = &s;
        values.push_back(found ? NumberOrNull(found->acc) : Json(nullptr));
        errors.push_back(found ? NumberOrNull(found->acc_stderr) : Json(nullptr));
      }
      chart["datasets"].push_back({{"label", runs[i].name + " " + set.source},
                                   {"run", runs[i].name},
                                   {"color", RunColor(i)},
                                   {"values", values},
                                   {"errors", errors}});
    }
  chart["empty"] = chart["datasets"].empty()
                       ? "no data: no run has eval/*.json (crucible eval --json) or "
                         "eval/validation.jsonl task scores"
                       : "";
  return chart;
}

Json ValidationAccuracyChart(const std::vector<RunData>& runs) {
  Json chart =
      Chart("validation_accuracy", "Validation accuracy during training (± standard error)", "line",
            "step", "accuracy");
  chart["y_min"] = 0;
  chart["y_max"] = 1;
  for (size_t i = 0; i < runs.size(); ++i) {
    size_t task_index = 0;
    for (const auto& [task, series] : runs[i].validation_accuracy)
      chart["datasets"].push_back(
          LineDataset(runs[i].name + " " + task, runs[i], i, series, task_index++ % 2 == 1));
  }
  chart["empty"] = chart["datasets"].empty()
                       ? "no data: no run has task scores in eval/validation.jsonl ([validation])"
                       : "";
  return chart;
}

Json MemoryChart(const std::vector<RunData>& runs) {
  // A log scale: the host's available memory dwarfs a small run's buffers.
  Json chart = Chart("memory", "Memory plan per rank, and the peak (log scale)", "bar", "", "MiB");
  chart["y_log"] = true;
  std::vector<std::string> labels;
  std::set<std::string> seen;
  for (const RunData& run : runs)
    for (const auto& [label, bytes] : run.memory)
      if (seen.insert(label).second) labels.push_back(label);
  chart["categories"] = labels;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].memory.empty()) continue;
    Json values = Json::array();
    for (const std::string& label : labels) {
      Json value = nullptr;
      for (const auto& [name, bytes] : runs[i].memory)
        if (name == label) value = bytes / (1024.0 * 1024.0);
      values.push_back(value);
    }
    chart["datasets"].push_back({{"label", runs[i].name},
                                 {"run", runs[i].name},
                                 {"color", RunColor(i)},
                                 {"values", values}});
  }
  chart["empty"] = chart["datasets"].empty()
                       ? "no data: the trainer's phase=memory_check and phase=memory_peak lines "
                         "are kept only under crucible launch (launch/attempt-<k>.log)"
                       : "";
  return chart;
}

Json TimelineChart(const std::vector<RunData>& runs) {
  Json chart = Chart("launch_timeline", "Launch attempts", "timeline",
                     "seconds since the first attempt started", "");
  Json rows = Json::array();
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].attempts.empty()) continue;
    Json bars = Json::array(), labels = Json::array(), details = Json::array();
    Json gaps = Json::array(), gap_labels = Json::array(), gap_details = Json::array();
    for (const LaunchAttempt& a : runs[i].attempts) {
      const std::string row = StrFormat("%s #%d", runs[i].name.c_str(), a.attempt);
      rows.push_back(row);
      bars.push_back({a.start_seconds, a.start_seconds + a.wall_seconds});
      labels.push_back(row);
      details.push_back(StrFormat("%s, exit %d, %s %s", a.verdict.c_str(), a.exit_code,
                                  a.action.c_str(), a.detail.c_str()));
      if (a.downtime_before > 0) {
        gaps.push_back({a.start_seconds - a.downtime_before, a.start_seconds});
        gap_labels.push_back(row);
        gap_details.push_back(
            StrFormat("down %.1f s before attempt %d", a.downtime_before, a.attempt));
      }
    }
    chart["datasets"].push_back({{"label", runs[i].name + " attempts"},
                                 {"run", runs[i].name},
                                 {"color", RunColor(i)},
                                 {"bars", bars},
                                 {"rows", labels},
                                 {"details", details}});
    if (!gaps.empty())
      chart["datasets"].push_back({{"label", runs[i].name + " downtime"},
                                   {"run", runs[i].name},
                                   {"color", "#9e9e9e"},
                                   {"bars", gaps},
                                   {"rows", gap_labels},
                                   {"details", gap_details}});
  }
  chart["categories"] = rows;
  chart["empty"] = chart["datasets"].empty()
                       ? "no data: no run has launch/attempts.jsonl (crucible launch)"
                       : "";
  return chart;
}

// The charts of `crucible grpo` runs (metrics.jsonl, docs/post-training.md): one line of
// `series` per run that has it, labelled "<run> <label>", dashed where asked; a `right_axis` line
// is drawn against the right-hand axis "y2", titled `y2_title`, which is there only when some
// run has such a line.
struct GrpoLine {
  const char* label;
  Series GrpoSeries::*series;
  bool dash = false;
  bool right_axis = false;
};

Json GrpoChart(const std::vector<RunData>& runs, const char* id, const char* title,
               const char* y_title, const char* y2_title, const std::vector<GrpoLine>& lines,
               const char* empty) {
  Json chart = Chart(id, title, "line", "step", y_title);
  for (size_t i = 0; i < runs.size(); ++i)
    for (const GrpoLine& line : lines) {
      const Series& series = runs[i].grpo_metrics.*line.series;
      if (!series.HasValues()) continue;
      Json dataset = LineDataset(runs[i].name + " " + line.label, runs[i], i, series, line.dash);
      if (line.right_axis) {
        dataset["axis"] = "y2";
        chart["y2_title"] = y2_title;
      }
      chart["datasets"].push_back(dataset);
    }
  chart["empty"] = chart["datasets"].empty() ? empty : "";
  return chart;
}

// Where a GRPO step's time goes: its four parts stacked, per run (a stack each, the parts in
// shades of the run's colour), so the top line is the step's sum of them.
Json GrpoStepTimeChart(const std::vector<RunData>& runs) {
  Json chart =
      Chart("grpo_step_time", "GRPO step time split (stacked)", "line", "step", "seconds per step");
  chart["stacked"] = true;
  chart["y_min"] = 0;
  const GrpoLine parts[] = {{"generation_s", &GrpoSeries::generation_seconds},
                            {"reward_s", &GrpoSeries::reward_seconds},
                            {"score_s", &GrpoSeries::score_seconds},
                            {"train_s", &GrpoSeries::train_seconds}};
  const char* const shades[] = {"e6", "a6", "66", "33"};  // fill opacity, as hex
  for (size_t i = 0; i < runs.size(); ++i)
    for (size_t k = 0; k < 4; ++k) {
      const Series& series = runs[i].grpo_metrics.*parts[k].series;
      if (!series.HasValues()) continue;
      Json dataset = LineDataset(runs[i].name + " " + parts[k].label, runs[i], i, series);
      dataset["stack"] = runs[i].name;
      dataset["fill_color"] = RunColor(i) + shades[k];
      chart["datasets"].push_back(dataset);
    }
  chart["empty"] = chart["datasets"].empty()
                       ? "no data: no GRPO run's metrics.jsonl has generation_s, reward_s, "
                         "score_s or train_s"
                       : "";
  return chart;
}

// The four GRPO charts, first on the page, or none when no run is a GRPO run (so a pre-training
// report is unchanged).
void AddGrpoCharts(const std::vector<RunData>& runs, Json* charts) {
  if (std::none_of(runs.begin(), runs.end(), [](const RunData& run) { return run.grpo; })) return;
  charts->push_back(GrpoChart(
      runs, "grpo_reward", "GRPO reward", "mean reward; accuracy (dashed)", nullptr,
      {{"reward_mean", &GrpoSeries::reward_mean}, {"accuracy", &GrpoSeries::accuracy, true}},
      "no data: no GRPO run's metrics.jsonl has reward_mean"));
  charts->push_back(
      GrpoChart(runs, "grpo_kl_entropy", "GRPO KL and entropy",
                "KL to the reference (nats per token)", "entropy (nats per token, dashed)",
                {{"kl", &GrpoSeries::kl}, {"entropy", &GrpoSeries::entropy, true, true}},
                "no data: no GRPO run's metrics.jsonl has kl or entropy"));
  Json length =
      GrpoChart(runs, "grpo_completion_length", "GRPO completion length",
                "mean tokens per completion", "share truncated at max_new_tokens (dashed)",
                {{"completion_length", &GrpoSeries::completion_length},
                 {"truncated_rate", &GrpoSeries::truncated_rate, true, true}},
                "no data: no GRPO run's metrics.jsonl has completion_length");
  if (length.contains("y2_title")) {
    length["y2_min"] = 0;
    length["y2_max"] = 1;
  }
  charts->push_back(length);
  charts->push_back(GrpoStepTimeChart(runs));
}

std::string ConfigSummary(const RunData& run) {
  std::string text;
  for (const auto& [key, value] : run.config)
    text += (text.empty() ? "" : ", ") + key + " = " + value;
  return text.empty() ? "(no config.toml)" : text;
}

std::string RunsTable(const std::vector<RunData>& runs) {
  std::string html =
      "<table class=\"runs\"><tr><th>run</th><th>folder</th><th>steps logged</th>"
      "<th>last loss</th><th>attempts</th><th>config</th></tr>\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunData& run = runs[i];
    std::string last_loss = "–";
    for (size_t k = run.loss.size(); k-- > 0;)
      if (std::isfinite(run.loss.y[k])) {
        last_loss = StrFormat("%.4f (step %.0f)", run.loss.y[k], run.loss.x[k]);
        break;
      }
    html += StrFormat(
        "<tr><td><span class=\"swatch\" style=\"background:%s\"></span>%s</td><td><code>%s</code>"
        "</td><td>%lld</td><td>%s</td><td>%zu</td><td class=\"config\">%s",
        RunColor(i).c_str(), XmlEscape(run.name).c_str(), XmlEscape(run.dir).c_str(),
        static_cast<long long>(run.metrics_lines), last_loss.c_str(), run.attempts.size(),
        XmlEscape(ConfigSummary(run)).c_str());
    for (const std::string& note : run.notes)
      html += "<br><span class=\"note\">" + XmlEscape(note) + "</span>";
    html += "</td></tr>\n";
  }
  return html + "</table>\n";
}

std::string EvalTable(const std::vector<RunData>& runs) {
  std::string html;
  for (const RunData& run : runs)
    for (const EvalSet& set : run.evals)
      for (const EvalScore& s : set.scores)
        html += StrFormat(
            "<tr><td>%s</td><td>%s</td><td>%s</td><td>%lld</td><td>%.4f ± %.4f</td>"
            "<td>%.4f ± %.4f</td><td>%.4f</td></tr>\n",
            XmlEscape(run.name).c_str(), XmlEscape(set.source).c_str(), XmlEscape(s.task).c_str(),
            static_cast<long long>(s.items), s.acc, s.acc_stderr, s.acc_norm, s.acc_norm_stderr,
            s.chance);
  if (html.empty()) return "";
  return "<table id=\"eval-table\"><tr><th>run</th><th>source</th><th>task</th><th>items</th>"
         "<th>acc</th><th>acc_norm</th><th>chance</th></tr>\n" +
         html + "</table>\n";
}

// eval/stages.jsonl: one row per run and stage boundary.
std::string StageEvalTable(const std::vector<RunData>& runs) {
  std::string html;
  for (const RunData& run : runs)
    for (const StageEvalRecord& r : run.stage_evals) {
      std::string text, tasks;
      for (const auto& [name, bpb] : r.bits_per_byte)
        text += StrFormat("%s%s %.4f", text.empty() ? "" : "; ", name.c_str(), bpb);
      for (const EvalScore& s : r.tasks)
        tasks += StrFormat("%s%s %.4f ± %.4f", tasks.empty() ? "" : "; ", s.task.c_str(), s.acc,
                           s.acc_stderr);
      html += StrFormat(
          "<tr><td>%s</td><td>%d</td><td>%lld</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td>"
          "<td>%s</td></tr>\n",
          XmlEscape(run.name).c_str(), r.boundary, static_cast<long long>(r.step),
          XmlEscape(r.stage.empty() ? "(start)" : r.stage).c_str(),
          XmlEscape(r.next_stage.empty() ? "(end)" : r.next_stage).c_str(),
          XmlEscape(tasks).c_str(), XmlEscape(text).c_str(), XmlEscape(r.gate).c_str());
    }
  if (html.empty()) return "";
  return "<table id=\"stage-eval-table\"><tr><th>run</th><th>boundary</th><th>step</th>"
         "<th>stage ended</th><th>next stage</th><th>task acc ± stderr</th>"
         "<th>text bits per byte</th><th>gate</th></tr>\n" +
         html + "</table>\n";
}

std::string AttemptsTable(const std::vector<RunData>& runs) {
  std::string html;
  for (const RunData& run : runs)
    for (const LaunchAttempt& a : run.attempts) {
      std::string nodes;
      for (const std::string& node : a.nodes) nodes += (nodes.empty() ? "" : " ") + node;
      const std::string steps = a.first_step < 0
                                    ? "none"
                                    : StrFormat("%lld–%lld", static_cast<long long>(a.first_step),
                                                static_cast<long long>(a.last_step));
      html += StrFormat(
          "<tr><td>%s</td><td>%d</td><td>%s</td><td>%.1f</td><td>%.1f</td><td>%d</td>"
          "<td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>\n",
          XmlEscape(run.name).c_str(), a.attempt, XmlEscape(a.started).c_str(), a.wall_seconds,
          a.downtime_before, a.exit_code, XmlEscape(a.verdict).c_str(), XmlEscape(a.action).c_str(),
          XmlEscape(a.detail).c_str(), steps.c_str(), XmlEscape(nodes).c_str(),
          XmlEscape(a.evidence).c_str());
    }
  if (html.empty()) return "";
  return "<table id=\"attempts-table\"><tr><th>run</th><th>attempt</th><th>started</th>"
         "<th>wall s</th><th>down before s</th><th>exit</th><th>verdict</th><th>action</th>"
         "<th>swap / detail</th><th>steps</th><th>nodes</th><th>evidence</th></tr>\n" +
         html + "</table>\n";
}

const char kStyle[] = R"(
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; background: #fafafa; }
h1 { margin: 0 0 0.2em 0; font-size: 1.5em; }
.generated { color: #666; margin-bottom: 1em; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em 0; font-size: 0.85em; background: #fff; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
td.config { max-width: 40em; }
.note { color: #a33; }
.swatch { display: inline-block; width: 0.8em; height: 0.8em; margin-right: 0.4em;
          border-radius: 2px; vertical-align: middle; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(460px, 1fr)); gap: 1em; }
.card { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 0.6em 0.8em; }
.card h2 { font-size: 1em; margin: 0 0 0.4em 0; }
.card .plot { position: relative; height: 300px; }
.card.wide { grid-column: 1 / -1; }
.empty { color: #888; font-style: italic; padding: 2em 0; text-align: center; }
)";

// Builds every chart from the embedded specs (see ChartSpecs). Error bars: Chart.js 3 has none,
// so a plugin draws each dataset's "errors" (value ± error) after the datasets, and records what it
// drew in chart.$errorBars.
const char kScript[] = R"(
(function () {
  'use strict';
  const specs = JSON.parse(document.getElementById('report-data').textContent);
  const valueOf = (d) => (d === null || typeof d !== 'object') ? d : d.y;
  const errorBars = {
    id: 'errorBars',
    afterDatasetsDraw(chart) {
      const drawn = [];
      const ctx = chart.ctx;
      chart.data.datasets.forEach((dataset, i) => {
        if (!dataset.errors || !chart.isDatasetVisible(i)) return;
        const meta = chart.getDatasetMeta(i);
        const scale = chart.scales[meta.yAxisID];
        ctx.save();
        ctx.strokeStyle = '#333';
        ctx.lineWidth = 1.2;
        meta.data.forEach((element, j) => {
          const value = valueOf(dataset.data[j]), error = dataset.errors[j];
          if (value === null || value === undefined || error === null || !isFinite(error)) return;
          const area = chart.chartArea;
          const top = Math.max(area.top, scale.getPixelForValue(value + error));
          const bottom = Math.min(area.bottom, scale.getPixelForValue(value - error));
          const x = element.x;
          ctx.beginPath();
          ctx.moveTo(x, top); ctx.lineTo(x, bottom);
          ctx.moveTo(x - 4, top); ctx.lineTo(x + 4, top);
          ctx.moveTo(x - 4, bottom); ctx.lineTo(x + 4, bottom);
          ctx.stroke();
          drawn.push({dataset: i, index: j, value: value, error: error});
        });
        ctx.restore();
      });
      chart.$errorBars = drawn;
    }
  };
  Chart.register(errorBars);
  const translucent = (color) => color + '99';
  const axis = (title, extra) => Object.assign({title: {display: !!title, text: title}}, extra || {});
  // A value axis of a spec, "y" (left) or "y2" (right): its title, and "<name>_min" /
  // "<name>_max" / "<name>_log" where given.
  const valueAxis = (spec, extra, name) => {
    name = name || 'y';
    const options = axis(spec[name + '_title'], extra);
    if (spec[name + '_min'] !== undefined) options.min = spec[name + '_min'];
    if (spec[name + '_max'] !== undefined) options.max = spec[name + '_max'];
    if (spec[name + '_log']) options.type = 'logarithmic';
    return options;
  };

  // A dataset with "axis": "y2" is drawn against the right-hand axis; with "stack", it is filled
  // from the previous dataset of its stack (or zero) in "fill_color", the chart "stacked".
  function lineConfig(spec) {
    const scales = {x: axis(spec.x_title, {type: 'linear'}), y: valueAxis(spec)};
    if (spec.stacked) scales.y.stacked = true;
    if (spec.y2_title !== undefined)
      scales.y2 = valueAxis(spec, {position: 'right', grid: {drawOnChartArea: false}}, 'y2');
    return {
      type: 'line',
      data: {datasets: spec.datasets.map((d) => {
        const dataset = {
          label: d.label, borderColor: d.color, backgroundColor: d.color,
          borderDash: d.dash ? [6, 4] : [], borderWidth: 1.5,
          pointRadius: d.points.length > 60 ? 0 : 2, spanGaps: false,
          data: d.points.map((p) => ({x: p[0], y: p[1]})),
          errors: d.errors
        };
        if (d.axis) dataset.yAxisID = d.axis;
        if (d.stack) Object.assign(dataset, {stack: d.stack, fill: 'stack', backgroundColor: d.fill_color});
        return dataset;
      })},
      options: {scales: scales}
    };
  }
  function barConfig(spec) {
    return {
      type: 'bar',
      data: {labels: spec.categories, datasets: spec.datasets.map((d) => ({
        label: d.label, borderColor: d.color, backgroundColor: translucent(d.color),
        borderWidth: 1, data: d.values, errors: d.errors
      }))},
      options: {scales: {x: axis(spec.x_title), y: valueAxis(spec, {beginAtZero: !spec.y_log})}}
    };
  }
  function timelineConfig(spec) {
    return {
      type: 'bar',
      data: {labels: spec.categories, datasets: spec.datasets.map((d) => ({
        label: d.label, borderColor: d.color, backgroundColor: translucent(d.color),
        borderWidth: 1, grouped: false, details: d.details,
        data: d.bars.map((b, j) => ({x: b, y: d.rows[j]}))
      }))},
      options: {
        indexAxis: 'y',
        scales: {x: axis(spec.x_title, {beginAtZero: true}), y: axis(spec.y_title)},
        plugins: {tooltip: {callbacks: {
          label: (c) => c.dataset.label + ': ' + c.dataset.details[c.dataIndex]
        }}}
      }
    };
  }

  const grid = document.getElementById('charts');
  specs.forEach((spec) => {
    const card = document.createElement('section');
    card.className = 'card' + (spec.type === 'timeline' ? ' wide' : '');
    card.dataset.chartCard = spec.id;
    const heading = document.createElement('h2');
    heading.textContent = spec.title;
    card.appendChild(heading);
    grid.appendChild(card);
    if (spec.empty) {
      const empty = document.createElement('p');
      empty.className = 'empty';
      empty.dataset.empty = spec.id;
      empty.textContent = spec.empty;
      card.appendChild(empty);
      return;
    }
    const plot = document.createElement('div');
    plot.className = 'plot';
    const canvas = document.createElement('canvas');
    canvas.id = 'chart-' + spec.id;
    canvas.dataset.chart = spec.id;
    plot.appendChild(canvas);
    card.appendChild(plot);
    const config = spec.type === 'line' ? lineConfig(spec)
                 : spec.type === 'bar' ? barConfig(spec) : timelineConfig(spec);
    config.options.animation = false;
    config.options.responsive = true;
    config.options.maintainAspectRatio = false;
    new Chart(canvas, config);
  });
})();
)";

// JSON inside <script>: "</" would end the element, so it is written "<\/" (the same string).
std::string ScriptSafe(std::string text) {
  for (size_t at = text.find("</"); at != std::string::npos; at = text.find("</", at + 3))
    text.replace(at, 2, "<\\/");
  return text;
}

}  // namespace

std::string RunColor(size_t index) {
  static const char* const kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                         "#9467bd", "#8c564b", "#e377c2", "#17becf"};
  return kPalette[index % (sizeof(kPalette) / sizeof(kPalette[0]))];
}

Json ChartSpecs(const std::vector<RunData>& runs) {
  Json charts = Json::array();
  AddGrpoCharts(runs, &charts);
  charts.push_back(LossChart(runs));
  charts.push_back(SeriesChart(runs, "lr", "Learning rate", "lr", &RunData::lr,
                               "no data: no run has metrics.jsonl"));
  charts.push_back(GradNormChart(runs));
  charts.push_back(SeriesChart(runs, "tokens_per_second", "Throughput", "tokens/s",
                               &RunData::tokens_per_second, "no data: no run has metrics.jsonl"));
  charts.push_back(SeriesChart(runs, "mfu", "MFU", "% of peak FLOP/s", &RunData::mfu,
                               "no data: no run logged an MFU (it needs a known peak: "
                               "metrics.peak_gflops or a measured GEMM ceiling)"));
  charts.push_back(EvalChart(runs));
  charts.push_back(ValidationAccuracyChart(runs));
  charts.push_back(SeriesChart(runs, "checkpoint_stall", "Checkpoint stalls",
                               "seconds the step loop waited", &RunData::checkpoint_stall,
                               "no data: no run has checkpoints.jsonl or phase=checkpoint lines "
                               "in launch/attempt-<k>.log"));
  charts.push_back(SeriesChart(runs, "memory_over_steps", "Peak resident memory of rank 0", "MiB",
                               &RunData::rss_peak_mib,
                               "no data: no run's metrics.jsonl has rss_peak_bytes"));
  charts.push_back(MemoryChart(runs));
  charts.push_back(TimelineChart(runs));
  return charts;
}

std::string RenderReport(const std::vector<RunData>& runs, const std::string& title,
                         const std::string& chart_js) {
  char generated[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(generated, sizeof(generated), "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  std::string run_names;
  for (const RunData& run : runs) run_names += (run_names.empty() ? "" : ", ") + run.name;

  std::string html = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  html +=
      "<title>" + XmlEscape(title) + "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n";
  html += "<h1>" + XmlEscape(title) + "</h1>\n";
  html += "<div class=\"generated\">crucible report of " + XmlEscape(run_names) + ", written " +
          generated + "</div>\n";
  html += RunsTable(runs);
  html += "<div class=\"grid\" id=\"charts\"></div>\n";
  const std::string eval_table = EvalTable(runs), attempts_table = AttemptsTable(runs);
  if (!eval_table.empty()) html += "<h2>Eval scores</h2>\n" + eval_table;
  if (const std::string stage_table = StageEvalTable(runs); !stage_table.empty())
    html += "<h2>Stage boundaries (eval/stages.jsonl)</h2>\n" + stage_table;
  if (!attempts_table.empty()) html += "<h2>Launch attempts</h2>\n" + attempts_table;
  html += "<script type=\"application/json\" id=\"report-data\">" +
          ScriptSafe(ChartSpecs(runs).dump(-1, ' ', false, Json::error_handler_t::replace)) +
          "</script>\n";
  // The library's text as it is, but for a "</script" that would end the element early.
  std::string library = chart_js;
  for (size_t at = library.find("</script"); at != std::string::npos;
       at = library.find("</script", at + 3))
    library.replace(at, 2, "<\\/");
  html += "<script>\n" + library + "\n</script>\n";
  html += "<script>" + std::string(kScript) + "</script>\n</body>\n</html>\n";
  return html;
}

}  // namespace crucible
