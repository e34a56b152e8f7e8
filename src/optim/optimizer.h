// The optimizer interface: the update rule of one optimizer (AdamW, SGD, Lion, ...), found by
// name in a registry. Each optimizer lives in its own .cc file with a static OptimizerRegistrar,
// as each subcommand does in cli/; nothing else names it.
//
// An Optimizer holds no state of its own: it declares the state tensors it needs (StateSpec),
// and OptimizerShard (optim/optimizer_shard.h) allocates them, hands the optimizer one tensor at
// a time, and exposes them by name for checkpoints. Its shard mode says how the parameters may be
// cut between ranks:
//   kElementwise  the update of element i depends only on element i (its weight, gradient and
//                 state): any flat range of a tensor may be updated alone, so ZeRO shards the
//                 elements in any chunking (AdamW, SGD, Lion);
//   kWholeMatrix  the update of a tensor needs all of it (Newton-Schulz on a matrix, row and
//                 column norms): each tensor is updated whole, by the one rank that owns it
//                 (optim/matrix_owners.h assigns the owners).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/config.h"
#include "model/parameters.h"
#include "optim/param_groups.h"

namespace crucible {

enum class ShardMode { kElementwise, kWholeMatrix };

// One state tensor an optimizer keeps. Checkpoints store it per parameter tensor, as
// "<name>.<parameter name>" in optimizer.safetensors, so `name` is part of the file format.
struct StateSpec {
  std::string name;
  // 0: one float per parameter element (the tensor's shape). n > 0: n floats per parameter
  // tensor (e.g. a per-matrix scalar), allowed for kWholeMatrix optimizers only: a tensor cut
  // between ranks would have one copy per rank.
  size_t per_tensor = 0;
  // A per-tensor value the optimizer writes at each update for monitoring and never reads back
  // (Muon's largest Newton-Schulz iterate, ...): the trainer logs its largest value over every
  // tensor each step, as "opt_<name>" in metrics.jsonl. Still saved in checkpoints.
  bool diagnostic = false;
};

// What one update sees of one parameter tensor.
struct TensorUpdate {
  const ParamInfo& param;
  const GroupSettings& group;  // the settings of the tensor's parameter group
  double lr;                   // this step's learning rate for the group (schedule x lr_scale)
  int64_t step;                // counts from 1
  // weights[k] and grads[k] are element first + k of the tensor. kWholeMatrix: first is 0 and
  // the spans hold the whole tensor (param.numel elements).
  size_t first;
  std::span<float> weights;
  std::span<const float> grads;
  // One span per StateSpec, in declaration order: a per-element state is aligned with
  // `weights`; a per-tensor state holds the tensor's n floats.
  std::span<const std::span<float>> state;
};

// The settings of an update in float, as torch's optimizers compute them: the group's learning
// rate, betas and eps, and the decoupled weight decay's factor 1 - lr x weight_decay.
struct FloatSettings {
  explicit FloatSettings(const TensorUpdate& u)
      : lr(static_cast<float>(u.lr)),
        beta1(static_cast<float>(u.group.beta1)),
        beta2(static_cast<float>(u.group.beta2)),
        eps(static_cast<float>(u.group.eps)),
        decay(1.0f - lr * static_cast<float>(u.group.weight_decay)) {}
  float lr, beta1, beta2, eps, decay;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual ShardMode shard_mode() const = 0;
  // The state tensors, fixed for the optimizer (not for the shard: a rank whose shard is empty
  // declares the same list, so every rank walks the same list in collective operations).
  virtual std::vector<StateSpec> state() const = 0;
  // Updates update.weights in place from update.grads and the state. Must give the same bits for
  // any OpenMP thread count, and (kElementwise) for any cut of the tensor into ranges.
  virtual void Update(const TensorUpdate& update) const = 0;
  // True for an optimizer defined on the 2-D hidden matrices only (Muon, Mano): `optimizer.name`
  // then names the optimizer of the "matrices" group, and the other groups (embeddings, head,
  // norms) are updated by AdamW with the optimizer.adamw_* keys (optim/per_group_optimizer.h).
  virtual bool matrices_only() const { return false; }
};

// Builds an optimizer; `config` is the run's resolved config, for keys of its own.
using OptimizerFactory = std::unique_ptr<Optimizer> (*)(const Config& config);

// Registers an optimizer under `name` (the value of optimizer.name); one static instance in the
// optimizer's .cc file. Registering a name twice is a bug and aborts at start-up.
struct OptimizerRegistrar {
  OptimizerRegistrar(const char* name, OptimizerFactory factory);
};

// The registered names, sorted.
std::vector<std::string> RegisteredOptimizers();
// The optimizer registered as `name`; UsageError (exit 2) naming `key` and listing the
// registered names when there is none.
std::unique_ptr<Optimizer> MakeOptimizer(const std::string& name, const Config& config,
                                         const std::string& key = "optimizer.name");

}  // namespace crucible
