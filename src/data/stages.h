// A run in stages: `[[data.stages]]` tables in the config, in order, each with its own blend file
// list (what [training] dataset = "blend" reads), a length in steps or tokens, an LR policy and
// an optional anneal from the previous stage's mixture. This file reads and checks the tables
// and places them on the run's steps; the blend itself is blended_dataset.h's (BlendOptions::
// stages), the learning rate the trainer's (train/stages.h), the rules docs/training.md#stages.
//
//   [[data.stages]]
//   name = "math"            # [A-Za-z0-9_.-]+, unique; default "stage<k>"
//   list = "math-blend.txt"  # a blend file list (relative to the working folder), or a blend of
//                            # them: blends = [{ list = "web.txt", weight = 0.7 }, ...]
//   steps = 200              # or tokens = 3276800: a whole number of steps, exactly
//   lr_policy = "gentle"     # continue (default), rewarm or gentle
//   warmup_steps = 20        # rewarm/gentle: default [lr_scheduler] warmup_steps
//   peak_fraction = 0.3      # gentle only, in (0, 1]
//   anneal_steps = 50        # not in the first stage; at most the stage's steps
//   eval_text = "math-heldout.txt"  # or a list: held-out text of the stage's corpus, evaluated
//                                   # at every stage boundary (train/stage_eval.h)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "data/batch_schedule.h"
#include "data/blended_dataset.h"

namespace crucible {

enum class LrPolicy { kContinue, kRewarm, kGentle };
const char* LrPolicyName(LrPolicy policy);

struct DataStage {
  int index = 0;     // from 1, in order
  std::string name;  // unique
  // The blend file list; for a blend of blends, its one-word description as phase=stage lines
  // and `data inspect --config` show it: "0.7*web.txt+0.3*math.txt" (weights as given).
  std::string list;
  std::vector<WeightedFileList> blends;  // a blend of blends (`blends`); empty with `list`
  std::string where;                     // for errors: `run.toml:12: [[data.stages]] #2 ("math")`
  int64_t steps = 0;                     // resolved (from `tokens` when the length is given so)
  int64_t tokens = 0;                    // as given; 0 when the length is given in steps
  LrPolicy lr_policy = LrPolicy::kContinue;
  int64_t warmup_steps = -1;  // rewarm and gentle; -1: [lr_scheduler] warmup_steps
  double peak_fraction = 1;   // gentle's share of optimizer.lr; 1 for the others
  int64_t anneal_steps = 0;
  std::vector<std::string> eval_text;  // held-out text files of the stage's corpus
  int64_t first_step = 0;              // resolved: the stage runs steps [first_step, last_step()]
  int64_t last_step() const { return first_step + steps - 1; }
};

// Reads and checks data.stages (no stages: empty): every key known, of its type and range;
// exactly one of `list` (a readable file) and `blends` (at least one { list, weight } table,
// each list a readable file, each weight a positive finite number); steps or tokens, not both;
// lr_policy known; warmup_steps only with rewarm or gentle, peak_fraction with gentle only (and
// there required); no anneal in the first stage; names unique. UsageError (exit 2) in one line
// naming the stage, where it was given, the key and what to do. Lengths in tokens are not
// converted yet (steps = 0).
std::vector<DataStage> ReadDataStages(const Config& config);

// Places the stages on the run's steps: tokens become steps through the global batches of
// `batches` and seq_len (refused unless they make a whole number of steps exactly, naming the
// two nearest token counts that do), then first_step, and anneal_steps is checked against the
// stage's steps. UsageError in one line.
void ResolveDataStages(std::vector<DataStage>& stages, const BatchSchedule& batches,
                       int64_t seq_len);

// ReadDataStages then ResolveDataStages.
std::vector<DataStage> ResolvedDataStages(const Config& config, const BatchSchedule& batches,
                                          int64_t seq_len);

// The steps of every stage together.
int64_t TotalStageSteps(const std::vector<DataStage>& stages);
// The position in `stages` (resolved) of the stage that runs `step`; -1 outside every stage.
int StageOfStep(const std::vector<DataStage>& stages, int64_t step);

}  // namespace crucible
