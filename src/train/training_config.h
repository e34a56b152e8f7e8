// The values the training loop runs with, read from the resolved config and checked once, at
// the start of a run: every part of the trainer takes them from here, none reads the [training],
// [parallelism] or [metrics] keys by name. Model, optimizer, schedule, data and checkpoint keys
// belong to their modules (model/model.h, optim/, data/token_source.h, train/checkpointing.h).
#pragma once

#include <cstdint>
#include <string>

#include "common/config.h"

namespace crucible {

// How one rank's share of a step is cut: `accumulation` micro-batches of micro_batch x seq_len
// tokens each, reduced under ZeRO stage `zero_stage`.
struct TrainingShape {
  int64_t micro_batch = 0, seq_len = 0, accumulation = 0;
  int zero_stage = 1;
  bool overlap = false;  // overlapped gradient reduction (with more than one rank)
};

struct TrainingConfig {
  int64_t steps = 0;
  int world = 1;  // data-parallel ranks
  TrainingShape shape;
  int64_t global_batch = 0;  // samples per step over every rank (resolved, never 0)
  double max_norm = 0;       // the clip of the global gradient norm; 0: off
  int64_t log_freq = 1;      // a progress line every log_freq steps (and at the last)
  // Compare the replicas' hashes every this many steps; 0 (or one rank): never.
  int64_t consistency_check_steps = 0;
  int64_t validation_freq = 0;  // evaluation during training, when [validation] is enabled
  uint64_t seed = 0;            // of the weight init and the synthetic data
  bool metrics_jsonl = true, metrics_per_rank = false, profile = false;
  bool checkpoint_enable = true;
  std::string init_weights, initial_load_hf;  // where the first weights come from, if not init

  int64_t tokens_per_step() const { return global_batch * shape.seq_len; }
  // Samples one rank trains on per step (every micro-batch).
  int64_t samples_per_rank() const { return shape.accumulation * shape.micro_batch; }
  bool check_consistency() const { return world > 1 && consistency_check_steps > 0; }
};

// Reads and checks the trainer's values of `config` (already Validate()d) for `world` ranks, and
// writes the resolved global batch back into it (the run directory records it). UsageError
// (exit 2) naming the key when the global batch is not a multiple of local_batch_size x ranks.
TrainingConfig BuildTrainingConfig(Config& config, int world);

}  // namespace crucible
