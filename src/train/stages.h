// What the trainer makes of [[data.stages]] (data/stages.h) beyond the data: the learning rate of
// each stage's policy, and the stages as the progress lines name them. The formulas are
// docs/training.md#stages:
//
// Stage 1, and every stage whose lr_policy is rewarm or gentle, starts an LR segment; a continue
// stage extends the segment before it (the schedule goes on as if there were no boundary). A
// segment that starts after step S and spans L steps (its stages' together) runs the
// [lr_scheduler] schedule (warmup, then decay_type's decay to peak x min_lr_factor, over L
// steps) on the local step u = s - S, with
//   peak   = optimizer.lr x peak_fraction (gentle) or optimizer.lr (rewarm, stage 1 continue);
//   warmup = the stage's warmup_steps, default lr_scheduler.warmup_steps.
// So rewarm climbs back to optimizer.lr and gentle to a fraction of it, each then decays over its
// own segment; all-continue stages give the run's schedule over the total steps, bit for bit.
#pragma once

#include <string>
#include <vector>

#include "data/stages.h"
#include "optim/lr_schedule.h"

namespace crucible {

// The segments of `stages` (resolved) on the base schedule `base` (optimizer.lr and
// [lr_scheduler]; its total_steps is not used). UsageError naming the stage when a wsd warmup
// reaches into its segment's decay.
std::vector<LrSegment> StageLrSegments(const LrScheduleConfig& base,
                                       const std::vector<DataStage>& stages);

// " stages=pre@1-10:continue,math@11-20:gentle" for the phase=start line; "" without stages.
std::string DescribeStages(const std::vector<DataStage>& stages);

}  // namespace crucible
