// Parameter groups: the tensors of the parameter table grouped by what they are (ParamKind),
// each group with its own optimizer settings. Today's keys give every group the same settings
// except weight decay (norms and embeddings are not decayed unless optimizer.decay_norms /
// decay_embeddings). A key per group is read in BuildParamGroups. An optimizer per group (say
// Muon for the matrices, AdamW for the rest) adds the optimizer to ParamGroup; OptimizerShard
// then keeps one state list per optimizer over its groups' tensors (its slots are per tensor
// already), and checkpoints store each state for the tensors that have it.
#pragma once

#include <string>
#include <vector>

#include "common/config.h"
#include "model/parameters.h"

namespace crucible {

// The hyperparameters of one group. Each optimizer reads the ones it uses.
struct GroupSettings {
  double lr_scale = 1.0;      // the group's learning rate is the schedule's times this
  double weight_decay = 0.0;  // decoupled: each step multiplies the weights by 1 - lr x this
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
};

struct ParamGroup {
  std::string name;              // "matrices", "embeddings", "head", "norms"
  std::vector<ParamKind> kinds;  // the tensors it holds
  GroupSettings settings;
};

class ParamGroups {
 public:
  ParamGroups() = default;
  // A kind in two groups is an internal error.
  explicit ParamGroups(std::vector<ParamGroup> groups);
  const std::vector<ParamGroup>& groups() const { return groups_; }
  // The group holding tensors of `kind` (internal error when no group does).
  const ParamGroup& Of(ParamKind kind) const;

 private:
  std::vector<ParamGroup> groups_;
};

// The four groups from the [optimizer] keys: matrices (kLinear and kOutputProjection), embeddings
// (kEmbedding), head (kHead) and norms (kNorm), all with optimizer.beta1, beta2, eps and lr scale
// 1; weight decay optimizer.weight_decay, except embeddings without optimizer.decay_embeddings
// and norms without optimizer.decay_norms (0).
ParamGroups BuildParamGroups(const Config& config);

}  // namespace crucible
