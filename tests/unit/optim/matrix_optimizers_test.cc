// Muon and Mano (src/optim/muon.cc, mano.cc) and the optimizer per group they bring
// (optim/per_group_optimizer.h): the C++ updates against the published rules computed here in
// double, on SmallTable()'s non-square matrices of both orientations (layer.linear 6 x 5 is tall,
// layer.output 5 x 6 wide), five steps with weight decay and varying learning rates; AdamW on
// the other groups with the optimizer.adamw_* keys; bf16 Newton-Schulz; the diagnostics; and the
// one-line errors.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>

#include "common/error.h"
#include "optim/optimizer_shard.h"
#include "optim_test_util.h"

namespace crucible {
namespace {

using optim_test::ConfigFor;
using optim_test::SmallTable;
using optim_test::Values;

using Matrix = std::vector<double>;  // row-major

Matrix Product(const Matrix& a, const Matrix& b, size_t n, size_t k, size_t m) {  // (n,k)(k,m)
  Matrix out(n * m, 0.0);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < m; ++j)
      for (size_t l = 0; l < k; ++l) out[i * m + j] += a[i * k + l] * b[l * m + j];
  return out;
}

Matrix Transposed(const Matrix& a, size_t rows, size_t cols) {
  Matrix out(a.size());
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < cols; ++j) out[j * rows + i] = a[i * cols + j];
  return out;
}

// Keller Jordan's zeropower_via_newtonschulz5, in double: X = G / (|G|_F + 1e-7), transposed
// when rows > cols, then `steps` of A = X X^T, B = b A + c A A, X = a X + B X.
Matrix NewtonSchulz(Matrix g, size_t rows, size_t cols, int steps) {
  const bool tall = rows > cols;
  if (tall) g = Transposed(g, rows, cols);
  const size_t m = tall ? cols : rows, n = tall ? rows : cols;
  double norm = 0;
  for (double v : g) norm += v * v;
  for (double& v : g) v /= std::sqrt(norm) + 1e-7;
  for (int k = 0; k < steps; ++k) {
    const Matrix A = Product(g, Transposed(g, m, n), m, n, m);
    const Matrix AA = Product(A, A, m, m, m);
    Matrix B(m * m);
    for (size_t i = 0; i < B.size(); ++i) B[i] = -4.7750 * A[i] + 2.0315 * AA[i];
    const Matrix BX = Product(B, g, m, m, n);
    for (size_t i = 0; i < g.size(); ++i) g[i] = 3.4445 * g[i] + BX[i];
  }
  return tall ? Transposed(g, m, n) : g;
}

// The rule of one matrix in double: update(w, g, momentum, lr, step) for its rows x cols.
using MatrixRule = std::function<void(Matrix& w, const Matrix& g, Matrix& m, double lr,
                                      int64_t step, size_t rows, size_t cols)>;

// Five steps of `name` with `overrides` on SmallTable(), and of `rule` (matrices) and AdamW in
// double (every other tensor, with betas 0.8/0.9, weight decay 0.05 where decayed, lr scale 2).
// Returns the largest |float - double| of the matrices' and of the other tensors' weights.
std::pair<double, double> Errors(const std::string& name, std::vector<std::string> overrides,
                                 const MatrixRule& rule) {
  for (const char* o : {"optimizer.lr=0.5", "optimizer.adamw_lr=1.0", "optimizer.adamw_beta1=0.8",
                        "optimizer.adamw_beta2=0.9", "optimizer.adamw_weight_decay=0.05"})
    overrides.push_back(o);
  const ParameterTable table = SmallTable();
  const OptimizerConfig config = ConfigFor(name, overrides);
  OptimizerShard shard(config, table, 0, table.total());
  std::vector<float> weights = Values(table.total(), 1);
  Matrix w(weights.begin(), weights.end()), m(w.size(), 0.0), v(w.size(), 0.0);
  for (int64_t step = 1; step <= 5; ++step) {
    const std::vector<float> grads = Values(table.total(), 10 + step);
    const double lr = 0.01 * static_cast<double>(step);
    shard.Step(weights.data(), grads.data(), lr, step);
    for (const ParamInfo& p : table.params()) {
      if (IsHiddenMatrix(p.kind)) {
        const size_t rows = p.shape[0], cols = p.shape[1];
        Matrix pw(p.numel), pm(p.numel), pg(p.numel);
        for (size_t k = 0; k < p.numel; ++k) {
          pw[k] = w[p.offset + k];
          pm[k] = m[p.offset + k];
          pg[k] = grads[p.offset + k];
        }
        rule(pw, pg, pm, lr, step, rows, cols);
        for (size_t k = 0; k < p.numel; ++k) {
          w[p.offset + k] = pw[k];
          m[p.offset + k] = pm[k];
        }
        continue;
      }
      const double decay = p.kind == ParamKind::kHead ? 0.05 : 0.0, group_lr = 2 * lr;
      for (size_t i = p.offset; i < p.offset + p.numel; ++i) {
        m[i] = 0.8 * m[i] + 0.2 * grads[i];
        v[i] = 0.9 * v[i] + 0.1 * grads[i] * grads[i];
        const double m_hat = m[i] / (1 - std::pow(0.8, step)),
                     v_hat = v[i] / (1 - std::pow(0.9, step));
        w[i] = w[i] * (1 - group_lr * decay) - group_lr * m_hat / (std::sqrt(v_hat) + 1e-8);
      }
    }
  }
  std::pair<double, double> error{0, 0};
  for (const ParamInfo& p : table.params())
    for (size_t i = p.offset; i < p.offset + p.numel; ++i) {
      double& e = IsHiddenMatrix(p.kind) ? error.first : error.second;
      e = std::max(e, std::abs(weights[i] - w[i]));
    }
  return error;
}

MatrixRule MuonRule(double beta, bool nesterov, bool moonlight, double wd) {
  return [=](Matrix& w, const Matrix& g, Matrix& m, double lr, int64_t, size_t rows, size_t cols) {
    Matrix u(g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      m[i] = beta * m[i] + (1 - beta) * g[i];
      u[i] = nesterov ? (1 - beta) * g[i] + beta * m[i] : m[i];
    }
    const Matrix o = NewtonSchulz(u, rows, cols, 5);
    const double scale = moonlight ? 0.2 * std::sqrt(static_cast<double>(std::max(rows, cols)))
                                   : std::sqrt(std::max(1.0, double(rows) / double(cols)));
    for (size_t i = 0; i < w.size(); ++i) w[i] = w[i] * (1 - lr * wd) - lr * scale * o[i];
  };
}

TEST(Muon, StepsMatchTheReferenceNewtonSchulzInDoubleWithEitherScale) {
  for (bool moonlight : {true, false})
    for (bool nesterov : {true, false}) {
      SCOPED_TRACE(std::string(moonlight ? "moonlight" : "keller") + (nesterov ? " nesterov" : ""));
      const auto [matrices, others] =
          Errors("Muon",
                 {"optimizer.beta1=0.95", "optimizer.weight_decay=0.2",
                  std::string("optimizer.muon_scale=") + (moonlight ? "moonlight" : "keller"),
                  std::string("optimizer.muon_nesterov=") + (nesterov ? "true" : "false")},
                 MuonRule(0.95, nesterov, moonlight, 0.2));
      EXPECT_LT(matrices, 2e-5);
      EXPECT_LT(others, 2e-5);  // AdamW on embeddings, head and norms, by the adamw_* keys
    }
}

// Mano references in double, written from the paper and the official code, not from
// src/optim/mano.cc. Gu & Xie 2026, arXiv 2601.23000, Algorithm 1, for an m x n matrix at its
// t-th update (t from 0):
//   line 4  M = mu M + g                         (the official mano.py's nesterov option:
//                                                 V = g + mu M, else V = M)
//   line 5  k = t mod 2                           k = 0: each column (torch dim 0, over the rows)
//   line 6  W^ = W / |W|_{2,k}                    |.|_{2,k}: the norm of each column (k = 0) or
//   line 7  v = V - W^ * <V, W^>_k                 row (k = 1); <.,.>_k the same lines' dots
//   line 8  v^ = v / |v|_{2,k}
//   line 9  W = W - lr (0.2 sqrt(n_k) v^ + wd W)  n_0 = m, n_1 = n
// The official mano.py (xie-lab-ml/Mano-Restriking-Manifold-Optimization-for-LLM-Training at
// b78b952, the form of 966f04d and b6d74d7) divides by max(norm, eps) at lines 6 and 8 and
// decays W before adding the step: the same as line 9. Its mano_v2.py (8f4e0f1) skips line 6
// (v = V - W * <V, W>_k, the unnormalised W), divides by norm + eps at line 8 and defaults to
// nesterov = True.
struct ManoReference {
  bool unit_weights;  // line 6 (Mano) or not (Mano_v2)
  bool eps_added;     // v / (|v| + eps) (Mano_v2) or v / max(|v|, eps) (Mano)
  bool nesterov;
  double mu, wd, eps = 1e-8;
};

// The norm of each column (k = 0) or row (k = 1) of x, rows x cols.
Matrix LineNorms(const Matrix& x, size_t rows, size_t cols, int k) {
  Matrix out(k == 0 ? cols : rows, 0.0);
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < cols; ++j) out[k == 0 ? j : i] += x[i * cols + j] * x[i * cols + j];
  for (double& v : out) v = std::sqrt(v);
  return out;
}

MatrixRule ManoRule(const ManoReference& r, int64_t& updates) {
  return [&r, &updates](Matrix& w, const Matrix& g, Matrix& m, double lr, int64_t, size_t rows,
                        size_t cols) {
    // Each matrix is updated once per step, two matrices: this one's t is updates / 2.
    const int k = static_cast<int>((updates++ / 2) % 2);
    Matrix V(g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      m[i] = r.mu * m[i] + g[i];                      // line 4
      V[i] = r.nesterov ? g[i] + r.mu * m[i] : m[i];  // mano.py's nesterov option
    }
    auto at = [&](size_t i, size_t j) { return k == 0 ? j : i; };  // the line of (i, j)
    Matrix unit = w;
    if (r.unit_weights) {  // line 6
      const Matrix norms = LineNorms(w, rows, cols, k);
      for (size_t i = 0; i < rows; ++i)
        for (size_t j = 0; j < cols; ++j)
          unit[i * cols + j] = w[i * cols + j] / std::max(norms[at(i, j)], r.eps);
    }
    Matrix dots(k == 0 ? cols : rows, 0.0);  // <V, W^>_k
    for (size_t i = 0; i < rows; ++i)
      for (size_t j = 0; j < cols; ++j) dots[at(i, j)] += V[i * cols + j] * unit[i * cols + j];
    Matrix v(g.size());
    for (size_t i = 0; i < rows; ++i)
      for (size_t j = 0; j < cols; ++j)
        v[i * cols + j] = V[i * cols + j] - unit[i * cols + j] * dots[at(i, j)];  // line 7
    const Matrix norms = LineNorms(v, rows, cols, k);
    const double n_k = k == 0 ? static_cast<double>(rows) : static_cast<double>(cols);
    for (size_t i = 0; i < rows; ++i)
      for (size_t j = 0; j < cols; ++j) {
        const double norm = norms[at(i, j)];
        const double v_hat = v[i * cols + j] / (r.eps_added ? norm + r.eps : std::max(norm, r.eps));
        w[i * cols + j] -= lr * (0.2 * std::sqrt(n_k) * v_hat + r.wd * w[i * cols + j]);  // line 9
      }
  };
}

// SmallTable's weights are in [-1, 1): their columns and rows have norms of 1.3 to 1.4, not 1, so
// line 6 matters (the unnormalised projection is off by a large part of a step).
TEST(Mano, StepsMatchThePapersAlgorithm1WithTheWeightsNormalisedAlongEachLine) {
  for (bool nesterov : {false, true}) {
    SCOPED_TRACE(nesterov ? "nesterov" : "plain");
    int64_t updates = 0;
    const ManoReference reference{true, false, nesterov, 0.95, 0.2};
    const auto [matrices, others] =
        Errors("Mano",
               {"optimizer.beta1=0.95", "optimizer.weight_decay=0.2",
                std::string("optimizer.mano_nesterov=") + (nesterov ? "true" : "false")},
               ManoRule(reference, updates));
    EXPECT_LT(matrices, 2e-5);
    EXPECT_LT(others, 2e-5);
  }
}

TEST(Mano, DefaultsToPlainMomentumAsThePaperAndTheOfficialManoPy) {
  int64_t updates = 0;
  const ManoReference reference{true, false, false, 0.95, 0.2};
  EXPECT_LT(Errors("Mano", {"optimizer.beta1=0.95", "optimizer.weight_decay=0.2"},
                   ManoRule(reference, updates))
                .first,
            2e-5);
}

TEST(ManoV2, StepsMatchTheOfficialManoV2WithTheUnnormalisedWeightsAndNesterovByDefault) {
  for (const char* nesterov : {"", "false", "true"}) {  // "": the default, true
    SCOPED_TRACE(nesterov);
    int64_t updates = 0;
    const ManoReference reference{false, true, std::string(nesterov) != "false", 0.95, 0.2};
    std::vector<std::string> overrides{"optimizer.beta1=0.95", "optimizer.weight_decay=0.2"};
    if (*nesterov) overrides.push_back(std::string("optimizer.mano_v2_nesterov=") + nesterov);
    const auto [matrices, others] = Errors("Mano_v2", overrides, ManoRule(reference, updates));
    EXPECT_LT(matrices, 2e-5);
    EXPECT_LT(others, 2e-5);
  }
}

// The two forms differ on these weights by far more than the tolerance: the tests above tell
// them apart.
TEST(Mano, AndManoV2DifferByMoreThanTheTestsTolerance) {
  const ParameterTable table = SmallTable();
  auto run = [&](const std::string& name, const std::string& nesterov_key) {
    const OptimizerConfig config = ConfigFor(name, {nesterov_key + "=false"});
    OptimizerShard shard(config, table, 0, table.total());
    std::vector<float> weights = Values(table.total(), 1);
    for (int64_t step = 1; step <= 2; ++step)
      shard.Step(weights.data(), Values(table.total(), 10 + step).data(), 0.02, step);
    return weights;
  };
  const std::vector<float> mano = run("Mano", "optimizer.mano_nesterov"),
                           v2 = run("Mano_v2", "optimizer.mano_v2_nesterov");
  double largest = 0;
  for (size_t i = 0; i < mano.size(); ++i)
    largest = std::max(largest, std::abs(double(mano[i]) - v2[i]));
  EXPECT_GT(largest, 1e-3);
}

// What the combination declares: the matrices optimizer's state names, carried by the hidden
// matrices only, then AdamW's, carried by the other tensors only; the names are
// optimizer.safetensors' "<state>.<parameter>".
TEST(PerGroupOptimizer, DeclaresEachOptimizersStateNamesAndUpdatesWholeMatrices) {
  auto names = [](const std::string& optimizer) {
    std::vector<std::string> out;
    for (const StateSpec& spec : ConfigFor(optimizer).optimizer->state())
      out.push_back(spec.name + (spec.per_tensor ? "/1" : ""));
    return out;
  };
  EXPECT_EQ(names("Muon"),
            (std::vector<std::string>{"momentum_buffer", "ns_max_abs/1", "ns_orthogonality/1",
                                      "exp_avg", "exp_avg_sq"}));
  for (const char* mano : {"Mano", "Mano_v2"})
    EXPECT_EQ(names(mano), (std::vector<std::string>{"momentum_buffer", "mano_steps/1",
                                                     "update_rms/1", "exp_avg", "exp_avg_sq"}));
  for (const char* name : {"Muon", "Mano", "Mano_v2"}) {
    const OptimizerConfig config = ConfigFor(name);
    for (const StateSpec& spec : config.optimizer->state()) {
      const bool adamw = spec.name == "exp_avg" || spec.name == "exp_avg_sq";
      // No optimizer state on a balance bias (optim/balance_bias.h).
      const ParamKinds trained = ParamKinds{ParamKind::kBalanceBias}.Complement();
      EXPECT_EQ(spec.carried_by, (adamw ? kHiddenMatrices.Complement() : kHiddenMatrices) & trained)
          << name << " " << spec.name;
    }
    EXPECT_EQ(config.optimizer->shard_mode(), ShardMode::kWholeMatrix) << name;
    EXPECT_EQ(config.others, "AdamW") << name;
  }
  EXPECT_EQ(ConfigFor("AdamW").others, "");
}

struct StepsRun {
  std::vector<float> weights;
  std::vector<std::vector<float>> state;
};

StepsRun ThreeSteps(const std::string& name, const std::vector<std::string>& overrides,
                    float grad_scale) {
  const ParameterTable table = SmallTable();
  const OptimizerConfig config = ConfigFor(name, overrides);
  OptimizerShard shard(config, table, 0, table.total());
  StepsRun r{Values(table.total(), 1), {}};
  for (int64_t step = 1; step <= 3; ++step) {
    const std::vector<float> grads = Values(table.total(), 20 + step, grad_scale);
    shard.Step(r.weights.data(), grads.data(), 0.02, step);
  }
  for (const ShardState& s : shard.State()) r.state.push_back(s.values);
  return r;
}

TEST(Muon, Bf16NewtonSchulzDiffersFromFp32AndIsDeterministicForAnyThreadCount) {
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const StepsRun bf16 = ThreeSteps("Muon", {"optimizer.ns_precision=bf16"}, 1.0f);
  omp_set_num_threads(3);
  const StepsRun again = ThreeSteps("Muon", {"optimizer.ns_precision=bf16"}, 1.0f);
  omp_set_num_threads(threads);
  const StepsRun fp32 = ThreeSteps("Muon", {"optimizer.ns_precision=fp32"}, 1.0f);
  EXPECT_EQ(bf16.weights, again.weights);
  EXPECT_EQ(bf16.state, again.state);
  EXPECT_NE(bf16.weights, fp32.weights);
  double largest = 0;  // bf16 keeps 8 bits: the update moves by about 2^-8 of itself
  for (size_t i = 0; i < fp32.weights.size(); ++i)
    largest = std::max(largest, std::abs(double(bf16.weights[i]) - fp32.weights[i]));
  EXPECT_GT(largest, 1e-6);
  EXPECT_LT(largest, 5e-3);
}

TEST(Muon, LogsTheLargestIterateAndTheDistanceFromOrthogonality) {
  const ParameterTable table = SmallTable();
  const StepsRun run = ThreeSteps("Muon", {}, 1.0f);
  // Per-tensor state, carried by the hidden matrices only: layer.linear and layer.output.
  ASSERT_EQ(run.state[1].size(), 2u);  // the embedding, norms and head are AdamW's: none
  for (size_t t : {0u, 1u}) {
    EXPECT_GT(run.state[1][t], 0.1f) << t;
    EXPECT_LT(run.state[1][t], 1.5f) << t;  // the quintic keeps singular values near 0.7..1.2
    EXPECT_LT(run.state[2][t], 0.6f) << t;  // |X X^T - I|_F / sqrt(5)
    EXPECT_GT(run.state[2][t], 0.0f) << t;  // five steps do not converge exactly
  }
}

TEST(Mano, CountsItsUpdatesForTheParityAndLogsTheUpdateRms) {
  const StepsRun run = ThreeSteps("Mano", {}, 1.0f);
  ASSERT_EQ(run.state[1].size(), 2u);
  for (size_t t : {0u, 1u}) {
    EXPECT_EQ(run.state[1][t], 3.0f) << t;
    EXPECT_NEAR(run.state[2][t], 0.2f, 1e-4) << t;  // the published rescaling: update RMS 0.2
  }
}

std::string UsageErrorOf(const std::function<void()>& run) {
  try {
    run();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage) << e.what();
    return e.what();
  }
  return "";
}

TEST(MatricesOnlyOptimizers, RefuseAModelWithoutHiddenMatricesAndBadSettingsInOneLine) {
  ParameterTable no_matrices;
  no_matrices.Add("embed", {7, 5}, ParamKind::kEmbedding, -1);
  no_matrices.Add("norm", {5}, ParamKind::kNorm, -1);
  no_matrices.EndUnit();
  for (const char* name : {"Muon", "Mano", "Mano_v2"}) {
    const std::string message =
        UsageErrorOf([&] { CheckOptimizerFitsTable(ConfigFor(name), no_matrices, "toy"); });
    EXPECT_EQ(message.rfind("optimizer.name: ", 0), 0u) << message;
    EXPECT_NE(message.find("model toy has none"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_EQ(UsageErrorOf([&] { CheckOptimizerFitsTable(ConfigFor(name), SmallTable(), "t"); }),
              "");
  }
  EXPECT_EQ(UsageErrorOf([&] { CheckOptimizerFitsTable(ConfigFor("AdamW"), no_matrices, "toy"); }),
            "");
  EXPECT_NE(UsageErrorOf([] {
              ConfigFor("Muon", {"optimizer.ns_precision=fp16"});
            }).find("optimizer.ns_precision: expected fp32 or bf16"),
            std::string::npos);
  EXPECT_NE(UsageErrorOf([] {
              ConfigFor("Muon", {"optimizer.muon_scale=adam"});
            }).find("optimizer.muon_scale: expected moonlight or keller"),
            std::string::npos);
  EXPECT_NE(
      UsageErrorOf([] { ConfigFor("Muon", {"optimizer.ns_steps=0"}); }).find("optimizer.ns_steps"),
      std::string::npos);
}

}  // namespace
}  // namespace crucible
