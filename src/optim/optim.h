// Optimizers (AdamW, SGD with momentum, Lion), learning-rate schedules and gradient clipping.
// Optimizers work on the slice [begin, end) of the flat parameter buffer they are given (the
// whole buffer on one rank, a shard under ZeRO); they know nothing of MPI.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "model/parameters.h"

namespace crucible {

struct OptimizerConfig {
  std::string name;  // AdamW, SGD, Lion
  double lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  bool decay_norms = false, decay_embeddings = false;
};
OptimizerConfig BuildOptimizerConfig(const Config& config);

class Optimizer {
 public:
  Optimizer(const OptimizerConfig& config, const ParameterTable& table, size_t begin, size_t end);
  // One update of params[begin,end) from grads[begin,end); `step` counts from 1. params[i - base]
  // and grads[i - base] hold element i (base > 0 when they are a ZeRO-3 shard).
  void Step(float* params, const float* grads, double lr, int64_t step, size_t base = 0);
  // Named state buffers (each covering [begin, end)), for checkpoints.
  std::vector<std::pair<std::string, std::vector<float>*>> State();
  const OptimizerConfig& config() const { return config_; }

 private:
  struct Range {
    size_t begin, end;
    float weight_decay;
  };
  OptimizerConfig config_;
  size_t begin_, end_;
  std::vector<Range> ranges_;  // per parameter tensor, clipped to the shard
  std::vector<float> m_, v_;
};

struct LrScheduleConfig {
  double lr = 3e-4;
  int64_t warmup_steps = 0;
  std::string decay_type = "cosine";  // constant, linear, cosine, wsd
  double decay_ratio = 0.2;
  double min_lr_factor = 0.1;
  int64_t total_steps = 1;
};
LrScheduleConfig BuildLrScheduleConfig(const Config& config);
// Learning rate of optimizer step `step` (from 1).
double LearningRate(const LrScheduleConfig& schedule, int64_t step);

// Scale factor for global-norm clipping as torch.nn.utils.clip_grad_norm_ computes it:
// max_norm / (norm + 1e-6) when that is below 1, else 1 (and 1 when max_norm <= 0).
float ClipScale(double grad_norm, double max_norm);

}  // namespace crucible
