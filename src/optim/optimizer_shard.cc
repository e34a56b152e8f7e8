#include "optim/optimizer_shard.h"

#include <algorithm>
#include <limits>

#include "common/error.h"
#include "common/profile.h"
#include "common/strings.h"
#include "optim/balance_bias.h"
#include "optim/per_group_optimizer.h"

namespace crucible {

OptimizerConfig BuildOptimizerConfig(const Config& config) {
  OptimizerConfig o;
  o.name = config.String("optimizer.name");
  std::shared_ptr<const Optimizer> named = MakeOptimizer(o.name, config);
  const bool per_group = named->matrices_only();
  o.optimizer = per_group ? MakePerGroupOptimizer(named, MakeOptimizer("AdamW", config)) : named;
  // ParamKind::kBalanceBias tensors (a mixture of experts' routing bias) follow their own rule.
  o.optimizer = WithBalanceBias(o.optimizer, config.Float("model.bias_update_speed"));
  if (per_group) o.others = "AdamW";
  o.groups = BuildParamGroups(config, per_group);
  // Single keys are range-checked by Config::Validate; this is what they mean together.
  CheckDecayBelowOne(o, config.Float("optimizer.lr"));
  return o;
}

void CheckDecayBelowOne(const OptimizerConfig& config, double lr, double factor,
                        const std::string& context) {
  for (const ParamGroup& group : config.groups.groups()) {
    const double group_lr = lr * group.settings.lr_scale, decay = group.settings.weight_decay;
    if (group_lr * factor * decay < 1) continue;
    const std::string times = factor == 1 ? "" : StrFormat(" x %g", factor);
    throw UsageError(StrFormat(
        "%s%s%s x %s = %g%s x %g = %g: must be below 1 (the decoupled weight decay multiplies the "
        "weights by 1 - lr x weight_decay every step)",
        context.c_str(), group.lr_key.c_str(), times.c_str(), group.decay_key.c_str(), group_lr,
        times.c_str(), decay, group_lr * factor * decay));
  }
}

void CheckOptimizerFitsTable(const OptimizerConfig& config, const ParameterTable& table,
                             const std::string& model) {
  if (config.others.empty()) return;
  size_t matrices = 0;
  for (const ParamInfo& p : table.params()) {
    if (!IsHiddenMatrix(p.kind)) continue;
    if (p.shape.size() != 2)
      throw UsageError(
          StrFormat("optimizer.name: %s updates 2-D matrices, but %s of model %s "
                    "has %zu dimensions",
                    config.name.c_str(), p.name.c_str(), model.c_str(), p.shape.size()));
    ++matrices;
  }
  if (matrices == 0)
    throw UsageError(
        StrFormat("optimizer.name: %s updates the 2-D hidden matrices, and model %s "
                  "has none (choose AdamW, SGD or Lion)",
                  config.name.c_str(), model.c_str()));
}

ShardMode StateShardMode(const OptimizerConfig& config, const ParameterTable& table,
                         const StateSpec& spec) {
  bool whole = false, elementwise = false;
  for (const ParamInfo& p : table.params())
    if (spec.Carries(p))
      (config.optimizer->shard_mode_of(p) == ShardMode::kWholeMatrix ? whole : elementwise) = true;
  if (whole && elementwise)
    throw Error(kExitFailure, "internal: optimizer " + config.name + "'s state '" + spec.name +
                                  "' is carried by whole-matrix and by elementwise tensors");
  return whole ? ShardMode::kWholeMatrix : ShardMode::kElementwise;
}

std::vector<bool> WholeTensors(const OptimizerConfig& config, const ParameterTable& table) {
  std::vector<bool> whole;
  for (const ParamInfo& p : table.params())
    whole.push_back(config.optimizer->shard_mode_of(p) == ShardMode::kWholeMatrix);
  return whole;
}

OptimizerShard::OptimizerShard(const OptimizerConfig& config, const ParameterTable& table,
                               size_t begin, size_t end)
    : config_(config), table_(table), specs_(config.optimizer->state()) {
  AddRange(begin, end, false);
  Allocate();
}

OptimizerShard::OptimizerShard(const OptimizerConfig& config, const ParameterTable& table,
                               const std::vector<size_t>& tensors)
    : config_(config), table_(table), specs_(config.optimizer->state()) {
  AddOwned(tensors);
  Allocate();
}

OptimizerShard::OptimizerShard(const OptimizerConfig& config, const ParameterTable& table,
                               size_t begin, size_t end, const std::vector<size_t>& tensors)
    : config_(config), table_(table), specs_(config.optimizer->state()) {
  for (size_t t : tensors)
    if (t < table.params().size() &&
        config.optimizer->shard_mode_of(table.params()[t]) != ShardMode::kWholeMatrix)
      throw Error(kExitFailure, "internal: optimizer shard owns " + table.params()[t].name +
                                    ", which is updated elementwise");
  AddOwned(tensors);
  AddRange(begin, end, true);
  std::stable_sort(slots_.begin(), slots_.end(),
                   [](const Slot& a, const Slot& b) { return a.tensor < b.tensor; });
  Allocate();
}

void OptimizerShard::AddRange(size_t begin, size_t end, bool elementwise_only) {
  for (size_t t = 0; t < table_.params().size(); ++t) {
    const ParamInfo& p = table_.params()[t];
    const bool whole = config_.optimizer->shard_mode_of(p) == ShardMode::kWholeMatrix;
    const size_t b = std::max(begin, p.offset), e = std::min(end, p.offset + p.numel);
    if (b >= e || (whole && elementwise_only)) continue;
    if (whole && e - b != p.numel)
      throw Error(kExitFailure,
                  StrFormat("internal: optimizer %s updates whole tensors, but the range [%zu, "
                            "%zu) holds only part of %s",
                            config_.name.c_str(), begin, end, p.name.c_str()));
    slots_.push_back({t, b - p.offset, e - b});
  }
}

void OptimizerShard::AddOwned(const std::vector<size_t>& tensors) {
  for (size_t k = 0; k < tensors.size(); ++k) {
    const size_t t = tensors[k];
    if (t >= table_.params().size() || (k > 0 && t <= tensors[k - 1]))
      throw Error(kExitFailure,
                  "internal: optimizer shard tensors must be ascending table indices");
    slots_.push_back({t, 0, table_.params()[t].numel, true});
  }
}

void OptimizerShard::Allocate() {
  state_offsets_.assign(slots_.size() * specs_.size(), FullStateLayout::kNotCarried);
  for (size_t s = 0; s < specs_.size(); ++s) {
    const StateSpec& spec = specs_[s];
    if (spec.per_tensor > 0 && StateShardMode(config_, table_, spec) != ShardMode::kWholeMatrix)
      throw Error(kExitFailure, "internal: optimizer " + config_.name +
                                    " declares per-tensor state '" + spec.name +
                                    "' but updates elementwise");
    size_t size = 0;
    for (size_t k = 0; k < slots_.size(); ++k) {
      if (!spec.Carries(table_.params()[slots_[k].tensor])) continue;
      state_offsets_[k * specs_.size() + s] = size;
      size += spec.per_tensor > 0 ? spec.per_tensor : slots_[k].count;
    }
    state_.emplace_back(size, 0.0f);
  }
  views_.resize(specs_.size());
  metric_specs_ = config_.optimizer->metrics();
  ResetMetrics();
}

void OptimizerShard::ResetMetrics() {
  metrics_.assign(2 * metric_specs_.size(), 0.0);
  uncounted_ = metrics_;
  for (size_t j = 0; j < metric_specs_.size(); ++j) {
    const double inf = std::numeric_limits<double>::infinity();
    if (metric_specs_[j].reduce == OptimizerMetric::kMin) metrics_[2 * j] = inf;
    if (metric_specs_[j].reduce == OptimizerMetric::kMax) metrics_[2 * j] = -inf;
  }
}

void OptimizerShard::UpdateSlot(size_t index, float* weights, const float* grads, double lr,
                                int64_t step, bool hessian) {
  const Slot& slot = slots_[index];
  const ParamInfo& param = table_.params()[slot.tensor];
  const ParamGroup& group = config_.groups.Of(param.kind);
  for (size_t s = 0; s < specs_.size(); ++s) {
    const size_t offset = state_offsets_[index * specs_.size() + s];
    const size_t floats = specs_[s].per_tensor > 0 ? specs_[s].per_tensor : slot.count;
    views_[s] = offset == FullStateLayout::kNotCarried
                    ? std::span<float>()
                    : std::span<float>(state_[s].data() + offset, floats);
  }
  const TensorUpdate update{param,
                            group.settings,
                            lr * group.settings.lr_scale,
                            step,
                            slot.first,
                            std::span<float>(weights, slot.count),
                            std::span<const float>(grads, slot.count),
                            views_,
                            config_.batch_tokens,
                            count_shared_ || param.expert >= 0 ? metrics_ : uncounted_};
  if (hessian)
    config_.optimizer->UpdateHessian(update);
  else
    config_.optimizer->Update(update);
}

double OptimizerShard::StepBytes() const {
  // Each element's weight read and written, its gradient read, each per-element state read and
  // written.
  size_t elements = 0, per_element_states = 0;
  for (const Slot& slot : slots_) elements += slot.count;
  for (const StateSpec& spec : specs_) per_element_states += spec.per_tensor == 0;
  return 4.0 * static_cast<double>(elements) * static_cast<double>(3 + 2 * per_element_states);
}

void OptimizerShard::Step(float* weights, const float* grads, double lr, int64_t step,
                          size_t base) {
  ScopedKernelTimer profile_timer("optimizer", 0, KernelProfileEnabled() ? StepBytes() : 0);
  ResetMetrics();
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].owned) continue;
    const size_t element = table_.params()[slots_[i].tensor].offset + slots_[i].first;
    UpdateSlot(i, weights + (element - base), grads + (element - base), lr, step);
  }
}

void OptimizerShard::UpdateHessian(float* weights, const float* grads, double lr, int64_t step,
                                   size_t base) {
  ScopedKernelTimer profile_timer("optimizer");
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].owned) continue;
    const size_t element = table_.params()[slots_[i].tensor].offset + slots_[i].first;
    UpdateSlot(i, weights + (element - base), grads + (element - base), lr, step, true);
  }
}

void OptimizerShard::StepMatrix(size_t tensor, std::span<float> weights,
                                std::span<const float> grads, double lr, int64_t step) {
  ScopedKernelTimer profile_timer("optimizer");
  auto slot =
      std::find_if(slots_.begin(), slots_.end(), [&](const Slot& s) { return s.tensor == tensor; });
  const ParamInfo* param = tensor < table_.params().size() ? &table_.params()[tensor] : nullptr;
  if (slot == slots_.end() || !slot->owned || !param || slot->count != param->numel ||
      weights.size() != param->numel || grads.size() != param->numel)
    throw Error(kExitFailure,
                StrFormat("internal: StepMatrix(%zu) on a shard that does not hold that tensor "
                          "whole, or with spans of another size",
                          tensor));
  UpdateSlot(static_cast<size_t>(slot - slots_.begin()), weights.data(), grads.data(), lr, step);
}

std::vector<ShardState> OptimizerShard::State() {
  std::vector<ShardState> state;
  for (size_t s = 0; s < specs_.size(); ++s) state.push_back({specs_[s], state_[s]});
  return state;
}

}  // namespace crucible
