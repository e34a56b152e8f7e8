// Where the pieces of each tensor travel when a whole-matrix optimizer (ShardMode::kWholeMatrix)
// runs under ZeRO-1/3 across ranks. Pure arithmetic, no MPI: MatrixOwnerOptimizer
// (distributed/sharded_optimizer.h) moves the pieces with two all-to-allv's per step.
//
// Two ways the parameters are spread over the ranks of a data-parallel group:
//  - by flat range: rank q holds the reduced gradient (and under ZeRO-3 the weights) of
//    layout.Owned(q), which may cut tensors anywhere (distributed/shard_layout.h);
//  - by tensor: each tensor is updated by the one rank `owners` names (optim/matrix_owners.h).
// A holder sends each owner the pieces of its range that belong to the owner's tensors; the
// owner lays what it receives out as its tensors concatenated in ascending order (the layout of
// OptimizerShard's tensor constructor), runs the update, and sends the updated pieces back along
// the same routes reversed.
//
// Fixed orders: a holder packs its pieces by owner rank, then by flat position; an owner's
// block from holder q is the elements of its tensors inside q's range, in flat order. Because the
// ranges are consecutive and ascending, the owner's blocks in rank order are exactly its tensors
// concatenated, so it receives into (and sends from) its tensor buffer with no copy.
#pragma once

#include <cstddef>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/shard_layout.h"
#include "model/parameters.h"

namespace crucible {

struct MatrixRoutes {
  // This rank as a holder of layout.Owned(): its pieces in send order (each inside one tensor),
  // and the blocks of the packed buffer, block o for owner o (empty blocks for ranks it sends
  // nothing to). The packed buffer holds Owned().size() elements.
  std::vector<Range> pieces;
  Communicator::Blocks to_owners;
  // This rank as an owner: its tensors (indices into table.params(), ascending), where each
  // starts in its tensor buffer, and the blocks of that buffer, block q from (and back to)
  // holder q.
  std::vector<size_t> tensors;
  std::vector<size_t> tensor_offsets;
  Communicator::Blocks from_holders;
  size_t owned_elements() const { return from_holders.total(); }
};

// The routes of rank layout.rank() among layout.ranks(), for `owners` (indexed like
// table.params(), each in [0, layout.ranks()), or kNoOwner for a tensor that is updated in the
// flat ranges and does not travel). The layout's n_params must be table.total().
MatrixRoutes RouteMatrices(const ParameterTable& table, const std::vector<int>& owners,
                           const ShardLayout& layout);

}  // namespace crucible
