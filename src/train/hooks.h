// What the training loop tells the parts that watch it: after every step a StepReport goes to
// each hook in turn (metrics, then validation, then checkpoints and stop signals; see
// train/trainer.h), and each may stop the run. A new consumer of the step (a report, an eval of
// its own, an RL rollout trigger) is one more hook, not a branch in the step.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "train/expert_load.h"

namespace crucible {

// One step, as every rank saw it (the local_* values are this rank's own).
struct StepReport {
  int64_t step = 0;
  bool last = false;  // the run's last step
  double loss = 0;    // the global batch's mean loss, as logged
  // The model's auxiliary loss over the same weight sum (LossSum::aux; the objective is
  // loss + aux_loss); NaN for a model without one (ModelSpec::has_aux_loss).
  double aux_loss = std::nan("");
  double lr = 0;
  double grad_norm = 0;          // before clipping; NaN when a gradient was not finite
  double grad_norm_clipped = 0;  // after clipping; NaN when the update was skipped
  bool skipped = false;          // the update was skipped (train/step_guard.h)
  int64_t skipped_total = 0;     // updates skipped since step 1
  int64_t global_batch = 0;      // samples of this step over every rank (a batch ramp grows it)
  int64_t consumed_samples = 0;  // global samples read by the end of this step
  int64_t tokens_seen = 0;
  double tokens_per_second = 0;  // inputs of the global batch, padding included
  // A source that pads (SFT, TokenSource::pads): the global batch's padded inputs and its other
  // share of all its inputs, and its other inputs per second; -1 and NaN otherwise.
  int64_t padding_tokens = -1;
  double padding_share = std::nan("");
  double content_tokens_per_second = std::nan("");
  double mfu = 0;  // percent; rank 0 only, NaN when not known
  double step_seconds = 0;
  double reduce_wait_seconds = 0;  // waited for the gradient reductions the backward did not hide
  // This rank's seconds in expert parallelism's all-to-alls (waiting included); NaN without it.
  double expert_exchange_seconds = std::nan("");
  double local_loss_sum = 0;       // this rank's micro-batches' loss sum
  int64_t local_valid_tokens = 0;  // and its targets that count
  // The optimizer's metrics of the step (Optimizer::metrics, reduced over every rank), by name;
  // empty when it declares none or the update was skipped.
  std::vector<std::pair<std::string, double>> optimizer_metrics;
  // The step's batch source's metrics (Trainer::SetStepBatches, StepBatches::Metrics), by name;
  // empty for the DataLoader.
  std::vector<std::pair<std::string, double>> source_metrics;
  // A mixture of experts' load per routed layer (train/expert_load.h); empty without one.
  std::vector<ExpertLoadSummary> expert_loads;
  // The training stage of the step ([[data.stages]], from 1) and its name; 0 and "" without.
  int stage = 0;
  std::string stage_name;
};

// A boundary of a run in stages ([[data.stages]]): before the first stage, between stage k and
// k + 1, after the last.
struct StageBoundary {
  int finished = 0;         // the stage (from 1) that just ended; 0 before the first
  int next = 0;             // the stage about to begin; 0 after the last
  int64_t step = 0;         // the last step run: the finished stage's last, 0 before the first
  int64_t tokens_seen = 0;  // tokens trained on by the end of `step`
  std::string finished_name, next_name;  // "" where the index is 0
};

class TrainerHook {
 public:
  virtual ~TrainerHook() = default;
  // After each step, on every rank (a hook that communicates does it on every rank alike).
  // An exit code stops the run with it, once the hook has done what stopping needs.
  virtual std::optional<int> AfterStep(const StepReport&) { return std::nullopt; }
  // At each stage boundary of a run in stages, on every rank alike: before the first step of
  // a fresh run, and after the step hooks of each stage's last step (so a checkpoint of that
  // step, when one is due, is written first). A run resumed from the checkpoint of a boundary's
  // step passes that boundary again, before its first step: a hook that records something per
  // boundary keeps the record idempotent. The place for evaluations between stages and a gate
  // that stops a stage; an exit code stops the run as AfterStep's does.
  virtual std::optional<int> AtStageBoundary(const StageBoundary&) { return std::nullopt; }
  // Once, when the loop ends: after the last step, or after a hook stopped it (`stopped`).
  virtual void End(bool /*stopped*/) {}
};

}  // namespace crucible
