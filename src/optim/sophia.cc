// SophiaG (Liu et al. 2023, "Sophia: A Scalable Stochastic Second-order Optimizer for Language
// Model Pre-training", Algorithm 3 with the Gauss-Newton-Bartlett estimator), in float32 in the
// form of the official code (Liuhong99/Sophia, sophia.py and train_sophiag.py):
//   every step      w = w (1 - lr wd);  m = beta1 m + (1 - beta1) g
//                   ratio = min(|m| / (rho B h + 1e-15), 1);  w = w - lr sign(m) ratio
//   every k steps   h = beta2 h + (1 - beta2) g^ (.) g^   (UpdateHessian)
// g^ is the gradient of the mean loss against targets sampled from the model's own logits (the
// trainer's Hessian pass, optim/optimizer.h), B the tokens per global batch. The paper writes
// the estimate as B g^ (.) g^ and the clip as clip(m / max(gamma h, eps), 1); the official code
// keeps h without the B and multiplies it into the denominator, which is what this does (the
// same update up to float rounding; eps there is the 1e-15 added here). h starts at 0, so until
// the first estimate every coordinate with m != 0 is clipped: the update is lr sign(m).
//
// Hessian steps: step % k == 0 (steps count from 1), after the step's update: the official
// script's iter_num % k == k - 1 with iter_num counting from 0. The phase is a function of the
// step, so a resume at any step continues it; exp_avg and hessian are checkpointed per element.
#include <cmath>
#include <limits>

#include "optim/optimizer.h"

namespace crucible {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();  // no warning

class SophiaG final : public Optimizer {
 public:
  SophiaG(int64_t k, double rho, double clip_warn) : k_(k), rho_(rho), clip_warn_(clip_warn) {}

  ShardMode shard_mode() const override { return ShardMode::kElementwise; }
  std::vector<StateSpec> state() const override { return {{"exp_avg"}, {"hessian"}}; }
  int64_t hessian_interval() const override { return k_; }

  // 0: sophia/clipped_fraction (coordinates whose ratio reached 1 / coordinates), 1 and 2: the
  // range of the Hessian estimate the update divided by.
  std::vector<OptimizerMetric> metrics() const override {
    return {{"sophia/clipped_fraction", OptimizerMetric::kMean, clip_warn_, k_ + 1,
             "SophiaG clips most coordinates (the update is lr sign(m) there): the Hessian "
             "estimate may be saturating; see docs/optimizers.md, SophiaG"},
            {"sophia/hessian_min", OptimizerMetric::kMin, kNever, 1, ""},
            {"sophia/hessian_max", OptimizerMetric::kMax, kNever, 1, ""}};
  }

  void Update(const TensorUpdate& u) const override {
    const FloatSettings s(u);
    const float rho_b = static_cast<float>(rho_ * u.batch_tokens);
    float* params = u.weights.data();
    float* m = u.state[0].data();
    const float* h = u.state[1].data();
    int64_t clipped = 0;
    float h_min = INFINITY, h_max = -INFINITY;
    const int64_t n = static_cast<int64_t>(u.weights.size());
    // Integer sums, minima and maxima come out the same for any thread count.
#pragma omp parallel for schedule(static) reduction(+ : clipped) reduction(min : h_min) \
    reduction(max : h_max)
    for (int64_t i = 0; i < n; ++i) {
      const float decayed = params[i] * s.decay;
      m[i] = s.beta1 * m[i] + (1.0f - s.beta1) * u.grads[i];
      const float ratio = std::fmin(std::fabs(m[i]) / (rho_b * h[i] + 1e-15f), 1.0f);
      const float sign = m[i] > 0.0f ? 1.0f : (m[i] < 0.0f ? -1.0f : 0.0f);
      params[i] = decayed - s.lr * (sign * ratio);
      clipped += ratio >= 1.0f;
      h_min = std::fmin(h_min, h[i]);
      h_max = std::fmax(h_max, h[i]);
    }
    if (u.metrics.empty()) return;
    u.metrics[0] += static_cast<double>(clipped);
    u.metrics[1] += static_cast<double>(n);
    u.metrics[2] = std::fmin(u.metrics[2], static_cast<double>(h_min));
    u.metrics[4] = std::fmax(u.metrics[4], static_cast<double>(h_max));
  }

  void UpdateHessian(const TensorUpdate& u) const override {
    const float beta2 = static_cast<float>(u.group.beta2);
    float* h = u.state[1].data();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < static_cast<int64_t>(u.grads.size()); ++i)
      h[i] = beta2 * h[i] + (1.0f - beta2) * (u.grads[i] * u.grads[i]);
  }

 private:
  int64_t k_;
  double rho_, clip_warn_;
};

OptimizerRegistrar sophia_registrar("SophiaG", [](const Config& c) -> std::unique_ptr<Optimizer> {
  return std::make_unique<SophiaG>(c.Int("optimizer.sophia_k"), c.Float("optimizer.sophia_rho"),
                                   c.Float("optimizer.sophia_clip_warn"));
});

}  // namespace
}  // namespace crucible
