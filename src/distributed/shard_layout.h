// How ZeRO splits a flat buffer of parameters over the ranks of a data-parallel group: rank r
// owns shard [r * shard, (r + 1) * shard) of the buffer padded to ranks * shard, where the shard
// is the fewest whole chunks (the gradient-norm chunk, DataParallel::kNormChunk) that cover the
// parameters when every rank gets as many. A rank's shard may lie partly or wholly in the
// padding: it owns the parameters inside it, possibly none. Pure arithmetic, no MPI.
#pragma once

#include <algorithm>
#include <cstddef>

#include "distributed/communicator.h"

namespace crucible {

struct Range {
  size_t begin = 0, end = 0;  // [begin, end); empty when begin == end
  size_t size() const { return end - begin; }
  bool operator==(const Range&) const = default;
};

class ShardLayout {
 public:
  ShardLayout(size_t n_params, int ranks, int rank, size_t chunk)
      : n_params_(n_params), ranks_(static_cast<size_t>(ranks)), rank_(static_cast<size_t>(rank)) {
    const size_t chunks = (n_params + chunk - 1) / chunk;
    shard_ = ((chunks + ranks_ - 1) / ranks_) * chunk;
  }

  size_t n_params() const { return n_params_; }
  int ranks() const { return static_cast<int>(ranks_); }
  int rank() const { return static_cast<int>(rank_); }
  size_t shard_size() const { return shard_; }
  size_t padded_size() const { return shard_ * ranks_; }
  // Where this rank's shard starts in the padded buffer.
  size_t shard_begin() const { return rank_ * shard_; }
  // The parameters rank r owns: its shard, clipped to [0, n_params).
  Range Owned(size_t r) const {
    return {std::min(n_params_, r * shard_), std::min(n_params_, (r + 1) * shard_)};
  }
  Range Owned() const { return Owned(rank_); }
  // The part of [begin, end) inside rank r's shard (empty ranges start at 0).
  Range PartIn(size_t r, size_t begin, size_t end) const {
    const size_t b = std::max(begin, r * shard_), e = std::min(end, (r + 1) * shard_);
    return b < e ? Range{b, e} : Range{};
  }
  // The parts of [begin, end) in each rank's shard, as blocks of a buffer holding [begin, end):
  // what a unit's all-gather and reduce-scatter move. An empty part has offset 0.
  Communicator::Blocks Parts(size_t begin, size_t end) const {
    Communicator::Blocks blocks;
    for (size_t r = 0; r < ranks_; ++r) {
      const Range part = PartIn(r, begin, end);
      blocks.counts.push_back(part.size());
      blocks.offsets.push_back(part.size() > 0 ? part.begin - begin : 0);
    }
    return blocks;
  }

 private:
  size_t n_params_, ranks_, rank_, shard_;
};

}  // namespace crucible
