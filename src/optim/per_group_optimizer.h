// An optimizer per parameter group: a matrices-only optimizer (Optimizer::matrices_only(): Muon,
// Mano) for the "matrices" group, AdamW for every other group (embeddings, head, norms), as the
// Muon (Moonlight) and Mano papers train. BuildOptimizerConfig (optim/optimizer_shard.h) builds
// one when optimizer.name names a matrices-only optimizer; the other optimizers apply to every
// group as they always did, and never pass through here.
//
// The combination is itself an Optimizer, so OptimizerShard, ShardedOptimizer and checkpoints
// need nothing of their own for it:
//  - its state is the matrices optimizer's specs, carried by the hidden matrices only, then
//    AdamW's (exp_avg, exp_avg_sq), carried by the other tensors only (StateSpec::carried_by);
//    the names must differ (checked). So a matrix has no AdamW buffer and an embedding no
//    momentum: optimizer.safetensors holds "<name>.<tensor>" only for the tensors that carry
//    `name` (docs/optimizers.md), and each rank allocates only those.
//  - its shard mode is per tensor (shard_mode_of: each group's optimizer's), shard_mode() the
//    stricter one: under ZeRO-1/3 across ranks the hidden matrices are updated whole by their
//    owner ranks and AdamW's tensors elementwise in the flat range of the rank that holds each
//    piece (MatrixOwnerOptimizer, distributed/sharded_optimizer.h), as plain AdamW runs. Every
//    state is then carried by tensors of one mode only, which the sharded optimizer relies on.
#pragma once

#include <memory>

#include "optim/optimizer.h"

namespace crucible {

// `matrices` updates the tensors IsHiddenMatrix(kind) (optim/param_groups.h), `others` the rest.
std::unique_ptr<Optimizer> MakePerGroupOptimizer(std::shared_ptr<const Optimizer> matrices,
                                                 std::shared_ptr<const Optimizer> others);

}  // namespace crucible
