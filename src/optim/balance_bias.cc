#include "optim/balance_bias.h"

namespace crucible {
namespace {

class BalanceBias final : public Optimizer {
 public:
  BalanceBias(std::shared_ptr<const Optimizer> inner, double speed)
      : inner_(std::move(inner)), speed_(static_cast<float>(speed)) {}

  ShardMode shard_mode() const override { return inner_->shard_mode(); }
  ShardMode shard_mode_of(const ParamInfo& param) const override {
    return param.kind == ParamKind::kBalanceBias ? ShardMode::kElementwise
                                                 : inner_->shard_mode_of(param);
  }
  std::vector<StateSpec> state() const override {
    std::vector<StateSpec> specs = inner_->state();
    for (StateSpec& spec : specs)
      spec.carried_by = spec.carried_by & ParamKinds{ParamKind::kBalanceBias}.Complement();
    return specs;
  }
  void Update(const TensorUpdate& update) const override {
    if (update.param.kind != ParamKind::kBalanceBias) return inner_->Update(update);
    const float speed = speed_;
    float* w = update.weights.data();
    const float* g = update.grads.data();
    for (size_t i = 0; i < update.weights.size(); ++i)
      w[i] -= g[i] > 0 ? speed : g[i] < 0 ? -speed : 0.0f;
  }
  bool matrices_only() const override { return inner_->matrices_only(); }
  int64_t hessian_interval() const override { return inner_->hessian_interval(); }
  void UpdateHessian(const TensorUpdate& update) const override {
    if (update.param.kind != ParamKind::kBalanceBias) inner_->UpdateHessian(update);
  }
  std::vector<OptimizerMetric> metrics() const override { return inner_->metrics(); }

 private:
  std::shared_ptr<const Optimizer> inner_;
  float speed_;
};

}  // namespace

std::unique_ptr<Optimizer> WithBalanceBias(std::shared_ptr<const Optimizer> optimizer,
                                           double speed) {
  return std::make_unique<BalanceBias>(std::move(optimizer), speed);
}

}  // namespace crucible
