// Muon (Keller Jordan 2024, "Muon: An optimizer for hidden layers in neural networks"; the scale
// of Moonlight, Liu et al. 2025, "Muon is Scalable for LLM Training"), for the 2-D hidden
// matrices (the other groups go to AdamW: optim/per_group_optimizer.h). Per matrix G (m x n):
//   M = beta1 M + (1 - beta1) G                        (momentum, optimizer.beta1)
//   U = (1 - beta1) G + beta1 M   (muon_nesterov; else U = M)
//   O = NewtonSchulz5(U)          (X = U / (|U|_F + 1e-7), transposed when m > n; ns_steps times
//                                  A = X X^T, B = b A + (c A) A, X = a X + B X with the
//                                  published (a, b, c) = (3.4445, -4.7750, 2.0315))
//   W = W (1 - lr wd) - lr s O    s = 0.2 sqrt(max(m, n)) (muon_scale = moonlight, the default:
//                                  the update RMS of AdamW, so AdamW's lr and wd transfer) or
//                                  sqrt(max(1, m / n)) (keller, the reference's)
// The momentum is the reference's lerp form; Moonlight's M = beta1 M + G differs by the factor
// 1 / (1 - beta1), which the normalisation removes (up to the 1e-7).
//
// ns_precision = bf16 emulates torch's bf16 Newton-Schulz exactly: every matrix (the rounded
// input, X, A, c A, the products, B) is rounded to bf16, each product summed in fp32. Products
// are kernels::matmul_forward (fixed tiles, the same bits for any thread count).
//
// Diagnostics (per-tensor state, overwritten by each update): ns_max_abs, the largest |entry|
// of any Newton-Schulz iterate X, and ns_orthogonality, |X X^T - I|_F / sqrt(min(m, n)) of the
// final iterate (0 for an orthogonal X, ~0.3 for the quintic's usual singular values 0.7..1.2). A
// warning names the matrix when an iterate is non-finite or above optimizer.ns_warn_max.
#include <algorithm>
#include <cmath>
#include <limits>

#include "common/bfloat16.h"
#include "common/error.h"
#include "common/log.h"
#include "common/strings.h"
#include "kernels/cpu/kernels.h"
#include "optim/optimizer.h"

namespace crucible {
namespace {

struct NewtonSchulzResult {
  float max_abs = 0.0f, orthogonality = 0.0f;
};

class NewtonSchulz {
 public:
  NewtonSchulz(int steps, bool bf16) : steps_(steps), bf16_(bf16) {}

  // Replaces x (rows x cols, row-major) by its orthogonalisation.
  NewtonSchulzResult Run(std::vector<float>& x, int64_t rows, int64_t cols) const {
    const bool tall = rows > cols;
    const int64_t m = tall ? cols : rows, n = tall ? rows : cols;
    std::vector<float> X(x.size()), Xt(x.size()), A(m * m), cA(m * m), B(m * m), BX(x.size());
    // X (m x n): the input, transposed when tall.
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        X[tall ? j * n + i : i * cols + j] = Round(x[i * cols + j]);
    double sum = 0;
    for (float v : X) sum += static_cast<double>(v) * v;
    const float norm = Round(static_cast<float>(std::sqrt(sum))) + 1e-7f;
    for (float& v : X) v = Round(v / norm);
    NewtonSchulzResult r;
    r.max_abs = MaxAbs(X);
    constexpr float a = 3.4445f, b = -4.7750f, c = 2.0315f;
    for (int k = 0; k < steps_; ++k) {
      Product(A, X, X, m, n, m);  // X X^T
      for (int64_t i = 0; i < m * m; ++i) cA[i] = Round(c * A[i]);
      Product(B, cA, A, m, m, m);  // (c A) A^T = (c A) A: A is symmetric
      for (int64_t i = 0; i < m * m; ++i) B[i] = Round(Round(b * A[i]) + B[i]);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) Xt[j * m + i] = X[i * n + j];
      Product(BX, B, Xt, m, m, n);  // B (Xt)^T = B X
      for (size_t i = 0; i < X.size(); ++i) X[i] = Round(Round(a * X[i]) + BX[i]);
      const float max_abs = MaxAbs(X);
      r.max_abs =
          std::isfinite(max_abs) && std::isfinite(r.max_abs) ? std::max(r.max_abs, max_abs) : NAN;
    }
    kernels::matmul_forward(A.data(), X.data(), X.data(), m, n, m);
    double off = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < m; ++j) {
        const double d = static_cast<double>(A[i * m + j]) - (i == j ? 1.0 : 0.0);
        off += d * d;
      }
    r.orthogonality = static_cast<float>(std::sqrt(off / static_cast<double>(m)));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) x[i * cols + j] = X[tall ? j * n + i : i * cols + j];
    return r;
  }

 private:
  float Round(float v) const { return bf16_ ? RoundToBfloat16(v) : v; }
  // out (N x OC) = inp (N x C) weight (OC x C)^T, rounded as a stored matrix.
  void Product(std::vector<float>& out, const std::vector<float>& inp,
               const std::vector<float>& weight, int64_t N, int64_t C, int64_t OC) const {
    kernels::matmul_forward(out.data(), inp.data(), weight.data(), N, C, OC);
    if (bf16_)
      for (float& v : out) v = RoundToBfloat16(v);
  }
  static float MaxAbs(const std::vector<float>& v) {
    float max_abs = 0.0f;
    for (float e : v) {
      if (!std::isfinite(e)) return NAN;
      max_abs = std::max(max_abs, std::abs(e));
    }
    return max_abs;
  }

  int steps_;
  bool bf16_;
};

class Muon final : public Optimizer {
 public:
  Muon(int ns_steps, bool bf16, bool moonlight, bool nesterov, double warn_max)
      : ns_(ns_steps, bf16), moonlight_(moonlight), nesterov_(nesterov), warn_max_(warn_max) {}

  ShardMode shard_mode() const override { return ShardMode::kWholeMatrix; }
  bool matrices_only() const override { return true; }
  std::vector<StateSpec> state() const override {
    return {{"momentum_buffer"}, {"ns_max_abs", 1}, {"ns_orthogonality", 1}};
  }
  // Each step's largest ns_max_abs and ns_orthogonality over the matrices (metrics.jsonl).
  std::vector<OptimizerMetric> metrics() const override {
    return {{"muon/ns_max_abs", OptimizerMetric::kMax, warn_max_, 1,
             "a Newton-Schulz iterate grew past optimizer.ns_warn_max (docs/optimizers.md)"},
            {"muon/ns_orthogonality", OptimizerMetric::kMax,
             std::numeric_limits<double>::infinity(), 1, ""}};
  }

  void Update(const TensorUpdate& u) const override {
    const FloatSettings s(u);
    const int64_t rows = u.param.shape.at(0), cols = u.param.shape.at(1);
    const int64_t n = static_cast<int64_t>(u.weights.size());
    float* m = u.state[0].data();
    std::vector<float> update(u.weights.size());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float grad = u.grads[i];
      m[i] = s.beta1 * m[i] + (1.0f - s.beta1) * grad;
      update[i] = nesterov_ ? (1.0f - s.beta1) * grad + s.beta1 * m[i] : m[i];
    }
    const NewtonSchulzResult r = ns_.Run(update, rows, cols);
    const double scale =
        moonlight_
            ? 0.2 * std::sqrt(static_cast<double>(std::max(rows, cols)))
            : std::sqrt(std::max(1.0, static_cast<double>(rows) / static_cast<double>(cols)));
    const float step = static_cast<float>(u.lr * scale);
    float* w = u.weights.data();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) w[i] = w[i] * s.decay - step * update[i];
    u.state[1][0] = r.max_abs;
    u.state[2][0] = r.orthogonality;
    if (!u.metrics.empty()) {  // the largest over the step's matrices (NaN stays NaN)
      u.metrics[0] = MaxOrNan(u.metrics[0], r.max_abs);
      u.metrics[2] = MaxOrNan(u.metrics[2], r.orthogonality);
    }
    if (!std::isfinite(r.max_abs) || r.max_abs > warn_max_)
      LogWarn(StrFormat(
          "muon: Newton-Schulz iterate of %s degraded at step %lld: max |entry| %g "
          "(optimizer.ns_warn_max %g), orthogonality %g",
          u.param.name.c_str(), (long long)u.step, r.max_abs, warn_max_, r.orthogonality));
  }

 private:
  NewtonSchulz ns_;
  bool moonlight_, nesterov_;
  double warn_max_;
};

OptimizerRegistrar muon_registrar("Muon", [](const Config& config) -> std::unique_ptr<Optimizer> {
  const std::string& precision = config.String("optimizer.ns_precision");
  if (precision != "fp32" && precision != "bf16")
    throw UsageError("optimizer.ns_precision: expected fp32 or bf16, got \"" + precision + "\"");
  const std::string& scale = config.String("optimizer.muon_scale");
  if (scale != "moonlight" && scale != "keller")
    throw UsageError("optimizer.muon_scale: expected moonlight or keller, got \"" + scale + "\"");
  const int64_t steps = config.Int("optimizer.ns_steps");
  if (steps < 1 || steps > 100)
    throw UsageError(
        StrFormat("optimizer.ns_steps: must be in [1, 100], got %lld", (long long)steps));
  return std::make_unique<Muon>(static_cast<int>(steps), precision == "bf16", scale == "moonlight",
                                config.Bool("optimizer.muon_nesterov"),
                                config.Float("optimizer.ns_warn_max"));
});

}  // namespace
}  // namespace crucible
