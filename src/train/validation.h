// Evaluation during training ([validation]): every `freq` steps, held-out bits per byte and the
// multiple-choice tasks on the current weights, logged to <run>/eval/validation.jsonl and as
// `phase=eval` lines (with a TensorBoard writer also as scalars tagged by their path in the
// record: validation/held_out/loss, validation/tasks/<task>/acc, ...); and the eval gate: after
// `gate_after_steps`, a task whose accuracy is still within one standard error of chance is
// reported loudly (or stops the run, by config). Loss is not proof of learning; downstream
// accuracy is.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "model/model.h"

namespace crucible {

class TensorBoardWriter;

class Validation {
 public:
  // `seq_len`: the longest sequence the model is evaluated on (the training length).
  Validation(const Config& config, std::shared_ptr<const ModelSpec> model,
             const std::string& run_dir, int64_t seq_len);
  ~Validation();
  bool enabled() const { return enabled_; }
  // Evaluates `weights` after `step`; returns false when the gate says stop.
  bool Run(int64_t step, const float* weights, size_t n_params);
  // Also writes each evaluation's numbers to `writer` (not owned; null: not).
  void set_tensorboard(TensorBoardWriter* writer) { tensorboard_ = writer; }

 private:
  struct State;
  bool enabled_ = false;
  int64_t limit_ = 0, gate_after_ = 0;  // (validation.freq >= 1: the schema checks it)
  bool gate_stop_ = false, gate_checked_ = false;
  std::vector<std::string> tasks_;
  std::string held_out_, log_path_;
  std::unique_ptr<State> state_;
  TensorBoardWriter* tensorboard_ = nullptr;
};

}  // namespace crucible
