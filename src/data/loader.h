// The data loader of one data-parallel rank. Step s's global batch is the G = GlobalBatch(s)
// global samples from SamplesBefore(s) on (data/batch_schedule.h; with a constant batch, batch
// k is [k * G, (k + 1) * G)); rank r of `world` ranks reads the contiguous slice
// [r * G / world, (r + 1) * G / world) of it. A loader starts at any
// consumed-sample count (a resume point) and fetches the next batch on a background thread
// while the caller trains on the current one. Which tokens a global sample holds never depends
// on world, rank or the resume point (see token_source.h).
#pragma once

#include <cstdint>
#include <future>
#include <limits>
#include <vector>

#include "data/batch_schedule.h"
#include "data/token_source.h"

namespace crucible {

struct RankSlice {
  int64_t first_sample = 0;  // global sample index
  int64_t count = 0;
};

// Throws UsageError unless 0 <= rank < world and world divides global_batch.
RankSlice SliceOfBatch(int64_t batch_start, int64_t global_batch, int rank, int world);

// One rank's slice of a global batch, as the model takes it: `samples` rows of seq_len
// positions, sample-major. Row s holds global sample first_sample + s: inputs are its first
// seq_len tokens, targets the last seq_len. loss_weights is empty when every target weighs 1
// (pre-training; the model then gets nullptr), else one weight per target.
struct Batch {
  int64_t first_sample = 0, samples = 0, seq_len = 0;
  std::vector<int32_t> inputs, targets;
  std::vector<float> loss_weights;
  // Packed documents (TokenSource::packed): each input's position in its document; else empty
  // (the model then gets nullptr).
  std::vector<int32_t> positions;
  // Rows shorter than seq_len (a StepBatches' batch: GRPO's): micro-batch m's rows are
  // micro_lengths[m] positions long, laid out (rows, micro_lengths[m]) from the micro-batch's
  // first row on (inputs_at), the rest of its rows x seq_len block unused (targets -1, weights
  // 0); the model runs that length (ForwardOptions::seq_len). Empty: every row seq_len long.
  std::vector<int64_t> micro_lengths;
  int64_t length_of(int64_t micro_batch) const {
    return micro_lengths.empty() ? seq_len : micro_lengths[static_cast<size_t>(micro_batch)];
  }

  // Rows [row, row + n) as the model reads them (a micro-batch starting at `row`).
  const int32_t* inputs_at(int64_t row) const { return inputs.data() + row * seq_len; }
  const int32_t* targets_at(int64_t row) const { return targets.data() + row * seq_len; }
  const float* loss_weights_at(int64_t row) const {
    return loss_weights.empty() ? nullptr : loss_weights.data() + row * seq_len;
  }
  const int32_t* positions_at(int64_t row) const {
    return positions.empty() ? nullptr : positions.data() + row * seq_len;
  }
};

// Reads `count` samples from `first_sample` on into a Batch.
Batch ReadBatch(const TokenSource& source, int64_t seq_len, int64_t first_sample, int64_t count);

class DataLoader {
 public:
  // `end_samples`: the loader never reads a batch that starts at or after it (the run's last
  // step ends there), so it does not prefetch past the end of a dataset sized for the run.
  DataLoader(const TokenSource& source, int64_t seq_len, int64_t global_batch, int rank, int world,
             int64_t consumed_samples, int64_t end_samples = std::numeric_limits<int64_t>::max());
  // Steps [first_step, last_step] of `batches` (each step's global batch a multiple of world):
  // the first batch starts at sample batches.SamplesBefore(first_step).
  DataLoader(const TokenSource& source, int64_t seq_len, BatchSchedule batches, int rank, int world,
             int64_t first_step, int64_t last_step);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // This rank's slice of the next global batch. Advances consumed_samples by that step's global
  // batch. Rethrows what reading it threw; std::logic_error past the end.
  const Batch& Next();
  // Global samples consumed so far by all ranks together (the resume point to save).
  int64_t consumed_samples() const { return consumed_; }

 private:
  void FetchNext();  // starts reading step step_'s batch at consumed_, unless that is the end
  const TokenSource& source_;
  int64_t seq_len_;
  BatchSchedule batches_;
  int rank_, world_;
  int64_t step_;  // of the batch FetchNext reads (with a constant batch, only counts)
  int64_t consumed_, end_;
  int64_t fetched_ = 0;  // samples of the batch being read ahead
  Batch current_;
  std::future<Batch> next_;
};

}  // namespace crucible
