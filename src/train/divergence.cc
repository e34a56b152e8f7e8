#include "train/divergence.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/error.h"
#include "common/strings.h"

namespace crucible {

size_t FirstNonFinite(const float* values, size_t count) {
  // Blocks are scanned in parallel without branches (inf and nan have every exponent bit set);
  // the lowest bad block is then searched for the element.
  constexpr size_t kBlock = size_t{1} << 14;
  const int64_t blocks = static_cast<int64_t>((count + kBlock - 1) / kBlock);
  int64_t first_bad_block = blocks;
#pragma omp parallel for schedule(static) reduction(min : first_bad_block)
  for (int64_t block = 0; block < blocks; ++block) {
    const size_t begin = static_cast<size_t>(block) * kBlock;
    const size_t end = std::min(count, begin + kBlock);
    uint32_t bad = 0;
    for (size_t i = begin; i < end; ++i) {
      uint32_t bits;
      std::memcpy(&bits, values + i, sizeof(bits));
      bad |= (bits & 0x7f800000u) == 0x7f800000u;
    }
    if (bad) first_bad_block = std::min(first_bad_block, block);
  }
  if (first_bad_block == blocks) return count;
  size_t i = static_cast<size_t>(first_bad_block) * kBlock;
  while (std::isfinite(values[i])) ++i;
  return i;
}

std::string DivergenceGuard::Describe(const ParameterTable& table, size_t index, float value) {
  for (const ParamInfo& p : table.params())
    if (index >= p.offset && index < p.offset + p.numel)
      return StrFormat("%s (element %zu = %s)", p.name.c_str(), index - p.offset,
                       FormatValue(value).c_str());
  return StrFormat("flat element %zu = %s", index, FormatValue(value).c_str());
}

void DivergenceGuard::CheckWeights(const float* weights, size_t base, size_t begin, size_t end,
                                   int64_t step) const {
  const size_t first = begin + FirstNonFinite(weights + (begin - base), end - begin);
  const bool bad = first < end;
  bool any = bad;
  comm_.AllReduceOr(&any, "non-finite weight flag all-reduce");
  if (!any) return;
  // Which rank holds the lowest bad element, and its value.
  Communicator& comm = comm_;
  const uint64_t mine = bad ? first : std::numeric_limits<uint64_t>::max();
  const double value = bad ? weights[first - base] : 0.0;
  std::vector<uint64_t> indices(comm.size());
  std::vector<double> values(comm.size());
  comm.AllGatherU64(&mine, indices.data(), 1, "non-finite weight all-gather");
  comm.AllGatherDouble(&value, values.data(), 1, "non-finite weight all-gather");
  const size_t rank = std::min_element(indices.begin(), indices.end()) - indices.begin();
  throw Error(kExitDiverged,
              StrFormat("step %lld: the optimizer update made the weights non-finite, first in "
                        "%s: training diverged; nothing of this step was saved (last "
                        "checkpoint: %s); lower optimizer.lr",
                        (long long)step,
                        Describe(table_, indices[rank], static_cast<float>(values[rank])).c_str(),
                        last_checkpoint_(step).c_str()));
}

void DivergenceGuard::CheckFinalWeights(const float* weights, const ParameterTable& whole) const {
  const size_t first = FirstNonFinite(weights, whole.total());
  if (first == whole.total()) return;
  throw Error(
      kExitDiverged,
      StrFormat("the final weights are non-finite, first in %s: model.safetensors was "
                "not written (last checkpoint: %s)",
                Describe(whole, first, weights[first]).c_str(), last_checkpoint_(0).c_str()));
}

}  // namespace crucible
