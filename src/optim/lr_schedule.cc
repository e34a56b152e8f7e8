#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/host_math.h"
#include "common/strings.h"

namespace crucible {

namespace {
// The last step of the wsd schedule's stable phase: the decay takes the remaining
// max(1, round(total_steps x decay_ratio)) steps.
int64_t WsdDecayStart(const LrScheduleConfig& s) {
  const int64_t decay_steps =
      std::max<int64_t>(1, std::llround(static_cast<double>(s.total_steps) * s.decay_ratio));
  return s.total_steps - decay_steps;
}
}  // namespace

LrScheduleConfig BuildLrScheduleConfig(const Config& config) {
  LrScheduleConfig s;
  s.lr = config.Float("optimizer.lr");
  s.warmup_steps = config.Int("lr_scheduler.warmup_steps");
  s.decay_type = config.String("lr_scheduler.decay_type");
  s.decay_ratio = config.Float("lr_scheduler.decay_ratio");
  s.min_lr_factor = config.Float("lr_scheduler.min_lr_factor");
  s.total_steps = config.Int("training.steps");
  if (s.decay_type != "constant" && s.decay_type != "linear" && s.decay_type != "cosine" &&
      s.decay_type != "wsd")
    throw UsageError("lr_scheduler.decay_type: unknown schedule '" + s.decay_type +
                     "' (choose constant, linear, cosine or wsd)");
  // wsd decays over the last decay_ratio of the steps; a warmup reaching into that decay would
  // end on a jump down instead of a decay from the peak. (The other schedules only ramp for as
  // long as a run shorter than its warmup lasts: it may be resumed with more steps.)
  if (s.decay_type == "wsd" && s.total_steps > 0 && s.warmup_steps > WsdDecayStart(s))
    throw UsageError(StrFormat(
        "lr_scheduler.warmup_steps = %lld reaches into the wsd decay, which starts after step "
        "%lld of training.steps = %lld (lr_scheduler.decay_ratio = %g): lower warmup_steps or "
        "decay_ratio, or raise training.steps",
        (long long)s.warmup_steps, (long long)WsdDecayStart(s), (long long)s.total_steps,
        s.decay_ratio));
  return s;
}

void CheckWsdWarmup(const LrScheduleConfig& s, const std::string& where) {
  if (s.decay_type == "wsd" && s.total_steps > 0 && s.warmup_steps > WsdDecayStart(s))
    throw UsageError(StrFormat(
        "%swarmup_steps = %lld reaches into the wsd decay, which starts after step %lld of its "
        "%lld steps (lr_scheduler.decay_ratio = %g): lower warmup_steps or decay_ratio",
        where.c_str(), (long long)s.warmup_steps, (long long)WsdDecayStart(s),
        (long long)s.total_steps, s.decay_ratio));
}

double SegmentedLearningRate(const std::vector<LrSegment>& segments, int64_t step) {
  size_t k = 0;
  while (k + 1 < segments.size() && segments[k + 1].first_step <= step) ++k;
  return LearningRate(segments[k].schedule, step - segments[k].first_step + 1);
}

double LearningRate(const LrScheduleConfig& s, int64_t step) {
  if (step <= s.warmup_steps) return s.lr * static_cast<double>(step) / s.warmup_steps;
  const double floor = s.lr * s.min_lr_factor;
  const double span = static_cast<double>(std::max<int64_t>(1, s.total_steps - s.warmup_steps));
  const double progress = std::min(1.0, static_cast<double>(step - s.warmup_steps) / span);
  if (s.decay_type == "constant") return s.lr;
  if (s.decay_type == "linear") return floor + (s.lr - floor) * (1.0 - progress);
  if (s.decay_type == "cosine")
    return floor + (s.lr - floor) * 0.5 * (1.0 + HostCos(M_PI * progress));
  // wsd: hold the peak, then decay linearly over the last decay_ratio of all steps.
  const int64_t decay_start = WsdDecayStart(s);
  if (step <= decay_start) return s.lr;
  const double fraction =
      std::min(1.0, static_cast<double>(step - decay_start) / (s.total_steps - decay_start));
  return floor + (s.lr - floor) * (1.0 - fraction);
}

}  // namespace crucible
