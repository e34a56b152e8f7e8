#include "distributed/matrix_routes.h"

#include <algorithm>

#include "common/error.h"
#include "common/strings.h"
#include "optim/matrix_owners.h"

namespace crucible {

MatrixRoutes RouteMatrices(const ParameterTable& table, const std::vector<int>& owners,
                           const ShardLayout& layout) {
  const std::vector<ParamInfo>& params = table.params();
  const size_t ranks = static_cast<size_t>(layout.ranks());
  const int rank = layout.rank();
  if (owners.size() != params.size() || layout.n_params() != table.total())
    throw Error(kExitFailure,
                StrFormat("internal: matrix routes for %zu owners of %zu tensors, a layout of %zu "
                          "of %zu parameters",
                          owners.size(), params.size(), layout.n_params(), table.total()));
  for (int owner : owners)
    if (owner != kNoOwner && (owner < 0 || static_cast<size_t>(owner) >= ranks))
      throw Error(kExitFailure, StrFormat("internal: owner rank %d of %zu ranks", owner, ranks));

  // The part of tensor t inside `range` (Range{} when none).
  auto part = [&](size_t t, const Range& range) {
    const size_t b = std::max(range.begin, params[t].offset);
    const size_t e = std::min(range.end, params[t].offset + params[t].numel);
    return b < e ? Range{b, e} : Range{};
  };
  MatrixRoutes routes;
  // As a holder: the parts of the tensors inside this rank's range, by owner, then flat order.
  const Range mine = layout.Owned();
  std::vector<size_t> send_counts(ranks, 0);
  for (size_t owner = 0; owner < ranks; ++owner)
    for (size_t t = 0; t < params.size(); ++t) {
      if (owners[t] != static_cast<int>(owner)) continue;  // kNoOwner: none
      const Range piece = part(t, mine);
      if (piece.size() == 0) continue;
      routes.pieces.push_back(piece);
      send_counts[owner] += piece.size();
    }
  routes.to_owners = Communicator::Blocks::Packed(std::move(send_counts));

  // As an owner: its tensors concatenated; block q is what of them lies in q's range.
  routes.tensors = TensorsOwnedBy(owners, rank);
  size_t offset = 0;
  for (size_t t : routes.tensors) {
    routes.tensor_offsets.push_back(offset);
    offset += params[t].numel;
  }
  std::vector<size_t> receive_counts(ranks, 0);
  for (size_t holder = 0; holder < ranks; ++holder) {
    const Range range = layout.Owned(holder);
    for (size_t t : routes.tensors) receive_counts[holder] += part(t, range).size();
  }
  routes.from_holders = Communicator::Blocks::Packed(std::move(receive_counts));
  return routes;
}

}  // namespace crucible
