// The optimizer step of one data-parallel rank: this rank's OptimizerShard
// (optim/optimizer_shard.h) and how the update is spread over the ranks of the group. The trainer
// hands it what it holds after the gradient reduction and clipping, and gets back the updated
// weights of the same flat range; what moves between ranks in between is this class's business.
//
// The trainer's flat range is [update_begin, update_end) of its DataParallel: element i of the
// weights and gradients at [i - base]. ZeRO-0 (or one rank): the whole buffer, base 0. ZeRO-1:
// full replicated weights (base 0), reduced gradients valid in the range. ZeRO-3: the shard
// (base = shard_begin()). Step leaves the updated weights of the range in place and touches
// nothing else, so DataParallel::GatherParams, the detectors and the divergence checks see what
// they saw before this class existed.
//
// Checkpoints hold the state of every parameter as one rank over [0, n) holds it: full_state()
// is such an OptimizerShard. GatherFullState() fills it on rank 0 from every rank's state,
// ScatterFullState() keeps this rank's part of one a resume loaded (on every rank), and
// ReleaseFullState() frees its buffers while neither needs them; where the local shard covers
// every parameter, full_state() is that shard and the three do nothing. So optimizer.safetensors
// is the same bytes for any number of ranks and ZeRO stage, and resumes on any.
//
// Two implementations, chosen by MakeShardedOptimizer:
//  - FlatRangeOptimizer: the shard is the trainer's flat range. Every kElementwise optimizer, and
//    a kWholeMatrix one where the range cuts no tensor (one rank, or ZeRO-0).
//  - MatrixOwnerOptimizer: kWholeMatrix under ZeRO-1/3 across ranks. Each kWholeMatrix tensor
//    (Optimizer::shard_mode_of) has one owner (AssignMatrixOwners); the reduced gradient pieces
//    (ZeRO-3: and the weight pieces) go from the flat-range holders to the owners by one
//    all-to-allv (distributed/matrix_routes.h), each owner updates its tensors whole in
//    ascending order (StepMatrix), and the updated pieces go back by the reverse all-to-allv.
//    The kElementwise tensors of an optimizer that mixes the modes (Muon or Mano with AdamW)
//    are updated in this rank's flat range, as FlatRangeOptimizer does, and their state is
//    gathered from the ranges. A tensor's update is a function of its whole gradient, weights
//    and state (an elementwise one's of each element's), so every rank count gives the bits of
//    one rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distributed/data_parallel.h"
#include "distributed/matrix_routes.h"
#include "model/parameters.h"
#include "optim/optimizer_shard.h"

namespace crucible {

class ShardedOptimizer {
 public:
  virtual ~ShardedOptimizer() = default;
  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;

  // One update of the parameters (collective: every rank calls it at the same step). `lr`: the
  // schedule's learning rate of this step; `step` counts from 1; weights and grads as the header
  // says.
  virtual void Step(float* weights, const float* grads, double lr, int64_t step, size_t base) = 0;
  // The optimizer's Hessian update (Optimizer::hessian_interval) from `grads`, laid out as Step's
  // (collective as Step). The weights are read, not changed.
  virtual void UpdateHessian(float* weights, const float* grads, double lr, int64_t step,
                             size_t base) = 0;
  // Collective where the optimizer declares metrics (none: returns {} and communicates nothing):
  // the value of each of its metrics() over the last Step on every rank, reduced in rank order
  // (OptimizerMetric), so every rank layout gives the same values.
  std::vector<double> ReduceMetrics();

  // The state of every parameter in the layout of OptimizerShard(config, table, 0, n): what
  // Checkpointing saves and loads. Outlives every call below.
  OptimizerShard& full_state() { return full_ ? *full_ : *local_; }
  // Collective: rank 0's full_state() receives every rank's state (the other ranks' stays empty).
  virtual void GatherFullState() = 0;
  // After a resume loaded full_state() on every rank: this rank's state becomes its part of it.
  virtual void ScatterFullState() = 0;
  // Frees full_state()'s buffers (Checkpointing::Resume and GatherFullState allocate them again).
  void ReleaseFullState();

  // OptimizerShard::CountSharedTensorMetrics of this rank's shard.
  void CountSharedTensorMetrics(bool count) { local_->CountSharedTensorMetrics(count); }

  // This rank's own state, for the memory report.
  std::vector<ShardState> LocalState() { return local_->State(); }
  // Bytes of the buffers the step moves pieces through (0 where nothing moves).
  virtual size_t BufferBytes() const { return 0; }

 protected:
  ShardedOptimizer(const OptimizerConfig& config, const ParameterTable& table,
                   DataParallel& data_parallel)
      : config_(config), table_(table), data_parallel_(data_parallel) {}
  // Allocates full_ (with released buffers) where the state is spread over more than one rank.
  void MakeFullState();
  // Collective: rank 0 receives `mine` of every rank q, counts[q] floats each (`counts` is read
  // on rank 0 only), into `all` in rank order (an all-to-allv in which only rank 0 receives);
  // returns where each rank's block lies there.
  Communicator::Blocks GatherToRoot(const std::vector<float>& mine,
                                    const std::vector<size_t>& counts, std::vector<float>* all);
  // A state held by flat ranges (ZeRO-1/3, each rank the carrying elements of its update range):
  // Gather fills rank 0's `full` from every rank's `part` (collective), Scatter copies this
  // rank's part of a loaded `full` into `part`.
  void GatherRangeState(const ShardState& part, const ShardState& full);
  void ScatterRangeState(const ShardState& full, const ShardState& part);

  const OptimizerConfig& config_;
  const ParameterTable& table_;
  DataParallel& data_parallel_;
  std::unique_ptr<OptimizerShard> local_;  // this rank's state
  std::unique_ptr<OptimizerShard> full_;   // null: local_ covers every parameter
};

class FlatRangeOptimizer final : public ShardedOptimizer {
 public:
  // The shard is [update_begin(), update_end()) of `data_parallel`.
  FlatRangeOptimizer(const OptimizerConfig& config, const ParameterTable& table,
                     DataParallel& data_parallel);
  void Step(float* weights, const float* grads, double lr, int64_t step, size_t base) override;
  void UpdateHessian(float* weights, const float* grads, double lr, int64_t step,
                     size_t base) override;
  void GatherFullState() override;
  void ScatterFullState() override;
};

class MatrixOwnerOptimizer final : public ShardedOptimizer {
 public:
  // For a kWholeMatrix optimizer under ZeRO-1 or 3 (any number of ranks, one included).
  MatrixOwnerOptimizer(const OptimizerConfig& config, const ParameterTable& table,
                       DataParallel& data_parallel);
  void Step(float* weights, const float* grads, double lr, int64_t step, size_t base) override;
  // No whole-matrix optimizer has a Hessian estimate yet: an internal error.
  void UpdateHessian(float* weights, const float* grads, double lr, int64_t step,
                     size_t base) override;
  void GatherFullState() override;
  void ScatterFullState() override;
  size_t BufferBytes() const override;

 private:
  MatrixRoutes routes_;
  std::vector<int> owners_;        // of each tensor (kNoOwner: an elementwise one)
  std::vector<bool> owned_state_;  // of each spec: held by owners (else by flat ranges)
  // packed_: this rank's pieces as a holder (its flat range, packed by owner); owned_weights_,
  // owned_grads_: its tensors as an owner, concatenated.
  std::vector<float> packed_, owned_weights_, owned_grads_;
};

// The implementation for `config`'s shard mode and the group's ZeRO stage and size.
// `config`, `table` and `data_parallel` must outlive it.
std::unique_ptr<ShardedOptimizer> MakeShardedOptimizer(const OptimizerConfig& config,
                                                       const ParameterTable& table,
                                                       DataParallel& data_parallel);

}  // namespace crucible
