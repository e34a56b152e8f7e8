// Mano (Gu & Xie 2026, "Mano: Restriking Manifold Optimization for LLM Training", arXiv
// 2601.23000, Algorithm 1; formulas checked against the official mano.py of
// xie-lab-ml/Mano-Restriking-Manifold-Optimization-for-LLM-Training), for the 2-D hidden
// matrices (the other groups go to AdamW: optim/per_group_optimizer.h). Per matrix W (m x n)
// with gradient G, at its k-th update (k from 0, the per-tensor state mano_steps), along
// d = k mod 2 (d = 0: each column, over the rows; d = 1: each row, over the columns):
//   M = beta1 M + G;  V = G + beta1 M (mano_nesterov) else V = M
//   T = V - sum_d(V * W) * W                  (momentum in the Oblique manifold's tangent space
//                                              at W, the official code's unnormalised W)
//   U = T / max(|T|_d, eps)                   (normalised along d; eps = optimizer.eps)
//   W = W (1 - lr wd) - lr 0.2 sqrt(size_d) U (the published rescaling: update RMS 0.2;
//                                              size_d = m for d = 0, n for d = 1)
// O(m n) work: two reductions along d and elementwise steps. The parity is state (mano_steps,
// saved in checkpoints), so a resume continues the alternation bit-exactly. Reductions are in
// double in a fixed row-major order: the same bits for any thread count.
//
// Diagnostic (per-tensor state, overwritten by each update): update_rms, the RMS of
// 0.2 sqrt(size_d) U (the update per unit learning rate; 0.2 unless T vanishes somewhere).
#include <algorithm>
#include <cmath>
#include <limits>

#include "common/log.h"
#include "common/strings.h"
#include "optim/optimizer.h"

namespace crucible {
namespace {

class Mano final : public Optimizer {
 public:
  explicit Mano(bool nesterov) : nesterov_(nesterov) {}

  ShardMode shard_mode() const override { return ShardMode::kWholeMatrix; }
  bool matrices_only() const override { return true; }
  std::vector<StateSpec> state() const override {
    return {{"momentum_buffer"}, {"mano_steps", 1}, {"update_rms", 1}};
  }
  // Each step's largest update_rms over the matrices (metrics.jsonl).
  std::vector<OptimizerMetric> metrics() const override {
    return {
        {"mano/update_rms", OptimizerMetric::kMax, std::numeric_limits<double>::infinity(), 1, ""}};
  }

  void Update(const TensorUpdate& u) const override {
    const FloatSettings s(u);
    const int64_t rows = u.param.shape.at(0), cols = u.param.shape.at(1);
    const int64_t n = static_cast<int64_t>(u.weights.size());
    const bool columns = static_cast<int64_t>(u.state[1][0]) % 2 == 0;  // d = 0
    float* m = u.state[0].data();
    float* w = u.weights.data();
    std::vector<float> v(u.weights.size());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      m[i] = s.beta1 * m[i] + u.grads[i];
      v[i] = nesterov_ ? u.grads[i] + s.beta1 * m[i] : m[i];
    }
    // Reduction index of element (i, j): its column (d = 0) or its row (d = 1).
    const int64_t lines = columns ? cols : rows;
    auto line = [&](int64_t i, int64_t j) { return columns ? j : i; };
    std::vector<double> acc(lines, 0.0);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        acc[line(i, j)] += static_cast<double>(v[i * cols + j]) * w[i * cols + j];
    std::vector<float> dot(lines);
    for (int64_t k = 0; k < lines; ++k) dot[k] = static_cast<float>(acc[k]);
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        float& t = v[i * cols + j];
        t = t - dot[line(i, j)] * w[i * cols + j];
        acc[line(i, j)] += static_cast<double>(t) * t;
      }
    std::vector<float> norm(lines);
    for (int64_t k = 0; k < lines; ++k)
      norm[k] = std::max(static_cast<float>(std::sqrt(acc[k])), s.eps);
    const double scale = 0.2 * std::sqrt(static_cast<double>(columns ? rows : cols));
    const float step = static_cast<float>(u.lr * scale);
    double square = 0;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const float unit = v[i * cols + j] / norm[line(i, j)];
        square += static_cast<double>(unit) * unit;
        w[i * cols + j] = w[i * cols + j] * s.decay - step * unit;
      }
    u.state[1][0] += 1.0f;
    const float rms = static_cast<float>(scale * std::sqrt(square / static_cast<double>(n)));
    u.state[2][0] = rms;
    if (!u.metrics.empty()) u.metrics[0] = MaxOrNan(u.metrics[0], rms);
    if (!std::isfinite(rms))
      LogWarn(StrFormat("mano: update of %s is not finite at step %lld", u.param.name.c_str(),
                        (long long)u.step));
  }

 private:
  bool nesterov_;
};

OptimizerRegistrar mano_registrar("Mano", [](const Config& config) -> std::unique_ptr<Optimizer> {
  return std::make_unique<Mano>(config.Bool("optimizer.mano_nesterov"));
});

}  // namespace
}  // namespace crucible
