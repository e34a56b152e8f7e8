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
    const FloatSettings s(u);
    float* params = u.weights.data();
    float* m = u.state[0].data();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < static_cast<int64_t>(u.weights.size()); ++i) {
      const float grad = u.grads[i];
      const float update = s.beta1 * m[i] + (1.0f - s.beta1) * grad;
      const float sign = update > 0.0f ? 1.0f : (update < 0.0f ? -1.0f : 0.0f);
      params[i] = params[i] * s.decay - s.lr * sign;
      m[i] = s.beta2 * m[i] + (1.0f - s.beta2) * grad;
    }
  }
};

OptimizerRegistrar lion_registrar("Lion", [](const Config&) -> std::unique_ptr<Optimizer> {
  return std::make_unique<Lion>();
});

}  // namespace
}  // namespace crucible
