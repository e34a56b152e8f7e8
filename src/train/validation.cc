#include "train/validation.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/files.h"
#include "common/log.h"
#include "common/strings.h"
#include "eval/eval.h"
#include "train/tensorboard.h"

namespace crucible {

struct Validation::State {
  EvalModel model;
  std::vector<ChoiceTask> tasks;
  std::unique_ptr<TextDocuments> held_out;
};

Validation::Validation(const Config& config, std::shared_ptr<const ModelSpec> model,
                       const std::string& run_dir, int64_t seq_len)
    : enabled_(config.Bool("validation.enable")),
      limit_(config.Int("validation.steps")),
      gate_after_(config.Int("validation.gate_after_steps")),
      tasks_(config.StringList("validation.tasks")),
      held_out_(config.String("validation.held_out")) {
  if (!enabled_) return;
  const std::string& action = config.String("validation.gate_action");
  if (action != "warn" && action != "stop")
    throw UsageError("validation.gate_action: expected warn or stop, got '" + action + "'");
  gate_stop_ = action == "stop";
  if (tasks_.empty() && held_out_.empty())
    throw UsageError(
        "validation.enable is true but neither validation.tasks nor validation.held_out is set");
  const std::string& tokenizer = config.String("model.tokenizer_path");
  if (tokenizer.empty())
    throw UsageError(
        "validation needs model.tokenizer_path (the tokenizer.json the data was made with)");
  state_ = std::make_unique<State>();
  state_->model.spec = std::move(model);
  state_->model.tokenizer = Tokenizer::Load(tokenizer);
  state_->model.max_length = seq_len;
  const int64_t bos = state_->model.tokenizer.bos_id(), eos = state_->model.tokenizer.eos_id();
  state_->model.prefix_token_id = bos >= 0 ? bos : (eos >= 0 ? eos : 0);
  state_->model.kind = "training";
  for (const std::string& path : tasks_) state_->tasks.push_back(LoadChoiceTask(path));
  if (!held_out_.empty())
    state_->held_out = std::make_unique<TextDocuments>(LoadTextDocuments(held_out_));
  const std::string dir = JoinPath(run_dir, "eval");
  MakeDirectories(dir);
  log_path_ = JoinPath(dir, "validation.jsonl");
}

Validation::~Validation() = default;

bool Validation::Run(int64_t step, const float* weights, size_t n_params) {
  state_->model.weights.assign(weights, weights + n_params);
  EvalOptions options;
  options.limit = limit_;
  nlohmann::json record = {{"step", step}};
  if (state_->held_out) {
    PerplexityResult r = EvaluatePerplexity(state_->model, *state_->held_out, options);
    PrintLine(StrFormat("phase=eval step=%lld held_out=%s loss=%.6f bits_per_byte=%.6f tokens=%lld",
                        (long long)step, r.name.c_str(), r.tokens ? r.nats / r.tokens : 0.0,
                        r.bits_per_byte, (long long)r.tokens));
    record["held_out"] = {{"name", r.name},
                          {"loss", r.tokens ? r.nats / r.tokens : 0.0},
                          {"bits_per_byte", r.bits_per_byte},
                          {"tokens", r.tokens}};
  }
  bool keep_going = true;
  const bool gate = gate_after_ > 0 && step >= gate_after_ && !gate_checked_;
  for (const ChoiceTask& task : state_->tasks) {
    ChoiceResult r = EvaluateChoiceTask(state_->model, task, options);
    PrintLine(
        StrFormat("phase=eval step=%lld task=%s items=%lld acc=%.4f acc_norm=%.4f stderr=%.4f "
                  "chance=%.4f",
                  (long long)step, r.name.c_str(), (long long)r.items, r.acc, r.acc_norm,
                  r.acc_stderr, r.chance));
    record["tasks"][r.name] = {{"items", r.items},
                               {"acc", r.acc},
                               {"acc_stderr", r.acc_stderr},
                               {"acc_norm", r.acc_norm},
                               {"acc_norm_stderr", r.acc_norm_stderr},
                               {"chance", r.chance}};
    if (gate && r.acc - r.chance <= std::max(r.acc_stderr, 1e-12)) {
      LogWarn(
          StrFormat("EVAL GATE: after %lld steps task %s is still at chance: acc %.4f, acc_norm "
                    "%.4f, chance %.4f, standard error %.4f. The loss may fall while the model "
                    "learns nothing useful: check the data, the learning rate and the metrics.",
                    (long long)step, r.name.c_str(), r.acc, r.acc_norm, r.chance, r.acc_stderr));
      if (gate_stop_) keep_going = false;
    }
  }
  if (gate) gate_checked_ = true;
  if (tensorboard_) tensorboard_->WriteScalars(step, ScalarsOfRecord(record, "validation/"));
  std::string line = record.dump() + "\n";
  std::string previous = FileExists(log_path_) ? ReadFile(log_path_) : "";
  AtomicWriteFile(log_path_, previous + line);
  return keep_going;
}

}  // namespace crucible
