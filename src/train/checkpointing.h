// The trainer's side of checkpoints: when to save ([checkpoint] interval, a number of steps or
// "auto" from the Young/Daly rule), copying the training state into a host snapshot and handing
// it to a background writer (or writing it in place), retention, the stall report, and resume
// (which checkpoint, config compatibility, loading the state back).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/async_writer.h"
#include "ckpt/checkpoint.h"
#include "common/config.h"
#include "data/batch_schedule.h"
#include "model/model.h"
#include "model/parameters.h"
#include "optim/optimizer_shard.h"

namespace crucible {

// What the loop knows at the end of a step, recorded in state.json.
struct TrainingProgress {
  int64_t step = 0;
  int64_t consumed_samples = 0;  // the data cursor: the next sample index to read
  int64_t tokens_seen = 0;
  double loss = 0;
  double lr = 0;
  nlohmann::json guards;  // the step guards' state (train/step_guard.h); null: none recorded
  // What a StepBatches needs to resume (StepBatches::CheckpointState), state.json's
  // "step_batches"; null: none recorded.
  nlohmann::json step_batches;
};

struct ResumePoint {
  bool resumed = false;
  std::string path;
  TrainingProgress progress;
};

class Checkpointing {
 public:
  // `config` is the fully resolved config of this run (model keys and global batch resolved);
  // `batches` its global batch of every step (a resumed checkpoint's data cursor must match).
  // `rank` of `world_size` ranks: only rank 0 writes checkpoints. `model`, `table` and
  // `batches` must outlive it.
  Checkpointing(const Config& config, const std::string& run_dir, const ModelSpec& model,
                const ParameterTable& table, OptimizerShard* optimizer,
                const BatchSchedule& batches, int rank, int world_size);
  ~Checkpointing();

  bool enabled() const { return enabled_; }
  const std::string& root() const { return root_; }

  // Whether Resume(mode) may load a checkpoint (false: it certainly starts from step 0).
  bool HasCheckpointToResume(const std::string& mode) const;
  // --resume auto|none|PATH. Loads weights and optimizer state when a checkpoint is chosen.
  ResumePoint Resume(const std::string& mode, float* weights);

  // Feeds the step time to the "auto" interval.
  void NoteStepTime(double seconds);
  // Whether step `step` (of `last_step`) should be saved by the interval rule.
  bool Due(int64_t step, int64_t last_step) const;
  // Saves the state after `progress.step`: asynchronously when [checkpoint] async and not
  // `synchronous`. Prints the phase=checkpoint lines with the stall.
  void Save(const TrainingProgress& progress, const float* weights, bool synchronous,
            const std::string& reason);
  // Rethrows the error of a background save that has failed (exit 74 for I/O).
  void Poll();
  // Waits for a background save to finish; rethrows its error.
  void Finish();
  int64_t last_saved_step() const { return last_saved_step_; }

 private:
  void CopySnapshot(const TrainingProgress& progress, const float* weights);
  void WriteSnapshot();  // on the writer thread or the caller's
  void ReviseInterval(bool after_save);
  uint64_t StateBytes() const;

  const Config& config_;
  std::string run_dir_, root_;
  const ModelSpec& model_;
  const ParameterTable& table_;
  OptimizerShard* optimizer_;  // covers every parameter
  const BatchSchedule& batches_;
  int rank_;
  int world_size_;
  bool enabled_ = true, async_ = true, auto_interval_ = false;
  int64_t interval_steps_ = 0, keep_latest_k_ = 0, keep_every_n_ = 0;
  int64_t last_saved_step_ = -1, next_auto_save_ = -1;
  std::string config_hash_;
  CheckpointSnapshot snapshot_;
  AsyncWriter writer_;
  // Evidence for the "auto" interval.
  double mtbf_seconds_ = 0;
  std::string mtbf_source_;
  double cost_sum_ = 0, step_seconds_sum_ = 0;
  int64_t cost_count_ = 0, step_count_ = 0;
};

}  // namespace crucible
