// The step guards of the training loop: before each optimizer update, StepGuard decides whether
// the update is skipped (the weights and the optimizer state then stay exactly as they were;
// the step's data is consumed and the LR schedule moves on, as for any step):
//   non-finite   the step's loss, or the global gradient norm, is not finite (a NaN or inf
//                gradient on any rank);
//   spike        with training.spike_skip = loss or grad_norm, that value is more than
//                spike_k standard deviations above the mean of the last spike_window accepted
//                steps (armed once the window holds spike_warmup of them; OLMo-style);
//   configured   debug.skip_steps (test only: the reference a guarded run is compared with).
// Skips are counted (StepReport, metrics.jsonl `skipped`, the step= line). A run of
// training.max_consecutive_skips skipped updates in a row, or of spike_limit spikes in a row,
// stops the run with exit 3 (kExitDiverged, never retried) naming the step the streak began at
// and the checkpoint to roll back to: the last from before the streak, since a skipped step
// writes no interval checkpoint (train/step_hooks.cc), and one from before that when the streak
// began with a non-finite loss or gradient at the first step after it (its state gave them). It
// also warns when the gradient norm rises by training.grad_norm_rise_warn in one step. Every rank
// sees the same loss and norm, so every rank decides alike. Its state (counts, the window) goes
// into the checkpoint's state.json, so a resumed run decides as the uninterrupted one would.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "train/training_config.h"

namespace crucible {

class StepGuard {
 public:
  // `leader`: this rank prints the log lines. `last_checkpoint(step)` names what a stopped run
  // leaves to roll back to when the trouble began from the state before `step` (0: a streak that
  // did not begin with a non-finite value, which says nothing of that state).
  StepGuard(const GuardConfig& config, bool leader,
            std::function<std::string(int64_t)> last_checkpoint);

  // Before the update of `step`, with the step's global loss and pre-clip gradient norm (NaN
  // when a gradient was not finite): whether to skip the update. Logs a line when a guard fires;
  // throws Error(kExitDiverged) when a limit is reached.
  bool SkipUpdate(int64_t step, double loss, double grad_norm);
  int64_t skipped() const { return skipped_; }  // skipped updates since step 1

  // What a checkpoint records, and loads back on resume (null: a checkpoint without it, from
  // before the guards; the state starts empty). DataError (exit 65) when it is malformed.
  nlohmann::json State() const;
  void Restore(const nlohmann::json& state);

 private:
  // Why `value` would be a spike ("" when it is not, or the window is not armed yet).
  std::string SpikeReason(double value) const;
  void Accept(double value);
  void WarnOnRise(int64_t step, double grad_norm);
  [[noreturn]] void Stop(int64_t step, const std::string& why) const;

  GuardConfig config_;
  bool leader_;
  std::function<std::string(int64_t)> last_checkpoint_;
  int64_t skipped_ = 0, consecutive_skips_ = 0, consecutive_spikes_ = 0;
  bool streak_non_finite_ = false;  // the streak of skips began with a non-finite loss or norm
  std::deque<double> window_;       // the watched value of the last accepted steps, oldest first
  double previous_norm_ = NAN;      // the previous step's pre-clip gradient norm
};

}  // namespace crucible
