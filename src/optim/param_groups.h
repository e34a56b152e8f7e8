// Parameter groups: the tensors of the parameter table grouped by what they are (ParamKind),
// each group with its own optimizer settings. The keys give every group the same settings
// except weight decay (norms and embeddings are not decayed unless optimizer.decay_norms /
// decay_embeddings). A key per group is read in BuildParamGroups. Under a matrices-only
// optimizer (Muon, Mano: optim/per_group_optimizer.h) the groups other than "matrices" are
// AdamW's and take the optimizer.adamw_* keys.
#pragma once

#include <initializer_list>
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
  std::string name;              // "matrices", "embeddings", "head", "norms", "balance"
  std::vector<ParamKind> kinds;  // the tensors it holds
  GroupSettings settings;
  // The keys its learning rate and weight decay come from (for messages).
  std::string lr_key = "optimizer.lr", decay_key = "optimizer.weight_decay";
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

// A set of parameter kinds (model/parameters.h), e.g. the tensors that carry an optimizer state
// (StateSpec::carried_by, optim/optimizer.h).
class ParamKinds {
 public:
  constexpr ParamKinds(std::initializer_list<ParamKind> kinds) {
    for (ParamKind kind : kinds) bits_ |= Bit(kind);
  }
  static constexpr ParamKinds All() {
    return {ParamKind::kEmbedding, ParamKind::kNorm,        ParamKind::kLinear,
            ParamKind::kOutputProjection, ParamKind::kHead, ParamKind::kBalanceBias};
  }
  constexpr bool Contains(ParamKind kind) const { return (bits_ & Bit(kind)) != 0; }
  constexpr ParamKinds Complement() const { return ParamKinds(All().bits_ & ~bits_); }
  constexpr ParamKinds operator&(ParamKinds other) const { return ParamKinds(bits_ & other.bits_); }
  constexpr bool operator==(const ParamKinds&) const = default;

 private:
  constexpr explicit ParamKinds(unsigned bits) : bits_(bits) {}
  static constexpr unsigned Bit(ParamKind kind) { return 1u << static_cast<unsigned>(kind); }
  unsigned bits_ = 0;
};

// The tensors of the "matrices" group: the 2-D hidden matrices (attention and MLP projections).
inline constexpr ParamKinds kHiddenMatrices{ParamKind::kLinear, ParamKind::kOutputProjection};
inline bool IsHiddenMatrix(ParamKind kind) {
  return kHiddenMatrices.Contains(kind);
}

// The four groups from the [optimizer] keys: matrices (kLinear and kOutputProjection), embeddings
// (kEmbedding), head (kHead) and norms (kNorm), all with optimizer.beta1, beta2, eps and lr scale
// 1; weight decay optimizer.weight_decay, except embeddings without optimizer.decay_embeddings
// and norms without optimizer.decay_norms (0). adamw_for_others: embeddings, head and norms take
// optimizer.adamw_beta1, adamw_beta2, adamw_eps, adamw_weight_decay (the same decay_* rule) and
// lr scale adamw_lr / lr (1 when adamw_lr is 0); UsageError when adamw_lr > 0 and lr is 0.
// The fifth group, balance (kBalanceBias), is no optimizer's: optim/balance_bias.h updates it
// with no group setting (weight decay 0).
ParamGroups BuildParamGroups(const Config& config, bool adamw_for_others = false);

}  // namespace crucible
