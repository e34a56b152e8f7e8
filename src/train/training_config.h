// The values the training loop runs with, read from the resolved config and checked once, at
// the start of a run: every part of the trainer takes them from here, none reads the [training],
// [parallelism] or [metrics] keys by name. Model, optimizer, schedule, data and checkpoint keys
// belong to their modules (model/model.h, optim/, data/token_source.h, train/checkpointing.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "compute/backend.h"
#include "data/batch_schedule.h"
#include "data/stages.h"
#include "distributed/exact_sum.h"

namespace crucible {

// How one rank's share of a step is cut: `accumulation` micro-batches of micro_batch x seq_len
// tokens each, reduced under ZeRO stage `zero_stage`.
struct TrainingShape {
  int64_t micro_batch = 0, seq_len = 0, accumulation = 0;
  int zero_stage = 1;
  ExactGrid exact_grid;  // [parallelism] exact_reduction
  bool overlap = false;  // overlapped gradient reduction (with more than one rank)
  // The training forward keeps a micro-batch's whole logits (ForwardOptions::Logits): a
  // StepBatches whose loss weights come from the forward (GRPO; the Trainer's `whole_logits`).
  // An optimizer's Hessian pass keeps them too; the memory plan counts them for either.
  bool whole_logits = false;
};

// The step guards (train/step_guard.h): [training] max_consecutive_skips, spike_*,
// grad_norm_rise_warn and the test-only debug.skip_steps.
enum class SpikeMetric { kOff, kLoss, kGradNorm };
struct GuardConfig {
  int64_t max_consecutive_skips = 0;  // 0: never stop for skips
  SpikeMetric spike_metric = SpikeMetric::kOff;
  int64_t spike_window = 0, spike_warmup = 0, spike_limit = 0;
  double spike_k = 0;
  double grad_norm_rise_warn = 0;   // 0: off
  std::vector<int64_t> skip_steps;  // test only
};

// How the LR follows a batch-size ramp: kept, or scaled by (batch / base) or its square root.
enum class RampLrRule { kConstant, kLinear, kSqrt };

struct TrainingConfig {
  int64_t steps = 0;
  int world = 1;  // data-parallel ranks
  TrainingShape shape;
  int64_t global_batch = 0;  // samples per step 1 over every rank (resolved, never 0)
  // Every step's global batch: global_batch throughout, or the stages of training.batch_ramp.
  BatchSchedule batches;
  // [[data.stages]], resolved onto the steps (data/stages.h); empty: a run of one piece. With
  // stages, steps is their total.
  std::vector<DataStage> stages;
  RampLrRule ramp_lr = RampLrRule::kConstant;
  GuardConfig guards;
  double max_norm = 0;   // the clip of the global gradient norm; 0: off
  int64_t log_freq = 1;  // a progress line every log_freq steps (and at the last)
  // Compare the replicas' hashes every this many steps; 0 (or one rank): never.
  int64_t consistency_check_steps = 0;
  int64_t validation_freq = 0;  // evaluation during training, when [validation] is enabled
  uint64_t seed = 0;            // of the weight init and the synthetic data
  BackendOptions backend;       // training.device, mixed_precision_param; the local rank
  bool metrics_jsonl = true, metrics_per_rank = false, profile = false;
  // TensorBoard event files (train/tensorboard.h) in this folder, resolved against the run
  // directory; empty: none.
  std::string tensorboard_folder;
  bool checkpoint_enable = true;
  std::string init_weights, initial_load_hf;  // where the first weights come from, if not init

  int64_t tokens_per_step(int64_t step) const { return batches.GlobalBatch(step) * shape.seq_len; }
  // Micro-batches one rank runs in `step` (shape.accumulation is step 1's).
  int64_t accumulation(int64_t step) const {
    return batches.GlobalBatch(step) / (shape.micro_batch * world);
  }
  int64_t max_accumulation() const {
    return batches.MaxGlobalBatch() / (shape.micro_batch * world);
  }
  // The factor of the scheduled LR at `step` (1 without a ramp, or under "constant").
  double LrFactor(int64_t step) const;
  bool check_consistency() const { return world > 1 && consistency_check_steps > 0; }
};

// Reads and checks the trainer's values of `config` (already Validate()d) for `world` ranks, and
// writes the resolved global batch back into it (the run directory records it). UsageError
// (exit 2) naming the key when the global batch is not a multiple of local_batch_size x ranks,
// when a batch_ramp stage is malformed, out of order, not such a multiple or never reached, and
// when guard keys contradict each other. With [[data.stages]]: the stages are read and placed
// (ResolveDataStages), training.steps, when given, must equal their total (else exit 2), and the
// total is written back as training.steps.
TrainingConfig BuildTrainingConfig(Config& config, int world);
// [training] device, mixed_precision_param/_reduce, [debug] bf16_path, gemm_library and the local
// rank, as
// BuildTrainingConfig reads them (also for `crucible model grads`). UsageError for a bad value.
BackendOptions BuildBackendOptions(const Config& config);

}  // namespace crucible
