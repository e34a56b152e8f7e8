// What the trainer holds of the optimizer: the configured optimizer with its parameter groups
// (OptimizerConfig), and the state and update of the part of the parameters one rank updates
// (OptimizerShard). Nothing here knows of MPI: a shard updates what it is given.
//
// Two ways to cut the parameters, by the tensors' shard modes (Optimizer::shard_mode_of):
//  - a flat range [begin, end) of the parameter buffer (the whole buffer on one rank, a ZeRO
//    shard), updated by Step: kElementwise tensors in any range; kWholeMatrix ones only in a
//    range that cuts none of them (one rank, or ZeRO stage 0 where every rank updates
//    everything);
//  - a set of whole tensors, "owned" (kWholeMatrix across ZeRO ranks, each rank the tensors that
//    AssignMatrixOwners gives it), each updated by StepMatrix from its full gradient. Moving a
//    tensor's reduced gradient to its owner and the updated tensor back is the data-parallel
//    side's part (MatrixOwnerOptimizer, distributed/sharded_optimizer.h).
// A shard of an optimizer that mixes the modes (Muon or Mano with AdamW) holds both: the owned
// kWholeMatrix tensors, and the parts of the kElementwise ones inside its range.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/config.h"
#include "model/parameters.h"
#include "optim/optimizer.h"
#include "optim/param_groups.h"

namespace crucible {

struct OptimizerConfig {
  std::string name;    // optimizer.name, a registered optimizer
  std::string others;  // "AdamW" where `name` is matrices-only (trains the other groups), else ""
  std::shared_ptr<const Optimizer> optimizer;  // stateless, shared by every shard
  ParamGroups groups;
  // Tokens per global batch (TensorUpdate::batch_tokens); the trainer sets it from its
  // TrainingConfig before it builds the shards.
  double batch_tokens = 0;
};
// The shard mode of the tensors that carry `spec` (internal error when they have two: a spec of
// an optimizer that mixes modes is carried by one mode's tensors only, so each state is either
// gathered from owners or from flat ranges). kElementwise when no tensor carries it.
ShardMode StateShardMode(const OptimizerConfig& config, const ParameterTable& table,
                         const StateSpec& spec);
// Whether each tensor of `table` is updated whole (kWholeMatrix): AssignMatrixOwners' `whole`.
std::vector<bool> WholeTensors(const OptimizerConfig& config, const ParameterTable& table);

// Reads and checks the [optimizer] keys (UsageError, exit 2, on an unknown name or settings that
// cannot train). The peak learning rate is the schedule's (optim/lr_schedule.h).
// A matrices-only optimizer (Muon, Mano) trains the hidden matrices and AdamW the rest
// (optim/per_group_optimizer.h); every other optimizer trains every group.
OptimizerConfig BuildOptimizerConfig(const Config& config);
// The decoupled weight decay multiplies the weights by 1 - lr x weight_decay every step:
// UsageError (exit 2) unless lr x weight_decay < 1 for every group of `config`, at the peak
// learning rate `lr` (optimizer.lr, before a group's lr_scale) times `factor` (1, or what scales
// it, e.g. a batch-ramp stage), naming the group's keys after `context` (a prefix saying where
// `factor` comes from).
void CheckDecayBelowOne(const OptimizerConfig& config, double lr, double factor = 1,
                        const std::string& context = "");
// UsageError (exit 2) naming optimizer.name when `config`'s optimizer is matrices-only and
// `table` (of model `model`) has no 2-D hidden matrix, or one of more or fewer dimensions.
void CheckOptimizerFitsTable(const OptimizerConfig& config, const ParameterTable& table,
                             const std::string& model);

// A state buffer of a shard: the slots (tensors, or their parts inside a range) that carry the
// spec (StateSpec::carried_by), in slot order, each with its elements (a per-element state) or
// spec.per_tensor floats (a per-tensor one). The shard over [0, n) therefore holds
// LayOutFullState(spec, table) (optim/optimizer.h): the carrying tensors concatenated in table
// order, which is what checkpoints store. For a spec every tensor carries, a range [begin, end)
// holds element i at values[i - begin].
struct ShardState {
  const StateSpec& spec;
  std::vector<float>& values;
};

class OptimizerShard {
 public:
  // The elements [begin, end) of the flat parameter buffer.
  OptimizerShard(const OptimizerConfig& config, const ParameterTable& table, size_t begin,
                 size_t end);
  // The whole tensors `tensors` (indices into table.params(), ascending), owned.
  OptimizerShard(const OptimizerConfig& config, const ParameterTable& table,
                 const std::vector<size_t>& tensors);
  // Mixed: the kWholeMatrix tensors `tensors` (ascending), owned, and the parts of the
  // kElementwise tensors inside [begin, end). Slots in table order.
  OptimizerShard(const OptimizerConfig& config, const ParameterTable& table, size_t begin,
                 size_t end, const std::vector<size_t>& tensors);
  OptimizerShard(const OptimizerShard&) = delete;
  OptimizerShard& operator=(const OptimizerShard&) = delete;

  // One update of every element of the shard but the owned tensors; `lr` is the schedule's
  // learning rate of this step, `step` counts from 1. weights[i - base] and grads[i - base] hold
  // flat element i (base > 0 when they are a ZeRO-3 shard).
  void Step(float* weights, const float* grads, double lr, int64_t step, size_t base = 0);
  // One update of tensor `tensor` (an index into table.params()), which this shard holds whole:
  // `weights` and `grads` are its param.numel elements. An owner calls it after the step's Step.
  void StepMatrix(size_t tensor, std::span<float> weights, std::span<const float> grads, double lr,
                  int64_t step);
  // The optimizer's Hessian update of every element of the shard from `grads` (the sampled-target
  // gradients, laid out as Step's); only for an optimizer with hessian_interval() > 0.
  void UpdateHessian(float* weights, const float* grads, double lr, int64_t step, size_t base = 0);

  // The accumulators of the optimizer's metrics() over this shard's tensors since the last Step
  // (two doubles per metric, OptimizerMetric): Step starts them afresh, StepMatrix adds to them.
  const std::vector<double>& metric_accumulators() const { return metrics_; }
  // Whether the tensors that are not a routed expert's count in metric_accumulators() (default
  // true): expert parallelism counts them on one rank of each expert group only, since every
  // rank of it updates them alike.
  void CountSharedTensorMetrics(bool count) { count_shared_ = count; }

  // The state buffers, in the optimizer's declaration order.
  std::vector<ShardState> State();
  const OptimizerConfig& config() const { return config_; }

 private:
  // A tensor, or the part of it inside the range: elements [first, first + count) of the tensor;
  // `owned`: a whole tensor updated by StepMatrix (not by Step).
  struct Slot {
    size_t tensor, first, count;
    bool owned = false;
  };
  void AddRange(size_t begin, size_t end, bool elementwise_only);
  void AddOwned(const std::vector<size_t>& tensors);
  // Lays each spec's buffer out over the slots that carry it (state_offsets_) and allocates it.
  void Allocate();
  void UpdateSlot(size_t slot, float* weights, const float* grads, double lr, int64_t step,
                  bool hessian = false);
  void ResetMetrics();
  double StepBytes() const;  // what one Step moves at least, for the kernel profile

  OptimizerConfig config_;
  const ParameterTable& table_;
  std::vector<StateSpec> specs_;
  std::vector<Slot> slots_;
  // Where slot k's state of spec s starts in state_[s]: state_offsets_[k * specs + s]
  // (FullStateLayout::kNotCarried when the slot's tensor does not carry it).
  std::vector<size_t> state_offsets_;
  std::vector<std::vector<float>> state_;  // one per spec
  std::vector<std::span<float>> views_;    // one per spec, reused by each update
  std::vector<OptimizerMetric> metric_specs_;
  std::vector<double> metrics_;    // two per metric spec
  std::vector<double> uncounted_;  // where the tensors not counted accumulate (discarded)
  bool count_shared_ = true;
};

}  // namespace crucible
