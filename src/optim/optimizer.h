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

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/config.h"
#include "model/parameters.h"
#include "optim/param_groups.h"

namespace crucible {

enum class ShardMode { kElementwise, kWholeMatrix };

// One state tensor an optimizer keeps, for the tensors of the kinds in `carried_by` (every
// tensor by default). Checkpoints store it per carrying tensor, as "<name>.<parameter name>" in
// optimizer.safetensors, so `name` is part of the file format. A tensor that does not carry a
// state has none of it anywhere: no buffer in OptimizerShard, no entry in the checkpoint, an
// empty span in TensorUpdate::state (the per-group optimizer, optim/per_group_optimizer.h,
// declares each group's optimizer's specs for that group only).
struct StateSpec {
  std::string name;
  // 0: one float per parameter element (the tensor's shape). n > 0: n floats per parameter
  // tensor (e.g. a per-matrix scalar), allowed for kWholeMatrix optimizers only: a tensor cut
  // between ranks would have one copy per rank.
  size_t per_tensor = 0;
  ParamKinds carried_by = ParamKinds::All();

  bool Carries(const ParamInfo& param) const { return carried_by.Contains(param.kind); }
  // The floats of this state `param` has: 0, per_tensor, or one per element.
  size_t FloatsOf(const ParamInfo& param) const {
    return !Carries(param) ? 0 : per_tensor > 0 ? per_tensor : param.numel;
  }
};

// A state over every parameter, as checkpoints and ShardedOptimizer::full_state() hold it: the
// carrying tensors' floats concatenated in table order. offsets[t]: where tensor t's start
// (kNotCarried when it does not carry the state); size: the floats of all of them.
struct FullStateLayout {
  static constexpr size_t kNotCarried = static_cast<size_t>(-1);
  std::vector<size_t> offsets;
  size_t size = 0;
};
FullStateLayout LayOutFullState(const StateSpec& spec, const ParameterTable& table);

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
  // `weights`; a per-tensor state holds the tensor's n floats; a state the tensor does not carry
  // (StateSpec::carried_by) is empty.
  std::span<const std::span<float>> state;
  // Tokens per global batch (OptimizerConfig::batch_tokens): SophiaG scales its Hessian by it.
  double batch_tokens = 0;
  // Accumulators of the optimizer's metrics(): two doubles per metric, in declaration order
  // (empty when it declares none). See OptimizerMetric for what each holds.
  std::span<double> metrics = {};
};

// A number an optimizer reports of each step (metrics.jsonl, under `name`), reduced over every
// tensor of the step and every rank in a fixed order, so it is the same for any rank layout:
//   kMean  acc[0] and acc[1] are sums (say clipped coordinates and coordinates); the value is
//          acc[0] / acc[1]. Counts kept below 2^53 add exactly in any order.
//   kMin, kMax  acc[0] is the minimum / maximum seen (starts at +inf / -inf); acc[1] unused.
// A metric that goes above `warn_above` on a step from `warn_from_step` on logs `warning` (one
// line naming the step and the value) on rank 0, again only after it has come back below.
struct OptimizerMetric {
  enum Reduce { kMean, kMin, kMax };
  std::string name;
  Reduce reduce = kMean;
  double warn_above = std::numeric_limits<double>::infinity();
  int64_t warn_from_step = 1;
  std::string warning;
};

// The larger of an accumulated maximum and a value, NaN once either is NaN (std::fmax would drop
// it): how a kMax metric keeps a non-finite value visible.
inline double MaxOrNan(double accumulated, double value) {
  return std::isnan(accumulated) || std::isnan(value) ? std::nan("") : std::max(accumulated, value);
}

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
  // The strictest shard mode of its tensors: kWholeMatrix when any tensor must be updated whole.
  virtual ShardMode shard_mode() const = 0;
  // The shard mode of one tensor; shard_mode() unless the optimizer mixes them (the per-group
  // optimizer answers by group: Muon's matrices whole, AdamW's tensors elementwise). Under
  // ZeRO-1/3 across ranks the kWholeMatrix tensors are updated by owner ranks and the others in
  // the flat range of the rank that holds each piece (distributed/sharded_optimizer.h).
  virtual ShardMode shard_mode_of(const ParamInfo& /*param*/) const { return shard_mode(); }
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

  // ---- optional: a Hessian-diagonal estimate (SophiaG), one seam for any optimizer ----
  // k > 0: on every step with step % k == 0, after that step's Update, the trainer runs one
  // more forward and backward pass over the step's batch against targets sampled from the
  // model's own logits (train/sampled_targets.h), reduces and clips those gradients exactly as
  // the step's, and calls UpdateHessian with them in `grads` (the weights are the updated ones;
  // state and metrics as in Update). 0 (the default): never; UpdateHessian is then not called.
  // The phase is a function of the step, so a resume at any step continues it.
  virtual int64_t hessian_interval() const { return 0; }
  virtual void UpdateHessian(const TensorUpdate& update) const;
  // The metrics Update accumulates (none by default).
  virtual std::vector<OptimizerMetric> metrics() const { return {}; }
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
