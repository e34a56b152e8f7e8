#include "optim/matrix_owners.h"

#include <algorithm>
#include <numeric>

#include "common/error.h"

namespace crucible {

std::vector<int> AssignMatrixOwners(const ParameterTable& table, int world_size) {
  if (world_size < 1) throw Error(kExitFailure, "internal: AssignMatrixOwners needs a rank");
  const std::vector<ParamInfo>& params = table.params();
  std::vector<size_t> order(params.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return params[a].numel > params[b].numel; });
  std::vector<size_t> load(static_cast<size_t>(world_size), 0);
  std::vector<int> owners(params.size(), 0);
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
