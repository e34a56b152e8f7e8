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
  double tokens_per_second = 0;
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
  // A mixture of experts' load per routed layer (train/expert_load.h); empty without one.
  std::vector<ExpertLoadSummary> expert_loads;
};

class TrainerHook {
 public:
  virtual ~TrainerHook() = default;
  // After each step, on every rank (a hook that communicates does it on every rank alike).
  // An exit code stops the run with it, once the hook has done what stopping needs.
  virtual std::optional<int> AfterStep(const StepReport&) { return std::nullopt; }
  // Once, when the loop ends: after the last step, or after a hook stopped it (`stopped`).
  virtual void End(bool /*stopped*/) {}
};

}  // namespace crucible
