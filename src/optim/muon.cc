// Muon (Keller Jordan 2024, "Muon: An optimizer for hidden layers in neural networks"; the scale
// of Moonlight, Liu et al. 2025, "Muon is Scalable for LLM Training"), for the 2-D hidden
// matrices (the other groups go to AdamW: optim/per_group_optimizer.h). Per matrix G (m x n):
//   M = beta1 M + (1 - beta1) G                        (momentum, optimizer.beta1)
//   U = (1 - beta1) G + beta1 M   (muon_nesterov; else U = M)
//   O = NewtonSchulz5(U)          (X = U / (|U|_F + 1e-7), transposed when m > n; ns_steps times
//                                  A = X X^T, B = b A + c (A A) (torch.optim.Muon's addmm), X =
//                                  a X + B X with the published (a, b, c) = (3.4445, -4.7750,
//                                  2.0315))
//   W = W (1 - lr wd) - lr s O    s = 0.2 sqrt(max(m, n)) (muon_scale = moonlight, the default:
//                                  the update RMS of AdamW, so AdamW's lr and wd transfer) or
//                                  sqrt(max(1, m / n)) (keller, the reference's)
// The momentum is the reference's lerp form; Moonlight's M = beta1 M + G differs by the factor
// 1 / (1 - beta1), which the normalisation removes (up to the 1e-7).
//
// ns_precision = bf16 emulates the reference's bf16 Newton-Schulz (B = (c A) A, as Python reads
// `b * A + c * A @ A`): every matrix (the rounded input, X, A, c A, the products, B) is rounded to
// bf16, each product summed in fp32. Products are the model's GEMM path, kernels::matmul_forward
// (fixed tiles, the same bits for any thread count); the symmetric ones, X X^T and (fp32) A A,
// are kernels::matmul_gram, which multiplies only the tiles on and above the diagonal and
// mirrors them (about 5/8 of the flops for a 512-row X). The products run one matrix at a time,
// each over all the OpenMP threads.
//
// Diagnostics (per-tensor state, overwritten by each update): ns_max_abs, the largest |entry|
// of any Newton-Schulz iterate X, and ns_orthogonality, |X X^T - I|_F / sqrt(min(m, n)) of the
// final iterate (0 for an orthogonal X, ~0.3 for the quintic's usual singular values 0.7..1.2). A
// warning names the matrix when an iterate is non-finite or above optimizer.ns_warn_max.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "common/bfloat16.h"
#include "common/error.h"
#include "common/log.h"
#include "common/profile.h"
#include "common/strings.h"
#include "kernels/cpu/kernels.h"
#include "kernels/kernel_costs.h"
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
    ScopedKernelTimer profile_timer("newton_schulz", KernelProfileEnabled() ? Flops(m, n) : 0);
    const int64_t size = m * n, square = m * m;
    // This thread's buffers, grown to the largest matrix and reused (nothing to zero per call).
    thread_local std::vector<float> X_, A_, cA_, B_, BX_;
    float* X = Grown(X_, size);
    float* A = Grown(A_, square);
    float* cA = bf16_ ? Grown(cA_, square) : nullptr;
    float* B = Grown(B_, square);
    float* BX = Grown(BX_, size);
    // X (m x n): the input, transposed when tall.
    if (tall)
      Transpose(X, x.data(), rows, cols);
    else
      std::copy(x.begin(), x.end(), X);
    RoundAll(X, size);
    double sum = 0;  // in element order: one thread
    for (int64_t i = 0; i < size; ++i) sum += static_cast<double>(X[i]) * X[i];
    const float norm = Round(static_cast<float>(std::sqrt(sum))) + 1e-7f;
    // |entry| bits (the sign cleared) order as the magnitudes, with infinity at 0x7f800000 and
    // NaN above it; their maximum is the same for any thread count.
    uint32_t largest = 0;
#pragma omp parallel for schedule(static) reduction(max : largest)
    for (int64_t i = 0; i < size; ++i) {
      X[i] = Round(X[i] / norm);
      largest = std::max(largest, std::bit_cast<uint32_t>(X[i]) & 0x7fffffffu);
    }
    NewtonSchulzResult r;
    constexpr float a = 3.4445f, b = -4.7750f, c = 2.0315f;
    for (int k = 0; k < steps_; ++k) {
      kernels::matmul_gram(A, X, m, n);  // X X^T
      RoundAll(A, square);
      if (bf16_) {
        // Keller Jordan's `b * A + c * A @ A`, which Python reads as (c A) @ A, each in bf16.
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < square; ++i) cA[i] = RoundToBfloat16(c * A[i]);
        kernels::matmul_forward(B, cA, A, m, m, m);  // (c A) A^T = (c A) A: A is symmetric
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < square; ++i)
          B[i] = RoundToBfloat16(RoundToBfloat16(b * A[i]) + RoundToBfloat16(B[i]));
      } else {
        // torch.optim.Muon's addmm(A, A, A, beta=b, alpha=c) = b A + c (A A): A A = A A^T is a
        // Gram matrix too, so only its upper half is multiplied.
        kernels::matmul_gram(B, A, m, m);
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < square; ++i) B[i] = b * A[i] + c * B[i];
      }
      kernels::matmul_nn(BX, B, X, m, m, n);  // B X
      // X = a X + B X, and the largest |entry| of the new iterate, in one pass.
      if (bf16_) {
#pragma omp parallel for schedule(static) reduction(max : largest)
        for (int64_t i = 0; i < size; ++i) {
          X[i] = RoundToBfloat16(RoundToBfloat16(a * X[i]) + RoundToBfloat16(BX[i]));
          largest = std::max(largest, std::bit_cast<uint32_t>(X[i]) & 0x7fffffffu);
        }
      } else {
#pragma omp parallel for schedule(static) reduction(max : largest)
        for (int64_t i = 0; i < size; ++i) {
          X[i] = a * X[i] + BX[i];
          largest = std::max(largest, std::bit_cast<uint32_t>(X[i]) & 0x7fffffffu);
        }
      }
    }
    r.max_abs = largest >= 0x7f800000u ? NAN : std::bit_cast<float>(largest);
    kernels::matmul_gram(A, X, m, n);
    double off = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < m; ++j) {
        const double d = static_cast<double>(A[i * m + j]) - (i == j ? 1.0 : 0.0);
        off += d * d;
      }
    r.orthogonality = static_cast<float>(std::sqrt(off / static_cast<double>(m)));
    if (tall)
      Transpose(x.data(), X, cols, rows);
    else
      std::copy(X, X + size, x.begin());
    return r;
  }

 private:
  float Round(float v) const {
    return bf16_ ? RoundToBfloat16(v) : v;
  }
  void RoundAll(float* v, int64_t n) const {
    if (bf16_) RoundToBfloat16(v, v, static_cast<size_t>(n));
  }
  static float* Grown(std::vector<float>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(n);
    return v.data();
  }
  // out (cols x rows) = in (rows x cols)^T, in 32 x 32 blocks.
  static void Transpose(float* out, const float* in, int64_t rows, int64_t cols) {
    constexpr int64_t kBlock = 32;
#pragma omp parallel for schedule(static)
    for (int64_t i0 = 0; i0 < rows; i0 += kBlock)
      for (int64_t j0 = 0; j0 < cols; j0 += kBlock)
        for (int64_t i = i0; i < std::min(rows, i0 + kBlock); ++i)
          for (int64_t j = j0; j < std::min(cols, j0 + kBlock); ++j)
            out[j * rows + i] = in[i * cols + j];
  }
  // The flops of Run's products for an m x n input (m <= n): per iteration X X^T, then A A
  // (fp32: a Gram product; bf16: the whole (c A) A) and B X; then the diagnostic's X X^T.
  double Flops(int64_t m, int64_t n) const {
    const double gram_mn = kernels::MatmulGramCost(m, n, kernels::kGramTile).flops;
    const double square =
        bf16_ ? 2.0 * m * m * m : kernels::MatmulGramCost(m, m, kernels::kGramTile).flops;
    return steps_ * (gram_mn + square + 2.0 * m * m * n) + gram_mn;
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
