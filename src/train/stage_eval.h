// Evaluation between training stages ([stage_eval], docs/training.md#stages): at every boundary
// of a run in stages (before the first stage, after each stage), the current weights are scored
// on held-out text (stage_eval.text and every stage's eval_text: loss and bits per byte) and on
// multiple-choice tasks (stage_eval.tasks: acc, acc_norm and their standard errors) with
// src/eval's scorer, and one JSON line per boundary goes to <run>/eval/stages.jsonl. The stage
// gate (stage_eval.gate_tasks) stops the run, exit 3, before the next stage begins when a gated
// task's accuracy after a stage fell more than gate_margin below its value before it (the
// previous boundary's line), after completing a checkpoint of the boundary's step. Continued
// pre-training can lower the loss while it forgets: the boundary evaluations show it, and the gate
// stops it.
#pragma once

#include <memory>

#include "model/model.h"
#include "train/hooks.h"

namespace crucible {

class Trainer;

// Checks [stage_eval] and the stages' eval_text on every rank (UsageError in one line); the
// leader loads the tokenizer, tasks and texts. A hook that does nothing when the run has no
// stage evaluation. `trainer` must outlive it.
std::unique_ptr<TrainerHook> MakeStageEvalHook(Trainer& trainer,
                                               std::shared_ptr<const ModelSpec> model);

}  // namespace crucible
