#include "train/stages.h"

#include "common/strings.h"

namespace crucible {

std::vector<LrSegment> StageLrSegments(const LrScheduleConfig& base,
                                       const std::vector<DataStage>& stages) {
  std::vector<LrSegment> segments;
  std::vector<const DataStage*> starts;  // the stage that opened each segment
  for (const DataStage& stage : stages) {
    if (segments.empty() || stage.lr_policy != LrPolicy::kContinue) {
      LrSegment segment;
      segment.first_step = stage.first_step;
      segment.schedule = base;
      segment.schedule.total_steps = 0;
      segment.schedule.lr = base.lr * stage.peak_fraction;
      if (stage.warmup_steps >= 0) segment.schedule.warmup_steps = stage.warmup_steps;
      segments.push_back(segment);
      starts.push_back(&stage);
    }
    segments.back().schedule.total_steps += stage.steps;
  }
  for (size_t k = 0; k < segments.size(); ++k)
    CheckWsdWarmup(segments[k].schedule, starts[k]->where + ": the LR segment it starts (" +
                                             std::to_string(segments[k].schedule.total_steps) +
                                             " steps): ");
  return segments;
}

std::string DescribeStages(const std::vector<DataStage>& stages) {
  if (stages.empty()) return "";
  std::string out = " stages=";
  for (const DataStage& s : stages)
    out += StrFormat("%s%s@%lld-%lld:%s", &s == &stages.front() ? "" : ",", s.name.c_str(),
                     (long long)s.first_step, (long long)s.last_step(), LrPolicyName(s.lr_policy));
  return out;
}

}  // namespace crucible
