// The data loader of one data-parallel rank. Global batch k is global samples
// [k * global_batch, (k + 1) * global_batch); rank r of `world` ranks reads the contiguous slice
// [r * global_batch / world, (r + 1) * global_batch / world) of it. A loader starts at any
// consumed-sample count (a resume point) and fetches the next batch on a background thread
// while the caller trains on the current one. Which tokens a global sample holds never depends
// on world, rank or the resume point (see token_source.h).
#pragma once

#include <cstdint>
#include <future>
#include <vector>

#include "data/token_source.h"

namespace crucible {

struct RankSlice {
  int64_t first_sample = 0;  // global sample index
  int64_t count = 0;
};

// Throws UsageError unless 0 <= rank < world and world divides global_batch.
RankSlice SliceOfBatch(int64_t batch_start, int64_t global_batch, int rank, int world);

class DataLoader {
 public:
  DataLoader(const TokenSource& source, int64_t seq_len, int64_t global_batch, int rank, int world,
             int64_t consumed_samples);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // This rank's slice of the next global batch: count x (seq_len + 1) tokens, sample-major.
  // Advances consumed_samples by global_batch.
  const std::vector<int32_t>& Next();
  // Global samples consumed so far by all ranks together (the resume point to save).
  int64_t consumed_samples() const { return consumed_; }
  int64_t samples_per_rank() const { return global_batch_ / world_; }

 private:
  std::future<std::vector<int32_t>> Fetch(int64_t batch_start) const;
  const TokenSource& source_;
  int64_t seq_len_, global_batch_;
  int rank_, world_;
  int64_t consumed_;
  std::vector<int32_t> current_;
  std::future<std::vector<int32_t>> next_;
};

}  // namespace crucible
