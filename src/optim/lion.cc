// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2):
//   c = beta1 m + (1 - beta1) g;  w = w (1 - lr wd) - lr sign(c);  m = beta2 m + (1 - beta2) g
// sign(0) is 0.
#include "optim/optimizer.h"

namespace crucible {
namespace {

class Lion final : public Optimizer {
 public:
  ShardMode shard_mode() const override { return ShardMode::kElementwise; }
  std::vector<StateSpec> state() const override { return {{"exp_avg"}}; }

  void Update(const TensorUpdate& u) const override {
    const float lr = static_cast<float>(u.lr);
    const float beta1 = static_cast<float>(u.group.beta1);
    const float beta2 = static_cast<float>(u.group.beta2);
    const float decay = 1.0f - lr * static_cast<float>(u.group.weight_decay);
    float* params = u.weights.data();
    const float* grads = u.grads.data();
    float* m = u.state[0].data();
    const int64_t n = static_cast<int64_t>(u.weights.size());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      float grad = grads[i];
      float update = beta1 * m[i] + (1.0f - beta1) * grad;
      float sign = update > 0.0f ? 1.0f : (update < 0.0f ? -1.0f : 0.0f);
      params[i] = params[i] * decay - lr * sign;
      m[i] = beta2 * m[i] + (1.0f - beta2) * grad;
    }
  }
};

OptimizerRegistrar lion_registrar("Lion", [](const Config&) -> std::unique_ptr<Optimizer> {
  return std::make_unique<Lion>();
});

}  // namespace
}  // namespace crucible
