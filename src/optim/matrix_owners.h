// Which rank updates which tensor when an optimizer needs whole matrices (ShardMode::kWholeMatrix)
// and the optimizer state is sharded across ranks: each tensor has one owner, and the owners'
// loads (elements updated) are balanced.
#pragma once

#include <cstddef>
#include <vector>

#include "model/parameters.h"

namespace crucible {

// The owner of a tensor that is not updated whole (an elementwise tensor of an optimizer that
// mixes shard modes, Optimizer::shard_mode_of): it is updated in the flat ranges instead.
inline constexpr int kNoOwner = -1;

// The owner rank of each tensor of `table` (indexed like table.params()) among `world_size`
// ranks: the tensors `whole` says are updated whole (every tensor when `whole` is empty; the
// others get kNoOwner), largest first (equal sizes in table order), each to the rank with the
// fewest elements so far (equal loads: the lowest rank). A pure function of the tensor sizes,
// `whole` and world_size. The largest load exceeds the mean by at most the largest tensor.
std::vector<int> AssignMatrixOwners(const ParameterTable& table, int world_size,
                                    const std::vector<bool>& whole = {});

// The tensors `owners` gives to `rank`, ascending: what OptimizerShard's tensor constructor takes.
std::vector<size_t> TensorsOwnedBy(const std::vector<int>& owners, int rank);

}  // namespace crucible
