// SGD with momentum, as torch.optim.SGD computes it (dampening 0, not Nesterov), with decoupled
// weight decay (the weights shrink by 1 - lr wd; torch's weight_decay would add wd w to g):
//   b = beta1 b + g;  w = w (1 - lr wd) - lr b
// optimizer.beta1 is the momentum.
#include "optim/optimizer.h"

namespace crucible {
namespace {

class Sgd final : public Optimizer {
 public:
  ShardMode shard_mode() const override { return ShardMode::kElementwise; }
  std::vector<StateSpec> state() const override { return {{"momentum"}}; }

  void Update(const TensorUpdate& u) const override {
    const float lr = static_cast<float>(u.lr);
    const float beta1 = static_cast<float>(u.group.beta1);
    const float decay = 1.0f - lr * static_cast<float>(u.group.weight_decay);
    float* params = u.weights.data();
    const float* grads = u.grads.data();
    float* m = u.state[0].data();
    const int64_t n = static_cast<int64_t>(u.weights.size());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      m[i] = beta1 * m[i] + grads[i];
      params[i] = params[i] * decay - lr * m[i];
    }
  }
};

OptimizerRegistrar sgd_registrar("SGD", [](const Config&) -> std::unique_ptr<Optimizer> {
  return std::make_unique<Sgd>();
});

}  // namespace
}  // namespace crucible
