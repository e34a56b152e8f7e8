#include "data/loader.h"

#include "common/error.h"
#include "common/strings.h"

namespace crucible {

RankSlice SliceOfBatch(int64_t batch_start, int64_t global_batch, int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world)
    throw UsageError(StrFormat("loader: rank %d is not in [0, %d)", rank, world));
  if (global_batch < 1 || global_batch % world != 0)
    throw UsageError(StrFormat("loader: global batch %lld is not a positive multiple of %d ranks",
                               (long long)global_batch, world));
  const int64_t per_rank = global_batch / world;
  return {batch_start + rank * per_rank, per_rank};
}

DataLoader::DataLoader(const TokenSource& source, int64_t seq_len, int64_t global_batch, int rank,
                       int world, int64_t consumed_samples)
    : source_(source),
      seq_len_(seq_len),
      global_batch_(global_batch),
      rank_(rank),
      world_(world),
      consumed_(consumed_samples) {
  SliceOfBatch(0, global_batch, rank, world);  // validates
  if (consumed_samples < 0) throw UsageError("loader: consumed samples must not be negative");
  next_ = Fetch(consumed_);
}

DataLoader::~DataLoader() {
  if (next_.valid()) next_.wait();
}

std::future<std::vector<int32_t>> DataLoader::Fetch(int64_t batch_start) const {
  return std::async(std::launch::async, [this, batch_start] {
    const RankSlice slice = SliceOfBatch(batch_start, global_batch_, rank_, world_);
    std::vector<int32_t> tokens(static_cast<size_t>(slice.count * (seq_len_ + 1)));
    for (int64_t s = 0; s < slice.count; ++s)
      source_.Sample(slice.first_sample + s, tokens.data() + s * (seq_len_ + 1));
    return tokens;
  });
}

const std::vector<int32_t>& DataLoader::Next() {
  current_ = next_.get();  // rethrows a failure of the fetch
  consumed_ += global_batch_;
  next_ = Fetch(consumed_);
  return current_;
}

}  // namespace crucible
