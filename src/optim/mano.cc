// Mano (Gu & Xie 2026, "Mano: Restriking Manifold Optimization for LLM Training", arXiv
// 2601.23000), for the 2-D hidden matrices (the other groups go to AdamW:
// optim/per_group_optimizer.h), in two forms, each with its own name:
//
//   Mano     the paper's Algorithm 1, as the official mano.py
//            (xie-lab-ml/Mano-Restriking-Manifold-Optimization-for-LLM-Training at b78b952, the
//            form of its first release 966f04d and again since b6d74d7): the weights normalised
//            along the line before the projection, max(norm, eps) in both divisions, Nesterov off
//            by default (optimizer.mano_nesterov).
//   Mano_v2  the official mano_v2.py (8f4e0f1; in mano.py between 784c480 and b6d74d7): the
//            projection with the unnormalised W, norm + eps, Nesterov on by default
//            (optimizer.mano_v2_nesterov). Its T is a tangent vector only where W's lines have
//            unit norm.
//
// Per matrix W (m x n) with gradient G, at its k-th update (k from 0, the per-tensor state
// mano_steps), along d = k mod 2 (d = 0: each column, over the rows; d = 1: each row, over the
// columns); |.|_d and sum_d are the norms and sums of those lines:
//   M = beta1 M + G;  V = G + beta1 M (Nesterov) else V = M          (Algorithm 1, line 4)
//   Mano:     P = W / max(|W|_d, eps)                                 (line 6)
//   Mano_v2:  P = W
//   T = V - sum_d(V * P) * P                                          (line 7; with Mano's P the
//                                                                      Oblique tangent space at P)
//   U = T / max(|T|_d, eps) (Mano),  T / (|T|_d + eps) (Mano_v2)      (line 8; eps = optimizer.eps)
//   W = W (1 - lr wd) - lr 0.2 sqrt(size_d) U                         (line 9: update RMS 0.2;
//                                                                      size_0 = m, size_1 = n)
// O(m n) work: reductions along d and elementwise steps. The parity is state (mano_steps, saved
// in checkpoints), so a resume continues the alternation bit-exactly. Reductions are in double
// in a fixed row-major order: the same bits for any thread count.
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

struct ManoForm {
  bool unit_weights;  // Algorithm 1's line 6 (Mano) or W itself (Mano_v2)
  bool eps_added;     // T / (|T| + eps) (Mano_v2) or T / max(|T|, eps) (Mano)
};

class Mano final : public Optimizer {
 public:
  Mano(ManoForm form, bool nesterov) : form_(form), nesterov_(nesterov) {}

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
    // The norm of each line of x, in double in row-major order, as a float.
    auto line_norms = [&](const float* x) {
      std::vector<double> acc(lines, 0.0);
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j)
          acc[line(i, j)] += static_cast<double>(x[i * cols + j]) * x[i * cols + j];
      std::vector<float> norm(lines);
      for (int64_t k = 0; k < lines; ++k) norm[k] = static_cast<float>(std::sqrt(acc[k]));
      return norm;
    };
    std::vector<float> unit;  // P: W's lines normalised (Mano), W itself (Mano_v2)
    const float* p = w;
    if (form_.unit_weights) {
      const std::vector<float> norm = line_norms(w);
      unit.resize(u.weights.size());
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j)
          unit[i * cols + j] = w[i * cols + j] / std::max(norm[line(i, j)], s.eps);
      p = unit.data();
    }
    std::vector<double> acc(lines, 0.0);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        acc[line(i, j)] += static_cast<double>(v[i * cols + j]) * p[i * cols + j];
    std::vector<float> dot(lines);
    for (int64_t k = 0; k < lines; ++k) dot[k] = static_cast<float>(acc[k]);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        v[i * cols + j] = v[i * cols + j] - dot[line(i, j)] * p[i * cols + j];
    std::vector<float> norm = line_norms(v.data());
    for (float& e : norm) e = form_.eps_added ? e + s.eps : std::max(e, s.eps);
    const double scale = 0.2 * std::sqrt(static_cast<double>(columns ? rows : cols));
    const float step = static_cast<float>(u.lr * scale);
    double square = 0;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const float unit_step = v[i * cols + j] / norm[line(i, j)];
        square += static_cast<double>(unit_step) * unit_step;
        w[i * cols + j] = w[i * cols + j] * s.decay - step * unit_step;
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
  ManoForm form_;
  bool nesterov_;
};

OptimizerRegistrar mano_registrar("Mano", [](const Config& config) -> std::unique_ptr<Optimizer> {
  return std::make_unique<Mano>(ManoForm{true, false}, config.Bool("optimizer.mano_nesterov"));
});

OptimizerRegistrar mano_v2_registrar("Mano_v2",
                                     [](const Config& config) -> std::unique_ptr<Optimizer> {
                                       return std::make_unique<Mano>(
                                           ManoForm{false, true},
                                           config.Bool("optimizer.mano_v2_nesterov"));
                                     });

}  // namespace
}  // namespace crucible
