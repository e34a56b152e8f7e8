// The trainer's built-in hooks after metrics (train/metrics_log.h), in the order they run:
//   validation   every validation.freq steps and at the last, rank 0 evaluates the full weights
//                (train/validation.h) while the others wait; the eval gate may stop the run
//                (exit 2, the last checkpoint kept);
//   checkpoints  the interval saves, and the stop protocol: a stop signal on any rank stops
//                every rank at the same step, after a synchronous checkpoint of it (exit 143;
//                75 when none is written), printing `stopped step=... exit=...`.
#pragma once

#include <memory>

#include "model/model.h"
#include "train/hooks.h"

namespace crucible {

class TensorBoardWriter;
class Trainer;

// Both take what they need from `trainer`, which must outlive them. Validation also writes its
// numbers to `tensorboard` (rank 0's, owned by the metrics hook; null: none).
std::unique_ptr<TrainerHook> MakeValidationHook(Trainer& trainer,
                                                std::shared_ptr<const ModelSpec> model,
                                                TensorBoardWriter* tensorboard);
std::unique_ptr<TrainerHook> MakeCheckpointHook(Trainer& trainer);

}  // namespace crucible
