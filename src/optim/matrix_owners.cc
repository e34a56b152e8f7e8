#include "optim/matrix_owners.h"

#include <algorithm>

#include "common/error.h"

namespace crucible {

std::vector<int> AssignMatrixOwners(const ParameterTable& table, int world_size,
                                    const std::vector<bool>& whole) {
  const std::vector<ParamInfo>& params = table.params();
  if (world_size < 1 || (!whole.empty() && whole.size() != params.size()))
    throw Error(kExitFailure, "internal: AssignMatrixOwners needs a rank and a flag per tensor");
  std::vector<size_t> order;
  for (size_t t = 0; t < params.size(); ++t)
    if (whole.empty() || whole[t]) order.push_back(t);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return params[a].numel > params[b].numel; });
  std::vector<size_t> load(static_cast<size_t>(world_size), 0);
  std::vector<int> owners(params.size(), kNoOwner);
  for (size_t t : order) {
    const size_t rank =
        static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    owners[t] = static_cast<int>(rank);
    load[rank] += params[t].numel;
  }
  return owners;
}

std::vector<size_t> TensorsOwnedBy(const std::vector<int>& owners, int rank) {
  std::vector<size_t> tensors;
  for (size_t t = 0; t < owners.size(); ++t)
    if (owners[t] == rank) tensors.push_back(t);
  return tensors;
}

}  // namespace crucible
