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
    const FloatSettings s(u);
    float* params = u.weights.data();
    float* momentum = u.state[0].data();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < static_cast<int64_t>(u.weights.size()); ++i) {
      momentum[i] = s.beta1 * momentum[i] + u.grads[i];
      params[i] = params[i] * s.decay - s.lr * momentum[i];
    }
  }
};

OptimizerRegistrar sgd_registrar("SGD", [](const Config&) -> std::unique_ptr<Optimizer> {
  return std::make_unique<Sgd>();
});

}  // namespace
}  // namespace crucible
