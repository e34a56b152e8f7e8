#include "optim/param_groups.h"

#include "common/error.h"

namespace crucible {

ParamGroups::ParamGroups(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {
  for (size_t a = 0; a < groups_.size(); ++a)
    for (size_t b = a + 1; b < groups_.size(); ++b)
      for (ParamKind kind : groups_[a].kinds)
        for (ParamKind other : groups_[b].kinds)
          if (kind == other)
            throw Error(kExitFailure, "internal: parameter groups " + groups_[a].name + " and " +
                                          groups_[b].name + " share a parameter kind");
}

const ParamGroup& ParamGroups::Of(ParamKind kind) const {
  for (const ParamGroup& group : groups_)
    for (ParamKind k : group.kinds)
      if (k == kind) return group;
  throw Error(kExitFailure, "internal: no parameter group holds parameter kind " +
                                std::to_string(static_cast<int>(kind)));
}

ParamGroups BuildParamGroups(const Config& config, bool adamw_for_others) {
  GroupSettings matrices;
  matrices.beta1 = config.Float("optimizer.beta1");
  matrices.beta2 = config.Float("optimizer.beta2");
  matrices.eps = config.Float("optimizer.eps");
  matrices.weight_decay = config.Float("optimizer.weight_decay");
  GroupSettings decayed = matrices;
  if (adamw_for_others) {
    decayed.beta1 = config.Float("optimizer.adamw_beta1");
    decayed.beta2 = config.Float("optimizer.adamw_beta2");
    decayed.eps = config.Float("optimizer.adamw_eps");
    decayed.weight_decay = config.Float("optimizer.adamw_weight_decay");
    const double lr = config.Float("optimizer.lr"), adamw_lr = config.Float("optimizer.adamw_lr");
    if (adamw_lr > 0 && lr == 0)
      throw UsageError(
          "optimizer.adamw_lr: is a scale of the schedule of optimizer.lr, which is "
          "0; set optimizer.lr > 0");
    if (adamw_lr > 0) decayed.lr_scale = adamw_lr / lr;
  }
  GroupSettings undecayed = decayed;
  undecayed.weight_decay = 0.0;
  std::vector<ParamGroup> groups = {
      {"matrices", {ParamKind::kLinear, ParamKind::kOutputProjection}, matrices},
      {"embeddings",
       {ParamKind::kEmbedding},
       config.Bool("optimizer.decay_embeddings") ? decayed : undecayed},
      {"head", {ParamKind::kHead}, decayed},
      {"norms", {ParamKind::kNorm}, config.Bool("optimizer.decay_norms") ? decayed : undecayed},
      // Not trained: the balance rule (optim/balance_bias.h) takes no group setting.
      {"balance", {ParamKind::kBalanceBias}, undecayed},
  };
  if (adamw_for_others) {
    for (size_t g = 1; g + 1 < groups.size(); ++g) {
      groups[g].decay_key = "optimizer.adamw_weight_decay";
      if (config.Float("optimizer.adamw_lr") > 0) groups[g].lr_key = "optimizer.adamw_lr";
    }
  }
  return ParamGroups(std::move(groups));
}

}  // namespace crucible
