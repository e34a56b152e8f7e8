#include "train/training_config.h"

#include "common/error.h"
#include "common/strings.h"

namespace crucible {

TrainingConfig BuildTrainingConfig(Config& config, int world) {
  TrainingConfig t;
  t.world = world;
  t.steps = config.Int("training.steps");
  t.shape.seq_len = config.Int("training.seq_len");
  t.shape.micro_batch = config.Int("training.local_batch_size");
  t.global_batch = config.Int("training.global_batch_size");
  if (t.global_batch == 0) t.global_batch = t.shape.micro_batch * world;
  if (t.global_batch % (t.shape.micro_batch * world) != 0)
    throw UsageError(StrFormat(
        "training.global_batch_size (%lld) must be a positive multiple of local_batch_size x ranks "
        "(%lld x %d)",
        (long long)t.global_batch, (long long)t.shape.micro_batch, world));
  config.Set("training.global_batch_size", t.global_batch);
  t.shape.accumulation = t.global_batch / (t.shape.micro_batch * world);
  t.shape.zero_stage = static_cast<int>(config.Int("parallelism.zero_stage"));
  t.shape.overlap = config.Bool("parallelism.overlap_grad_reduce") && world > 1;
  t.max_norm = config.Float("training.max_norm");
  t.log_freq = config.Int("metrics.log_freq");
  t.consistency_check_steps = config.Int("parallelism.consistency_check_steps");
  t.validation_freq = config.Int("validation.freq");
  t.seed = static_cast<uint64_t>(config.Int("debug.seed"));
  t.metrics_jsonl = config.Bool("metrics.enable_jsonl");
  t.metrics_per_rank = config.Bool("metrics.per_rank");
  t.profile = config.Bool("metrics.profile");
  t.checkpoint_enable = config.Bool("checkpoint.enable");
  t.init_weights = config.String("model.init_weights");
  t.initial_load_hf = config.String("checkpoint.initial_load_hf");
  return t;
}

}  // namespace crucible
