#include "data/loader.h"

#include <algorithm>
#include <stdexcept>

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

Batch ReadBatch(const TokenSource& source, int64_t seq_len, int64_t first_sample, int64_t count) {
  Batch batch;
  batch.first_sample = first_sample;
  batch.samples = count;
  batch.seq_len = seq_len;
  const size_t positions = static_cast<size_t>(count * seq_len);
  batch.inputs.resize(positions);
  batch.targets.resize(positions);
  if (source.weighted()) batch.loss_weights.resize(positions);
  if (source.packed()) batch.positions.resize(positions);
  std::vector<int32_t> sample(seq_len + 1);
  for (int64_t s = 0; s < count; ++s) {
    source.SampleAll(first_sample + s, sample.data(),
                     source.weighted() ? batch.loss_weights.data() + s * seq_len : nullptr,
                     source.packed() ? batch.positions.data() + s * seq_len : nullptr);
    std::copy(sample.begin(), sample.begin() + seq_len, batch.inputs.begin() + s * seq_len);
    std::copy(sample.begin() + 1, sample.end(), batch.targets.begin() + s * seq_len);
  }
  return batch;
}

DataLoader::DataLoader(const TokenSource& source, int64_t seq_len, int64_t global_batch, int rank,
                       int world, int64_t consumed_samples, int64_t end_samples)
    : source_(source),
      seq_len_(seq_len),
      batches_(std::max<int64_t>(global_batch, 1)),
      rank_(rank),
      world_(world),
      step_(1),
      consumed_(consumed_samples),
      end_(end_samples) {
  SliceOfBatch(0, global_batch, rank, world);  // validates
  if (consumed_samples < 0) throw UsageError("loader: consumed samples must not be negative");
  FetchNext();
}

DataLoader::DataLoader(const TokenSource& source, int64_t seq_len, BatchSchedule batches, int rank,
                       int world, int64_t first_step, int64_t last_step)
    : source_(source),
      seq_len_(seq_len),
      batches_(std::move(batches)),
      rank_(rank),
      world_(world),
      step_(first_step),
      consumed_(batches_.SamplesBefore(first_step)),
      end_(batches_.SamplesBefore(last_step + 1)) {
  for (const BatchStage& stage : batches_.stages())
    SliceOfBatch(0, stage.global_batch, rank, world);  // validates
  FetchNext();
}

DataLoader::~DataLoader() {
  if (next_.valid()) next_.wait();
}

void DataLoader::FetchNext() {
  if (consumed_ >= end_) return;
  fetched_ = batches_.GlobalBatch(step_);
  const RankSlice slice = SliceOfBatch(consumed_, fetched_, rank_, world_);
  next_ = std::async(std::launch::async, [this, slice] {
    return ReadBatch(source_, seq_len_, slice.first_sample, slice.count);
  });
}

const Batch& DataLoader::Next() {
  if (!next_.valid())
    throw std::logic_error(StrFormat("loader: no batch at sample %lld, the end is %lld",
                                     (long long)consumed_, (long long)end_));
  current_ = next_.get();  // rethrows a failure of the fetch
  consumed_ += fetched_;
  ++step_;
  FetchNext();
  return current_;
}

}  // namespace crucible
