// How a data-parallel rank gives the model its parameters and takes back its gradients, unit by
// unit (model/parameters.h ParameterAccess; for a decoder a unit is the embedding, a layer or the
// tail). Both work over the data-parallel group of the DataParallel they are given.
//
// ReplicatedAccess (ZeRO stages 0 and 1): every rank holds all parameters. As the backward pass
// finishes a unit, its gradient is added to the exact accumulator; in the step's last
// micro-batch the unit's reduction starts at once (non-blocking MPI), so it runs while the
// backward pass goes on with the units below it.
//
// ShardedAccess (ZeRO stage 3, the FSDP equivalent): a rank stores only its shard of the
// parameters. A unit is all-gathered when the model acquires it, into one of a few gather
// buffers; the next unit's gather is started ahead (prefetch), and a gathered unit stays cached
// until its buffer is needed (so the last layer and the tail are not gathered twice). Each
// micro-batch's unit gradient is converted to fixed point and reduce-scattered at once (again
// non-blocking); each rank adds the sums of its shard. Integer sums make the result identical to
// stages 0 and 1 and to any number of ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/data_parallel.h"
#include "distributed/exact_sum.h"
#include "model/parameters.h"

namespace crucible {

// Called with a gradient contribution of this micro-batch that holds a non-finite value: (unit,
// begin, end, values), where values[i - begin] is the contribution to flat parameter i of
// [begin, end) (the unit's whole gradient, or a part ParameterAccess::AddGradient added).
using NonFiniteHandler =
    std::function<void(int unit, size_t begin, size_t end, const float* values)>;

// What the trainer holds, whatever the ZeRO stage: the model's ParameterAccess and the step
// around it. The trainer calls BeginStep, then BeginMicroBatch before each micro-batch's forward
// pass, then FinishStep after the last backward pass, and branches on no layout.
class TrainingAccess : public ParameterAccess {
 public:
  // Before a step's first micro-batch.
  virtual void BeginStep() = 0;
  // Before each micro-batch's forward pass. `last`: the step's last micro-batch. `test_nan`
  // (test only): the flat element whose gradient becomes NaN in this micro-batch, -1 for none.
  virtual void BeginMicroBatch(bool last, int64_t test_nan) = 0;
  // After the step's last backward pass: waits for the reductions still in flight and writes
  // the fp32 gradient of this rank's part into `grads` (the trainer's gradient buffer, in the
  // layout of its weights).
  virtual void FinishStep(float* grads) = 0;
  // Bytes of its own buffers (gathers, reductions in flight), besides the weights, gradients and
  // accumulator the trainer holds.
  virtual size_t buffer_bytes() const = 0;
  // The silent-data-corruption check of what a layout gathers: a hash of every unit this rank
  // gathered since the last call, which must agree across ranks; nullopt where nothing is
  // gathered (ZeRO 0/1 compare their replicas instead).
  virtual std::optional<uint64_t> TakeGatheredHash() { return std::nullopt; }
  // Test only: flip one bit of the next unit this rank gathers, as a faulty node would; a layout
  // that gathers nothing ignores it (its replicas are corrupted after the update instead).
  virtual void CorruptNextGather() {}
};

class ReplicatedAccess : public TrainingAccess {
 public:
  // `overlap`: start each unit's reduction during the last micro-batch's backward pass (else
  // the caller reduces the whole accumulator after the backward pass).
  ReplicatedAccess(const ParameterTable& table, DataParallel& data_parallel,
                   ExactAccumulator& accumulator, const float* weights, float* grads, bool overlap,
                   NonFiniteHandler on_non_finite);
  // Zeroes the accumulator.
  void BeginStep() override;
  void BeginMicroBatch(bool last, int64_t test_nan) override {
    last_ = last;
    test_nan_ = test_nan;
  }
  // The reductions still in flight (overlap), or the whole accumulator's (without).
  void FinishStep(float* grads) override;
  size_t buffer_bytes() const override;

  const float* AcquireWeights(int unit) override;
  float* Gradients(int unit) override;
  void GradientsReady(int unit) override;
  // Added to the accumulator at once, on its own grid.
  void AddGradient(int unit, size_t begin, size_t end, float* values) override;

 private:
  const ParameterTable& table_;
  DataParallel& dp_;
  ExactAccumulator& accumulator_;
  const float* weights_;
  float* grads_;
  bool overlap_, last_ = false;
  NonFiniteHandler on_non_finite_;
  int64_t test_nan_ = -1;
};

class ShardedAccess : public TrainingAccess {
 public:
  static constexpr int kGatherBuffers = 3;     // in use, prefetched, and the tied embedding
  static constexpr int kReductionBuffers = 4;  // gradient pieces in flight

  // weight_shard[i - shard_begin] is parameter i of this rank's shard.
  ShardedAccess(const ParameterTable& table, DataParallel& data_parallel, float* weight_shard,
                bool overlap, NonFiniteHandler on_non_finite);

  // Before a step's first micro-batch: the parameters changed, so gathered units are stale.
  void BeginStep() override;
  void BeginMicroBatch(bool /*last*/, int64_t test_nan) override { test_nan_ = test_nan; }
  // Writes the fp32 gradient of this rank's shard (grad_shard[i - shard_begin]).
  void FinishStep(float* grad_shard) override;

  // Silent-data-corruption check: a hash of every unit this rank gathered, in order, since the
  // last TakeGatheredHash(). Ranks gather the same bytes, so their hashes must agree.
  void EnableHashing(bool on) { hashing_ = on; }
  std::optional<uint64_t> TakeGatheredHash() override;
  void CorruptNextGather() override { corrupt_next_ = true; }

  // Bytes of the gather, gradient and reduction buffers (besides the shards).
  size_t buffer_bytes() const override;
  // Unit gathers started since construction (each one all-gather of the unit's parameters).
  int64_t gathers_started() const { return gathers_started_; }

  const float* AcquireWeights(int unit) override;
  void ReleaseWeights(int unit) override;
  void Prefetch(int unit) override;
  float* Gradients(int unit) override;
  void GradientsReady(int unit) override;
  // Each contribution is put on the grid and turned into fixed point by itself, and the sum of
  // them is added to the unit's own when GradientsReady sends it.
  void AddGradient(int unit, size_t begin, size_t end, float* values) override;

 private:
  struct GatherBuffer {
    int unit = -1;
    std::vector<float> data;
    Communicator::Handle handle = -1;
    bool pending = false, in_use = false;
    uint64_t last_use = 0;
  };
  struct Reduction {
    std::vector<__int128> send, receive;
    size_t receive_offset = 0, receive_count = 0;  // where the sums go in the shard
    ExactGroupSum::Handle handle = -1;
    bool pending = false;
    uint64_t started = 0;
  };
  GatherBuffer* Find(int unit);
  GatherBuffer* Victim();
  void StartGather(GatherBuffer& buffer, int unit);
  void Complete(GatherBuffer& buffer);
  void Complete(Reduction& reduction);
  void StartReduction(size_t begin, size_t end, const float* grads);
  void Progress();

  const ParameterTable& table_;
  DataParallel& dp_;
  Communicator& comm_;
  float* weight_shard_;
  bool overlap_;
  NonFiniteHandler on_non_finite_;
  size_t shard_begin_, shard_size_;
  std::vector<GatherBuffer> gathers_;
  std::vector<float> grad_embedding_, grad_unit_;
  std::vector<Reduction> reductions_;
  std::vector<__int128> shard_sum_;
  // The other contributions to the current unit's elements [extra_begin_, extra_begin_ +
  // extra_count_) (AddGradient), and one's fixed-point values on the way there; sized at
  // construction for the largest block of expert tensors of a unit.
  std::vector<__int128> extra_, extra_one_;
  size_t extra_begin_ = 0, extra_count_ = 0;
  int extra_unit_ = -1;
  uint64_t clock_ = 0;
  int64_t gathers_started_ = 0;
  bool hashing_ = false, corrupt_next_ = false;
  int64_t test_nan_ = -1;
  std::string non_finite_;  // set when a piece of the current unit held a non-finite value
  uint64_t gathered_hash_ = 0;
};

}  // namespace crucible
