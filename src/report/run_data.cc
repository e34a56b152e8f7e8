#include "report/run_data.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <variant>

#include "common/config.h"
#include "common/error.h"
#include "common/files.h"
#include "common/lines.h"
#include "common/strings.h"

namespace crucible {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Calls `visit` with each record of a JSON-lines file and its 1-based line number. Blank lines
// are skipped; a last line without its newline that does not parse is a record still being
// written and is skipped too.
void ForEachJsonLine(const std::string& path,
                     const std::function<void(const Json&, size_t line)>& visit) {
  const std::string text = ReadFile(path);
  LineSplitter lines(text);
  std::string_view line;
  while (lines.Next(&line)) {
    if (Trim(line).empty()) continue;
    Json record;
    try {
      record = Json::parse(line);
    } catch (const Json::parse_error& e) {
      const bool last_unfinished =
          text.back() != '\n' && line.data() + line.size() == text.data() + text.size();
      if (last_unfinished) return;
      throw DataError(StrFormat("%s:%zu: not a JSON record (%s); fix or remove the line",
                                path.c_str(), lines.line_number(), e.what()));
    }
    if (!record.is_object())
      throw DataError(StrFormat("%s:%zu: expected a JSON object, got %s", path.c_str(),
                                lines.line_number(), record.type_name()));
    visit(record, lines.line_number());
  }
}

// The number at `key`; NaN when it is absent or null. Anything else is a DataError.
double Number(const Json& record, const char* key, const std::string& where) {
  auto it = record.find(key);
  if (it == record.end() || it->is_null()) return kNaN;
  if (!it->is_number())
    throw DataError(
        StrFormat("%s: '%s' should be a number, got %s", where.c_str(), key, it->type_name()));
  return it->get<double>();
}

std::string Text(const Json& record, const char* key) {
  auto it = record.find(key);
  if (it == record.end() || it->is_null()) return "";
  return it->is_string() ? it->get<std::string>() : it->dump();
}

int64_t Step(const Json& record, const std::string& where) {
  auto it = record.find("step");
  if (it == record.end() || !it->is_number_integer())
    throw DataError(where + ": missing integer 'step'");
  return it->get<int64_t>();
}

std::string Where(const std::string& path, size_t line) {
  return path + ":" + std::to_string(line);
}

void ReadMetrics(const std::string& path, RunData* run) {
  ForEachJsonLine(path, [&](const Json& r, size_t line) {
    const std::string where = Where(path, line);
    const double step = static_cast<double>(Step(r, where));
    run->loss.Add(step, Number(r, "loss", where));
    run->lr.Add(step, Number(r, "lr", where));
    run->grad_norm.Add(step, Number(r, "grad_norm", where));
    run->grad_norm_clipped.Add(step, Number(r, "grad_norm_clipped", where));
    run->tokens_per_second.Add(step, Number(r, "tok_per_s", where));
    run->mfu.Add(step, Number(r, "mfu", where));
    run->rss_peak_mib.Add(step, Number(r, "rss_peak_bytes", where) / (1024.0 * 1024.0));
    ++run->metrics_lines;
    if (!r.contains("reward_mean")) return;  // not a GRPO step: its series stay empty
    run->grpo = true;
    GrpoSeries& g = run->grpo_metrics;
    g.reward_mean.Add(step, Number(r, "reward_mean", where));
    g.accuracy.Add(step, Number(r, "accuracy", where));
    g.kl.Add(step, Number(r, "kl", where));
    g.entropy.Add(step, Number(r, "entropy", where));
    g.completion_length.Add(step, Number(r, "completion_length", where));
    g.truncated_rate.Add(step, Number(r, "truncated_rate", where));
    g.generation_seconds.Add(step, Number(r, "generation_s", where));
    g.reward_seconds.Add(step, Number(r, "reward_s", where));
    g.score_seconds.Add(step, Number(r, "score_s", where));
    g.train_seconds.Add(step, Number(r, "train_s", where));
  });
}

EvalScore Score(const std::string& task, const Json& r, const std::string& where) {
  if (!r.is_object()) throw DataError(where + ": task '" + task + "' is not an object");
  EvalScore s;
  s.task = task;
  s.items = static_cast<int64_t>(std::max(0.0, Number(r, "items", where)));
  s.acc = Number(r, "acc", where);
  s.acc_stderr = Number(r, "acc_stderr", where);
  s.acc_norm = Number(r, "acc_norm", where);
  s.acc_norm_stderr = Number(r, "acc_norm_stderr", where);
  s.chance = Number(r, "chance", where);
  return s;
}

void ReadValidation(const std::string& path, RunData* run) {
  EvalSet last;
  ForEachJsonLine(path, [&](const Json& r, size_t line) {
    const std::string where = Where(path, line);
    const double step = static_cast<double>(Step(r, where));
    if (auto held = r.find("held_out"); held != r.end() && held->is_object())
      run->held_out_loss.Add(step, Number(*held, "loss", where));
    auto tasks = r.find("tasks");
    if (tasks == r.end() || !tasks->is_object()) return;
    last = {StrFormat("validation step %lld", static_cast<long long>(step)), {}};
    for (const auto& [task, value] : tasks->items()) {
      EvalScore s = Score(task, value, where);
      Series& series = run->validation_accuracy[task];
      series.Add(step, s.acc);
      series.error.push_back(s.acc_stderr);
      last.scores.push_back(s);
    }
  });
  if (!last.scores.empty()) run->evals.push_back(last);
}

void ReadStageEvals(const std::string& path, RunData* run) {
  ForEachJsonLine(path, [&](const Json& r, size_t line) {
    const std::string where = Where(path, line);
    StageEvalRecord record;
    record.boundary = static_cast<int>(Number(r, "boundary", where));
    auto name = [&](const char* key) {
      auto it = r.find(key);
      return it != r.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    record.stage = name("stage");
    record.next_stage = name("next_stage");
    record.step = Step(r, where);
    if (auto text = r.find("text"); text != r.end() && text->is_object())
      for (const auto& [file, value] : text->items())
        record.bits_per_byte.emplace_back(file, Number(value, "bits_per_byte", where));
    if (auto tasks = r.find("tasks"); tasks != r.end() && tasks->is_object())
      for (const auto& [task, value] : tasks->items())
        record.tasks.push_back(Score(task, value, where));
    if (auto gate = r.find("gate"); gate != r.end() && gate->is_object()) {
      if (gate->value("stopped", false))
        record.gate = "stopped: " + gate->value("task", std::string()) + " after " +
                      gate->value("stage", std::string());
      else if (gate->value("checked", false))
        record.gate = "passed";
    }
    run->stage_evals.push_back(std::move(record));
  });
}

// `crucible eval --json` files: an object with a "tasks" object. Other JSON files are not ours.
void ReadEvalResults(const std::string& eval_dir, RunData* run) {
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(eval_dir))
    if (entry.is_regular_file() && entry.path().extension() == ".json")
      files.push_back(entry.path().filename().string());
  std::sort(files.begin(), files.end());
  for (const std::string& name : files) {
    const std::string path = JoinPath(eval_dir, name);
    Json result;
    try {
      result = Json::parse(ReadFile(path));
    } catch (const Json::parse_error& e) {
      throw DataError(path + ": not JSON (" + e.what() + ")");
    }
    if (!result.is_object() || !result.contains("tasks") || !result["tasks"].is_object()) {
      run->notes.push_back("eval/" + name + ": not a crucible eval --json result (no \"tasks\")");
      continue;
    }
    EvalSet set{"eval/" + name, {}};
    for (const auto& [task, value] : result["tasks"].items())
      set.scores.push_back(Score(task, value, path));
    if (!set.scores.empty()) run->evals.push_back(set);
  }
}

// launch/attempt-<k>.log, in attempt order.
std::vector<std::pair<int, std::string>> AttemptLogs(const std::string& launch_dir) {
  std::vector<std::pair<int, std::string>> logs;
  for (const auto& entry : fs::directory_iterator(launch_dir)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || !StartsWith(name, "attempt-") || !EndsWith(name, ".log"))
      continue;
    const std::string number = name.substr(8, name.size() - 12);
    if (number.empty() || number.find_first_not_of("0123456789") != std::string::npos) continue;
    logs.emplace_back(std::stoi(number), entry.path().string());
  }
  std::sort(logs.begin(), logs.end());
  return logs;
}

// The key=value fields of a trainer line from its "phase=<phase> " on; empty when the line is
// not of that phase. The launcher's "<rank>: " label may come first.
std::map<std::string, std::string> PhaseFields(std::string_view line, std::string_view phase) {
  std::map<std::string, std::string> fields;
  const std::string marker = "phase=" + std::string(phase) + " ";
  const size_t at = line.find(marker);
  if (at == std::string_view::npos || (at > 0 && line[at - 1] != ' ')) return fields;
  for (const std::string& word : Split(line.substr(at), ' ')) {
    const size_t equals = word.find('=');
    if (equals != std::string::npos) fields[word.substr(0, equals)] = word.substr(equals + 1);
  }
  return fields;
}

double FieldNumber(const std::map<std::string, std::string>& fields, const std::string& key) {
  auto it = fields.find(key);
  if (it == fields.end()) return kNaN;
  char* end = nullptr;
  const double value = std::strtod(it->second.c_str(), &end);
  return end != it->second.c_str() && *end == '\0' ? value : kNaN;
}

void ReadCheckpoints(const std::string& path, RunData* run) {
  ForEachJsonLine(path, [&](const Json& r, size_t line) {
    const std::string where = Where(path, line);
    run->checkpoint_stall.Add(static_cast<double>(Step(r, where)), Number(r, "stall_s", where));
  });
  run->checkpoint_source = "checkpoints.jsonl";
}

// The memory figures, in the order the chart shows them.
const char* const kMemoryLabels[] = {"activations (plan)",     "batches (plan)",
                                     "model state (plan)",     "checkpoint buffers (plan)",
                                     "asked on host (plan)",   "available on host",
                                     "peak RSS (largest rank)"};

// Checkpoint stalls (unless checkpoints.jsonl gave them) and memory from the attempt logs; a
// later attempt's figure replaces an earlier one's.
void ReadAttemptLogs(const std::string& launch_dir, RunData* run) {
  const bool stalls_known = !run->checkpoint_source.empty();
  std::map<std::string, double> memory;
  for (const auto& [attempt, path] : AttemptLogs(launch_dir)) {
    const std::string text = ReadFile(path);
    LineSplitter lines(text);
    std::string_view line;
    bool found_memory = false;
    while (lines.Next(&line)) {
      if (line.find("phase=") == std::string_view::npos) continue;
      if (!stalls_known) {
        auto save = PhaseFields(line, "checkpoint");
        if (save.count("stall_s") && save.count("step")) {
          run->checkpoint_stall.Add(FieldNumber(save, "step"), FieldNumber(save, "stall_s"));
          run->checkpoint_source = "launch/attempt-<k>.log";
        }
      }
      auto plan = PhaseFields(line, "memory_check");
      if (!plan.empty()) {
        const char* const keys[] = {"activations_bytes", "batch_bytes", "model_state_bytes",
                                    "checkpoint_bytes",  "asked_bytes", "available_bytes"};
        for (size_t i = 0; i < 6; ++i) memory[kMemoryLabels[i]] = FieldNumber(plan, keys[i]);
        found_memory = true;
      }
      auto peaks = PhaseFields(line, "memory_peak");
      if (peaks.count("rss_bytes_per_rank")) {
        double peak = 0;
        for (const std::string& value : Split(peaks["rss_bytes_per_rank"], ','))
          peak = std::max(peak, std::strtod(value.c_str(), nullptr));
        memory[kMemoryLabels[6]] = peak;
        found_memory = true;
      }
    }
    if (found_memory) run->memory_source = "launch/attempt-" + std::to_string(attempt) + ".log";
  }
  for (const char* label : kMemoryLabels)
    if (auto it = memory.find(label); it != memory.end() && std::isfinite(it->second))
      run->memory.emplace_back(label, it->second);
}

// An integer field; `otherwise` when absent or null.
int64_t Integer(const Json& record, const char* key, const std::string& where, int64_t otherwise) {
  const double value = Number(record, key, where);
  return std::isfinite(value) ? static_cast<int64_t>(value) : otherwise;
}

void ReadAttempts(const std::string& path, RunData* run) {
  ForEachJsonLine(path, [&](const Json& r, size_t line) {
    if (Text(r, "kind") != "attempt") return;  // preflight records
    const std::string where = Where(path, line);
    LaunchAttempt a;
    a.attempt = static_cast<int>(
        Integer(r, "attempt", where, static_cast<int64_t>(run->attempts.size()) + 1));
    a.started = Text(r, "started");
    a.wall_seconds = Number(r, "wall_s", where);
    if (std::isnan(a.wall_seconds)) a.wall_seconds = 0;
    a.exit_code = static_cast<int>(Integer(r, "exit_code", where, -1));
    a.verdict = Text(r, "verdict");
    a.action = Text(r, "action");
    a.detail = Text(r, "detail");
    a.evidence = Text(r, "evidence");
    a.blamed_node = Text(r, "blamed_node");
    if (auto nodes = r.find("nodes"); nodes != r.end() && nodes->is_array())
      for (const Json& node : *nodes)
        a.nodes.push_back(node.is_string() ? node.get<std::string>() : node.dump());
    a.first_step = Integer(r, "first_step", where, -1);
    a.last_step = Integer(r, "last_step", where, -1);
    a.backoff_seconds = Number(r, "backoff_seconds", where);
    if (std::isnan(a.backoff_seconds)) a.backoff_seconds = 0;
    run->attempts.push_back(a);
  });
  // The time line: starts from the recorded clock times; an attempt without a readable start
  // follows the previous one's end.
  double origin = kNaN, previous_end = 0;
  for (size_t i = 0; i < run->attempts.size(); ++i) {
    LaunchAttempt& a = run->attempts[i];
    const double clock = ParseLaunchTime(a.started);
    if (std::isnan(origin) && !std::isnan(clock)) origin = clock;
    a.start_seconds = std::isnan(clock) || std::isnan(origin) ? previous_end : clock - origin;
    // The start is known to the second: an attempt cannot start before the last one ended.
    if (i > 0) a.start_seconds = std::max(a.start_seconds, previous_end);
    a.downtime_before = i > 0 ? a.start_seconds - previous_end : 0;
    previous_end = a.start_seconds + a.wall_seconds;
  }
}

std::string FormatConfigValue(const ConfigValue& value) {
  struct Visitor {
    std::string operator()(bool v) const { return v ? "true" : "false"; }
    std::string operator()(int64_t v) const { return std::to_string(v); }
    std::string operator()(double v) const { return FormatValue(v); }
    std::string operator()(const std::string& v) const { return v; }
    std::string operator()(const std::vector<std::string>& v) const {
      std::string joined;
      for (const auto& item : v) joined += (joined.empty() ? "" : ", ") + item;
      return "[" + joined + "]";
    }
  };
  return std::visit(Visitor{}, value);
}

void ReadConfig(const std::string& path, RunData* run) {
  static const char* const kKeys[] = {"job.name",
                                      "model.flavor",
                                      "training.steps",
                                      "training.seq_len",
                                      "training.global_batch_size",
                                      "training.dataset",
                                      "optimizer.name",
                                      "optimizer.lr",
                                      "lr_scheduler.decay_type",
                                      "parallelism.zero_stage"};
  try {
    const Config config = Config::Load(path, {});
    for (const char* key : kKeys)
      if (Config::FindSpec(key))
        run->config.emplace_back(key, FormatConfigValue(config.Value(key)));
  } catch (const Error& e) {
    run->notes.push_back(std::string("config.toml not summarised: ") + e.what());
  }
}

}  // namespace

bool Series::HasValues() const {
  return std::any_of(y.begin(), y.end(), [](double v) { return std::isfinite(v); });
}

double ParseLaunchTime(const std::string& text) {
  std::tm tm{};
  const char* end = strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (end == nullptr || *end != '\0') return kNaN;
  return static_cast<double>(timegm(&tm));
}

RunData LoadRun(const std::string& dir) {
  if (!IsDirectory(dir))
    throw UsageError(dir + ": not a run directory (" +
                     (FileExists(dir) ? std::string("not a folder") : StatFailure(dir)) + ")");
  RunData run;
  run.dir = dir;
  std::string trimmed = dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  run.name = fs::path(trimmed).filename().string();
  if (run.name.empty() || run.name == "." || run.name == "..")
    run.name = fs::weakly_canonical(fs::absolute(trimmed)).filename().string();

  const std::string metrics = JoinPath(dir, "metrics.jsonl");
  const std::string eval_dir = JoinPath(dir, "eval");
  const std::string launch_dir = JoinPath(dir, "launch");
  const bool has_metrics = FileExists(metrics), has_eval = IsDirectory(eval_dir),
             has_launch = IsDirectory(launch_dir);
  if (!has_metrics && !has_eval && !has_launch)
    throw UsageError(dir +
                     ": not a run directory (no metrics.jsonl, eval/ or launch/); give the "
                     "folder a run wrote (job.dump_folder, launch --run-dir)");

  if (FileExists(JoinPath(dir, "config.toml"))) ReadConfig(JoinPath(dir, "config.toml"), &run);
  if (has_metrics) ReadMetrics(metrics, &run);
  if (has_eval) {
    if (FileExists(JoinPath(eval_dir, "validation.jsonl")))
      ReadValidation(JoinPath(eval_dir, "validation.jsonl"), &run);
    ReadEvalResults(eval_dir, &run);
    if (FileExists(JoinPath(eval_dir, "stages.jsonl")))
      ReadStageEvals(JoinPath(eval_dir, "stages.jsonl"), &run);
    // The validation set sorts last; eval --json files are the final word, so they come first.
    std::stable_partition(run.evals.begin(), run.evals.end(),
                          [](const EvalSet& s) { return StartsWith(s.source, "eval/"); });
  }
  if (FileExists(JoinPath(dir, "checkpoints.jsonl")))
    ReadCheckpoints(JoinPath(dir, "checkpoints.jsonl"), &run);
  if (has_launch) {
    ReadAttemptLogs(launch_dir, &run);
    if (FileExists(JoinPath(launch_dir, "attempts.jsonl")))
      ReadAttempts(JoinPath(launch_dir, "attempts.jsonl"), &run);
  }
  return run;
}

}  // namespace crucible
