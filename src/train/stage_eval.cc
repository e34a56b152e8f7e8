// The stage evaluation hook (train/stage_eval.h): like [validation] (train/step_hooks.cc), every
// rank takes part in gathering the full weights and rank 0 scores them with src/eval's scorer,
// so the numbers are those of `crucible eval` on the same weights at any data-parallel degree
// or ZeRO stage; the gate's decision is shared so every rank stops at the same boundary.
#include "train/stage_eval.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/files.h"
#include "common/log.h"
#include "common/strings.h"
#include "eval/eval.h"
#include "train/trainer.h"

namespace crucible {
namespace {

// The name `crucible eval` gives a task or text file: its file name without .jsonl/.json/.txt.
std::string JoinNames(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

struct TextSpec {
  std::string name, path, stage;  // stage: the stage whose eval_text it is; "" for stage_eval.text
};

class StageEvalHook : public TrainerHook {
 public:
  StageEvalHook(Trainer& trainer, std::shared_ptr<const ModelSpec> model) : trainer_(trainer) {
    const Config& config = trainer.config();
    const std::vector<DataStage>& stages = trainer.training().stages;
    task_paths_ = config.StringList("stage_eval.tasks");
    gate_tasks_ = config.StringList("stage_eval.gate_tasks");
    items_ = config.Int("stage_eval.items");
    margin_ = config.Float("stage_eval.gate_margin");
    metric_ = config.String("stage_eval.gate_metric");
    if (metric_ != "acc" && metric_ != "acc_norm")
      throw UsageError("stage_eval.gate_metric = \"" + metric_ + "\": expected acc or acc_norm");
    auto add_text = [&](const std::string& path, const std::string& stage, const char* key) {
      for (const TextSpec& t : texts_) {
        if (t.path == path) return;
        if (t.name == EvalFileName(path))
          throw UsageError(StrFormat(
              "%s: \"%s\" and \"%s\" are both named '%s' in eval/stages.jsonl; rename one", key,
              t.path.c_str(), path.c_str(), t.name.c_str()));
      }
      if (const std::string missing = StatFailure(path); !missing.empty() || IsDirectory(path))
        throw UsageError(StrFormat("%s: \"%s\": %s; name a held-out text file", key, path.c_str(),
                                   missing.empty() ? "is a directory" : missing.c_str()));
      texts_.push_back({EvalFileName(path), path, stage});
    };
    for (const std::string& path : config.StringList("stage_eval.text"))
      add_text(path, "", "stage_eval.text");
    for (const DataStage& s : stages)
      for (const std::string& path : s.eval_text)
        add_text(path, s.name, ("[[data.stages]] \"" + s.name + "\" eval_text").c_str());
    std::vector<std::string> names;
    for (const std::string& path : task_paths_) {
      if (const std::string missing = StatFailure(path); !missing.empty())
        throw UsageError(StrFormat("stage_eval.tasks: \"%s\": %s; name a task file (docs/eval.md)",
                                   path.c_str(), missing.c_str()));
      const std::string name = EvalFileName(path);
      if (std::find(names.begin(), names.end(), name) != names.end())
        throw UsageError("stage_eval.tasks: two task files are named '" + name +
                         "' (the file name without .jsonl); rename one");
      names.push_back(name);
    }
    for (const std::string& name : gate_tasks_)
      if (std::find(names.begin(), names.end(), name) == names.end())
        throw UsageError(
            "stage_eval.gate_tasks: '" + name + "' is not a task of stage_eval.tasks" +
            (names.empty() ? std::string(" (none is given)") : " (" + JoinNames(names) + ")") +
            "; name tasks by their file name without .jsonl");
    enabled_ = !task_paths_.empty() || !texts_.empty();
    if (stages.empty()) {
      if (enabled_ || !gate_tasks_.empty())
        throw UsageError(
            std::string(task_paths_.empty() && texts_.empty() ? "stage_eval.gate_tasks"
                        : task_paths_.empty()                 ? "stage_eval.text"
                                                              : "stage_eval.tasks") +
            " is set but the run has no [[data.stages]]: stage evaluations run at stage "
            "boundaries; add stages, or evaluate every N steps with [validation]");
      return;
    }
    if (!enabled_) return;
    const std::string& tokenizer = config.String("model.tokenizer_path");
    if (tokenizer.empty())
      throw UsageError(
          "stage_eval needs model.tokenizer_path (the tokenizer.json the data was made with)");
    log_path_ = JoinPath(JoinPath(trainer.run_dir(), "eval"), "stages.jsonl");
    if (!trainer.leader()) return;
    model_.spec = std::move(model);
    model_.tokenizer = Tokenizer::Load(tokenizer);
    model_.max_length = trainer.training().shape.seq_len;
    const int64_t bos = model_.tokenizer.bos_id(), eos = model_.tokenizer.eos_id();
    model_.prefix_token_id = bos >= 0 ? bos : (eos >= 0 ? eos : 0);
    model_.kind = "training";
    for (const std::string& path : task_paths_) tasks_.push_back(LoadChoiceTask(path));
    for (const TextSpec& t : texts_) documents_.push_back(LoadTextDocuments(t.path));
    MakeDirectories(JoinPath(trainer.run_dir(), "eval"));
  }

  std::optional<int> AtStageBoundary(const StageBoundary& boundary) override {
    if (!enabled_) return std::nullopt;
    const float* weights = trainer_.FullWeights();
    bool stop = false;
    if (trainer_.leader()) stop = Evaluate(boundary, weights);
    trainer_.ReleaseFullCopies();
    trainer_.comm().Barrier("stage evaluation");
    if (!trainer_.AnyRank(stop, "stage gate flag")) return std::nullopt;
    KeepBoundaryCheckpoint(boundary.step);
    trainer_.comm().Barrier("stage gate");
    return kExitDiverged;
  }

  // The progress a checkpoint of the boundary's step records.
  std::optional<int> AfterStep(const StepReport& report) override {
    if (!enabled_ || gate_tasks_.empty()) return std::nullopt;
    last_ = {report.step,
             report.consumed_samples,
             report.tokens_seen,
             report.loss,
             report.lr,
             trainer_.GuardState(),
             trainer_.StepBatchesState(report.step)};
    return std::nullopt;
  }

 private:
  // What a stopped run keeps: the checkpoint of the boundary's step (saved now when the interval
  // did not, as a stop signal's is), complete. A run resumed at the boundary has it already.
  void KeepBoundaryCheckpoint(int64_t step) {
    Checkpointing& checkpointing = trainer_.checkpointing();
    const bool leader = trainer_.leader();
    if (checkpointing.enabled() && last_.step == step &&
        trainer_.AnyRank(leader && checkpointing.last_saved_step() != step, "stage gate save")) {
      trainer_.GatherOptimizerState();
      const float* weights = trainer_.FullWeights();
      if (leader) checkpointing.Save(last_, weights, true, "stage_gate");
      trainer_.ReleaseFullCopies();
    }
    if (leader) checkpointing.Finish();
  }

  // Rank 0: scores the weights, writes the boundary's line; true when the gate stops the run.
  bool Evaluate(const StageBoundary& b, const float* weights) {
    model_.weights.assign(weights, weights + trainer_.whole_table().total());
    EvalOptions options;
    options.limit = items_;
    auto name_or_null = [](const std::string& name) {
      return name.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(name);
    };
    nlohmann::ordered_json record = {{"boundary", b.finished},
                                     {"stage", name_or_null(b.finished_name)},
                                     {"next_stage", name_or_null(b.next_name)},
                                     {"step", b.step},
                                     {"tokens_seen", b.tokens_seen}};
    const std::string where =
        StrFormat("phase=stage_eval boundary=%d step=%lld", b.finished, (long long)b.step);
    record["text"] = nlohmann::ordered_json::object();
    for (size_t i = 0; i < texts_.size(); ++i) {
      const PerplexityResult r = EvaluatePerplexity(model_, documents_[i], options);
      const double loss = r.tokens ? r.nats / r.tokens : 0.0;
      PrintLine(StrFormat("%s text=%s loss=%.6f bits_per_byte=%.6f tokens=%lld", where.c_str(),
                          texts_[i].name.c_str(), loss, r.bits_per_byte, (long long)r.tokens));
      record["text"][texts_[i].name] = {{"path", texts_[i].path},
                                        {"stage", name_or_null(texts_[i].stage)},
                                        {"documents", r.documents},
                                        {"tokens", r.tokens},
                                        {"bytes", r.bytes},
                                        {"loss", loss},
                                        {"bits_per_byte", r.bits_per_byte}};
    }
    record["tasks"] = nlohmann::ordered_json::object();
    for (const ChoiceTask& task : tasks_) {
      const ChoiceResult r = EvaluateChoiceTask(model_, task, options);
      PrintLine(StrFormat("%s task=%s items=%lld acc=%.4f acc_norm=%.4f stderr=%.4f", where.c_str(),
                          r.name.c_str(), (long long)r.items, r.acc, r.acc_norm, r.acc_stderr));
      record["tasks"][r.name] = {{"path", r.path},         {"items", r.items},
                                 {"acc", r.acc},           {"acc_stderr", r.acc_stderr},
                                 {"acc_norm", r.acc_norm}, {"acc_norm_stderr", r.acc_norm_stderr},
                                 {"chance", r.chance}};
    }
    // The lines of earlier boundaries stay; this boundary's line (a resume passes it again) and
    // any later one (from a run that went further before it was resumed here) are replaced.
    std::vector<nlohmann::ordered_json> kept;
    if (FileExists(log_path_))
      for (const std::string& line : Split(ReadFile(log_path_), '\n')) {
        if (line.empty()) continue;
        nlohmann::ordered_json earlier = nlohmann::ordered_json::parse(line, nullptr, false);
        if (earlier.is_discarded() || !earlier.contains("boundary") ||
            !earlier["boundary"].is_number_integer()) {
          LogWarn(log_path_ + ": dropping a line that is not a stage evaluation record");
          continue;
        }
        if (earlier["boundary"].get<int>() < b.finished) kept.push_back(std::move(earlier));
      }
    const bool stop = Gate(b, kept, &record);
    std::string text;
    for (const nlohmann::ordered_json& line : kept) text += line.dump() + "\n";
    text += record.dump() + "\n";
    AtomicWriteFile(log_path_, text);
    return stop;
  }

  // The gate at boundary `b` against the line of the boundary before it (the ended stage's
  // start); records its verdict in `record`.
  bool Gate(const StageBoundary& b, const std::vector<nlohmann::ordered_json>& kept,
            nlohmann::ordered_json* record) {
    if (gate_tasks_.empty()) return false;
    nlohmann::ordered_json gate = {
        {"metric", metric_}, {"margin", margin_}, {"checked", false}, {"stopped", false}};
    const nlohmann::ordered_json* before = nullptr;
    for (const nlohmann::ordered_json& line : kept)
      if (line["boundary"].get<int>() == b.finished - 1) before = &line;
    if (b.finished > 0 && !before)
      LogWarn(StrFormat(
          "stage gate: %s has no line for boundary %d (before stage %s); the "
          "gate cannot compare stage %s's accuracy with its start and lets it pass",
          log_path_.c_str(), b.finished - 1, b.finished_name.c_str(), b.finished_name.c_str()));
    if (b.finished > 0 && before) {
      gate["checked"] = true;
      gate["failed"] = nlohmann::ordered_json::array();
      for (const std::string& name : gate_tasks_) {
        const nlohmann::ordered_json& then = (*before)["tasks"];
        if (!then.contains(name) || !then[name].contains(metric_)) continue;
        const double reference = then[name][metric_].get<double>();
        const double value = (*record)["tasks"][name][metric_].get<double>();
        if (!(value < reference - margin_)) continue;
        gate["failed"].push_back({{"task", name}, {"value", value}, {"reference", reference}});
        if (gate["stopped"].get<bool>()) continue;
        gate["stopped"] = true;
        gate["stage"] = b.finished_name;
        gate["task"] = name;
        LogError(StrFormat(
            "stage gate: task %s %s %.4f < %.4f %c %g after stage %s (step %lld); %s (exit 3)",
            name.c_str(), metric_.c_str(), value, reference, margin_ < 0 ? '+' : '-',
            std::abs(margin_), b.finished_name.c_str(), (long long)b.step,
            b.next > 0 ? ("stopping before stage " + b.next_name).c_str()
                       : "stopping at the end of the run (model.safetensors is not written; the "
                         "last checkpoint is kept)"));
      }
    }
    (*record)["gate"] = gate;
    return gate["stopped"].get<bool>();
  }

  Trainer& trainer_;
  bool enabled_ = false;
  std::vector<std::string> task_paths_, gate_tasks_;
  std::vector<TextSpec> texts_;
  int64_t items_ = 0;
  double margin_ = 0;
  std::string metric_, log_path_;
  TrainingProgress last_;  // of the last step run by this process (step 0: none)
  // Rank 0's.
  EvalModel model_;
  std::vector<ChoiceTask> tasks_;
  std::vector<TextDocuments> documents_;
};

}  // namespace

std::unique_ptr<TrainerHook> MakeStageEvalHook(Trainer& trainer,
                                               std::shared_ptr<const ModelSpec> model) {
  return std::make_unique<StageEvalHook>(trainer, std::move(model));
}

}  // namespace crucible
