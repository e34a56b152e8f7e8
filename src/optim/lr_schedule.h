// The learning-rate schedule: linear warmup, then constant, linear, cosine or wsd (warmup,
// stable, decay). It holds the run's one copy of the peak learning rate (optimizer.lr); the
// trainer computes LearningRate once per step and hands it to the optimizer and the logs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"

namespace crucible {

struct LrScheduleConfig {
  double lr = 3e-4;  // the peak, optimizer.lr
  int64_t warmup_steps = 0;
  std::string decay_type = "cosine";  // constant, linear, cosine, wsd
  double decay_ratio = 0.2;
  double min_lr_factor = 0.1;
  int64_t total_steps = 1;
};
LrScheduleConfig BuildLrScheduleConfig(const Config& config);
// Learning rate of optimizer step `step` (from 1).
double LearningRate(const LrScheduleConfig& schedule, int64_t step);
// UsageError (starting with `where`) when a wsd schedule's warmup reaches into its decay.
void CheckWsdWarmup(const LrScheduleConfig& schedule, const std::string& where);

// A run whose schedule restarts: segment k runs its own schedule (peak, warmup, decay over its
// own total_steps) from step first_step, counting its steps from 1 there, until the next
// segment's first step. The training stages' LR policies (train/stages.h) make them.
struct LrSegment {
  int64_t first_step = 1;
  LrScheduleConfig schedule;
};
// LearningRate(segment.schedule, step - segment.first_step + 1) of the segment holding `step`
// (segments in order, the first from step 1).
double SegmentedLearningRate(const std::vector<LrSegment>& segments, int64_t step);

}  // namespace crucible
