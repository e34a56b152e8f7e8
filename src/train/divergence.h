// The divergence guard of the training loop: a run whose weights go non-finite stops with exit 3
// (kExitDiverged) at the step where it happens, naming the step and the first tensor and element
// that went bad. Nothing is saved from a diverged state, so the checkpoints written before stay
// the last word, and no final model.safetensors is written. (A non-finite loss or gradient skips
// the update instead, train/step_guard.h: the weights stay finite, and a run of such skips stops
// the run there.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "distributed/data_parallel.h"
#include "model/parameters.h"

namespace crucible {

// Index of the first non-finite value of values[0, count), or count when all are finite.
// Independent of the thread count.
size_t FirstNonFinite(const float* values, size_t count);

class DivergenceGuard {
 public:
  // `last_checkpoint(step)` names what a run that diverged from the state before `step` leaves
  // to go back to (for the message).
  // `group`: every rank that checks its part (the job).
  DivergenceGuard(const ParameterTable& table, Communicator& group,
                  std::function<std::string(int64_t)> last_checkpoint)
      : table_(table), comm_(group), last_checkpoint_(std::move(last_checkpoint)) {}

  // After the optimizer step: checks weights[i - base] for i in [begin, end), this rank's
  // part. Collective: when any rank holds a non-finite weight, every rank throws
  // Error(kExitDiverged) naming the first one (lowest flat index over all ranks).
  void CheckWeights(const float* weights, size_t base, size_t begin, size_t end,
                    int64_t step) const;
  // Before the final model.safetensors: the full weights of `whole` (the whole model's table).
  void CheckFinalWeights(const float* weights, const ParameterTable& whole) const;

 private:
  // "model.layers.0.mlp.up_proj.weight (element 17 = nan)"
  static std::string Describe(const ParameterTable& table, size_t index, float value);

  const ParameterTable& table_;
  Communicator& comm_;
  std::function<std::string(int64_t)> last_checkpoint_;
};

}  // namespace crucible
