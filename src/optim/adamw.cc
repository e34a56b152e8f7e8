// AdamW (Loshchilov & Hutter 2019): Adam with decoupled weight decay, as torch.optim.AdamW
// computes it in float32 (bias corrections in double, then rounded):
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   w = w (1 - lr wd) - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
#include <cmath>

#include "common/host_math.h"
#include "optim/optimizer.h"

namespace crucible {
namespace {

class AdamW final : public Optimizer {
 public:
  ShardMode shard_mode() const override { return ShardMode::kElementwise; }
  std::vector<StateSpec> state() const override { return {{"exp_avg"}, {"exp_avg_sq"}}; }

  void Update(const TensorUpdate& u) const override {
    const GroupSettings& g = u.group;
    const FloatSettings s(u);
    const float bias1 = static_cast<float>(1.0 - HostPow(g.beta1, static_cast<double>(u.step)));
    const float bias2_sqrt =
        static_cast<float>(std::sqrt(1.0 - HostPow(g.beta2, static_cast<double>(u.step))));
    const float step_size = s.lr / bias1;
    float* params = u.weights.data();
    float* m = u.state[0].data();
    float* v = u.state[1].data();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < static_cast<int64_t>(u.weights.size()); ++i) {
      const float grad = u.grads[i];
      m[i] = s.beta1 * m[i] + (1.0f - s.beta1) * grad;
      v[i] = s.beta2 * v[i] + (1.0f - s.beta2) * (grad * grad);
      const float denom = std::sqrt(v[i]) / bias2_sqrt + s.eps;
      params[i] = params[i] * s.decay - step_size * (m[i] / denom);
    }
  }
};

OptimizerRegistrar adamw_registrar("AdamW", [](const Config&) -> std::unique_ptr<Optimizer> {
  return std::make_unique<AdamW>();
});

}  // namespace
}  // namespace crucible
