// The optimizer registry, the built-in update rules against the published ones computed in
// double, and what every registered optimizer (built in, or registered by a test file of this
// binary) must give: the same bits for any cut of the parameters and any thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <set>

#include "common/error.h"
#include "optim/matrix_owners.h"
#include "optim/optimizer.h"
#include "optim/optimizer_shard.h"
#include "optim_test_util.h"

namespace crucible {
namespace {

using optim_test::ConfigFor;
using optim_test::SmallTable;
using optim_test::Values;

std::string ErrorOf(const std::function<void()>& run, int* exit_code = nullptr) {
  try {
    run();
  } catch (const Error& e) {
    if (exit_code) *exit_code = e.exit_code();
    return e.what();
  }
  return "";
}

TEST(OptimizerRegistry, AnUnknownNameIsAUsageErrorListingEveryRegisteredOne) {
  int exit_code = 0;
  const std::string message = ErrorOf([] { ConfigFor("Adam"); }, &exit_code);
  EXPECT_EQ(exit_code, kExitUsage);
  EXPECT_NE(message.find("optimizer.name: unknown optimizer 'Adam' (choose "), std::string::npos)
      << message;
  for (const std::string& name : RegisteredOptimizers())
    EXPECT_NE(message.find(name), std::string::npos) << name << ": " << message;
}

// The help of optimizer.name (`crucible config keys`) lists the built-in optimizers: every one
// registered in src/optim/, none other. (The toy optimizers of this test binary are "Toy...".)
TEST(OptimizerRegistry, TheConfigHelpNamesExactlyTheBuiltInOptimizers) {
  std::string help;
  for (const auto& spec : Config::Schema())
    if (spec.key == "optimizer.name") help = spec.help;
  std::set<std::string> listed;
  size_t start = 0;
  while (start < help.size()) {
    size_t comma = help.find(", ", start), either = help.find(" or ", start);
    size_t end = std::min(comma, either);
    listed.insert(help.substr(start, end == std::string::npos ? std::string::npos : end - start));
    start = end == std::string::npos ? help.size() : end + (end == comma ? 2 : 4);
  }
  std::set<std::string> built_in;
  for (const std::string& name : RegisteredOptimizers())
    if (name.rfind("Toy", 0) != 0) built_in.insert(name);
  EXPECT_EQ(listed, built_in) << help;
  EXPECT_TRUE(built_in.count("AdamW") && built_in.count("SGD") && built_in.count("Lion"));
}

// The names are the checkpoint format: optimizer.safetensors holds "<state>.<parameter>".
TEST(BuiltInOptimizers, DeclareTheStateNamesCheckpointsHold) {
  auto names = [](const std::string& optimizer) {
    std::vector<std::string> out;
    for (const StateSpec& spec : ConfigFor(optimizer).optimizer->state()) {
      EXPECT_EQ(spec.per_tensor, 0u) << optimizer << " " << spec.name;
      out.push_back(spec.name);
    }
    return out;
  };
  EXPECT_EQ(names("AdamW"), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  EXPECT_EQ(names("SGD"), (std::vector<std::string>{"momentum"}));
  EXPECT_EQ(names("Lion"), (std::vector<std::string>{"exp_avg"}));
  for (const char* name : {"AdamW", "SGD", "Lion"})
    EXPECT_EQ(ConfigFor(name).optimizer->shard_mode(), ShardMode::kElementwise) << name;
}

// ---- the built-in rules against the published ones, in double ----

// Weight decay of a tensor under the default groups (norms and embeddings not decayed).
double DefaultDecay(const ParamInfo& p, double weight_decay) {
  return p.kind == ParamKind::kNorm || p.kind == ParamKind::kEmbedding ? 0.0 : weight_decay;
}

// Runs `steps` steps of `optimizer` on SmallTable() with varying learning rates and gradients,
// and the same steps of `rule` in double, which updates (w, state...) of one element:
// rule(w, grad, states, lr, decay, step). Returns the largest |float - double| of the weights.
template <typename Rule>
double LargestErrorAgainst(const std::string& optimizer, const std::vector<std::string>& overrides,
                           int states, Rule rule) {
  const ParameterTable table = SmallTable();
  const size_t n = table.total();
  OptimizerConfig config = ConfigFor(optimizer, overrides);
  OptimizerShard shard(config, table, 0, n);
  std::vector<float> weights = Values(n, 1);
  std::vector<double> w(weights.begin(), weights.end());
  std::vector<std::vector<double>> state(states, std::vector<double>(n, 0.0));
  const double weight_decay = config.groups.Of(ParamKind::kLinear).settings.weight_decay;
  for (int64_t step = 1; step <= 5; ++step) {
    const std::vector<float> grads = Values(n, 10 + step);
    const double lr = 0.01 * static_cast<double>(step);
    shard.Step(weights.data(), grads.data(), lr, step);
    for (const ParamInfo& p : table.params())
      for (size_t i = p.offset; i < p.offset + p.numel; ++i) {
        std::vector<double*> s;
        for (auto& buffer : state) s.push_back(&buffer[i]);
        rule(w[i], static_cast<double>(grads[i]), s, lr, DefaultDecay(p, weight_decay), step);
      }
  }
  double error = 0;
  for (size_t i = 0; i < n; ++i) error = std::max(error, std::abs(weights[i] - w[i]));
  return error;
}

TEST(Sgd, MomentumStepsMatchTheRuleInDouble) {
  // b = momentum b + g; w = w (1 - lr wd) - lr b (decoupled decay).
  const double error = LargestErrorAgainst(
      "SGD", {"optimizer.beta1=0.8", "optimizer.weight_decay=0.3"}, 1,
      [](double& w, double g, std::vector<double*>& s, double lr, double decay, int64_t) {
        double& b = *s[0];
        b = 0.8 * b + g;
        w = w * (1 - lr * decay) - lr * b;
      });
  EXPECT_LT(error, 1e-6);
}

TEST(Lion, StepsMatchThePublishedRuleInDouble) {
  // Chen et al. 2023, Algorithm 2.
  const double error = LargestErrorAgainst(
      "Lion", {"optimizer.beta1=0.9", "optimizer.beta2=0.99", "optimizer.weight_decay=0.5"}, 1,
      [](double& w, double g, std::vector<double*>& s, double lr, double decay, int64_t) {
        double& m = *s[0];
        const double c = 0.9 * m + 0.1 * g;
        w = w * (1 - lr * decay) - lr * (c > 0 ? 1.0 : c < 0 ? -1.0 : 0.0);
        m = 0.99 * m + 0.01 * g;
      });
  EXPECT_LT(error, 1e-6);
}

TEST(AdamW, StepsMatchThePublishedRuleInDouble) {
  // Loshchilov & Hutter 2019, Algorithm 2, with bias corrections.
  const double error = LargestErrorAgainst(
      "AdamW", {"optimizer.beta1=0.9", "optimizer.beta2=0.95", "optimizer.weight_decay=0.1"}, 2,
      [](double& w, double g, std::vector<double*>& s, double lr, double decay, int64_t step) {
        double &m = *s[0], &v = *s[1];
        m = 0.9 * m + 0.1 * g;
        v = 0.95 * v + 0.05 * g * g;
        const double m_hat = m / (1 - std::pow(0.9, step)), v_hat = v / (1 - std::pow(0.95, step));
        w = w * (1 - lr * decay) - lr * m_hat / (std::sqrt(v_hat) + 1e-8);
      });
  EXPECT_LT(error, 2e-6);
}

// ---- what every registered optimizer promises ----

struct Result {
  std::vector<float> weights;
  // Per spec: the layout over [0, n), the carrying tensors' floats in table order.
  std::vector<std::vector<float>> state;
};

// Three steps on SmallTable() by one shard holding everything.
Result RunWhole(const OptimizerConfig& config, const ParameterTable& table) {
  Result r{Values(table.total(), 1), {}};
  OptimizerShard shard(config, table, 0, table.total());
  for (int64_t step = 1; step <= 3; ++step) {
    const std::vector<float> grads = Values(table.total(), 20 + step);
    shard.Step(r.weights.data(), grads.data(), 1e-2, step);
  }
  for (const ShardState& s : shard.State()) r.state.push_back(s.values);
  return r;
}

// The same steps by shards of the flat ranges between `cuts`, each holding only its slice of the
// weights and gradients (as a ZeRO-3 rank does: base = the range's first element).
Result RunCut(const OptimizerConfig& config, const ParameterTable& table,
              const std::vector<size_t>& cuts) {
  Result r{Values(table.total(), 1), {}};
  std::vector<std::unique_ptr<OptimizerShard>> shards;
  for (size_t k = 0; k + 1 < cuts.size(); ++k)
    shards.push_back(std::make_unique<OptimizerShard>(config, table, cuts[k], cuts[k + 1]));
  for (int64_t step = 1; step <= 3; ++step) {
    const std::vector<float> grads = Values(table.total(), 20 + step);
    for (size_t k = shards.size(); k-- > 0;) {  // in reverse: the order must not matter
      std::vector<float> w(r.weights.begin() + cuts[k], r.weights.begin() + cuts[k + 1]);
      std::vector<float> g(grads.begin() + cuts[k], grads.begin() + cuts[k + 1]);
      shards[k]->Step(w.data(), g.data(), 1e-2, step, cuts[k]);
      std::copy(w.begin(), w.end(), r.weights.begin() + cuts[k]);
    }
  }
  r.state.resize(config.optimizer->state().size());
  for (auto& shard : shards) {
    std::vector<ShardState> parts = shard->State();
    for (size_t s = 0; s < parts.size(); ++s)
      r.state[s].insert(r.state[s].end(), parts[s].values.begin(), parts[s].values.end());
  }
  return r;
}

// The same steps with each tensor updated whole, by StepMatrix on the shard of its owner among
// `world` ranks.
Result RunOwners(const OptimizerConfig& config, const ParameterTable& table, int world) {
  Result r{Values(table.total(), 1), {}};
  const std::vector<int> owners = AssignMatrixOwners(table, world);
  std::vector<std::unique_ptr<OptimizerShard>> shards;
  for (int rank = 0; rank < world; ++rank)
    shards.push_back(std::make_unique<OptimizerShard>(config, table, TensorsOwnedBy(owners, rank)));
  for (int64_t step = 1; step <= 3; ++step) {
    const std::vector<float> grads = Values(table.total(), 20 + step);
    for (size_t t = 0; t < table.params().size(); ++t) {
      const ParamInfo& p = table.params()[t];
      shards[owners[t]]->StepMatrix(t, {r.weights.data() + p.offset, p.numel},
                                    {grads.data() + p.offset, p.numel}, 1e-2, step);
    }
  }
  // Back into table order: each carrying tensor's state from its owner.
  const std::vector<StateSpec> specs = config.optimizer->state();
  r.state.resize(specs.size());
  for (size_t s = 0; s < specs.size(); ++s) {
    std::vector<size_t> used(world, 0);  // floats of each owner's buffer already taken
    for (size_t t = 0; t < table.params().size(); ++t) {
      const size_t count = specs[s].FloatsOf(table.params()[t]);
      const std::vector<float>& owner = shards[owners[t]]->State()[s].values;
      r.state[s].insert(r.state[s].end(), owner.begin() + used[owners[t]],
                        owner.begin() + used[owners[t]] + count);
      used[owners[t]] += count;
    }
  }
  return r;
}

TEST(EveryRegisteredOptimizer, GivesTheSameBitsForAnyCutOfTheParametersAndAnyThreadCount) {
  const ParameterTable table = SmallTable();
  const int threads = omp_get_max_threads();
  for (const std::string& name : RegisteredOptimizers()) {
    SCOPED_TRACE(name);
    const OptimizerConfig config = ConfigFor(name);
    omp_set_num_threads(1);
    const Result whole = RunWhole(config, table);
    omp_set_num_threads(3);
    EXPECT_EQ(RunWhole(config, table).weights, whole.weights);
    const Result other = config.optimizer->shard_mode() == ShardMode::kElementwise
                             ? RunCut(config, table, {0, 17, 40, 41, 100, table.total()})
                             : RunOwners(config, table, 3);
    EXPECT_EQ(other.weights, whole.weights);
    EXPECT_EQ(other.state, whole.state);
    EXPECT_NE(whole.weights, Values(table.total(), 1));  // it did update
  }
  omp_set_num_threads(threads);
}

// ---- the shard's contracts ----

// An optimizer of these tests only, never registered: `mode`, with a state of `per_tensor`.
class Declaring final : public Optimizer {
 public:
  Declaring(ShardMode mode, size_t per_tensor) : mode_(mode), per_tensor_(per_tensor) {}
  ShardMode shard_mode() const override { return mode_; }
  std::vector<StateSpec> state() const override { return {{"s", per_tensor_}}; }
  void Update(const TensorUpdate&) const override {}

 private:
  ShardMode mode_;
  size_t per_tensor_;
};

OptimizerConfig Unregistered(ShardMode mode, size_t per_tensor) {
  OptimizerConfig config = ConfigFor("SGD");
  config.name = "Declaring";
  config.optimizer = std::make_shared<Declaring>(mode, per_tensor);
  return config;
}

TEST(OptimizerShard, AnEmptyRangeHasEveryDeclaredStateEmpty) {
  const ParameterTable table = SmallTable();
  OptimizerShard shard(ConfigFor("AdamW"), table, table.total(), table.total());
  std::vector<ShardState> state = shard.State();
  ASSERT_EQ(state.size(), 2u);  // every rank walks the same list in collective operations
  EXPECT_TRUE(state[0].values.empty() && state[1].values.empty());
}

TEST(OptimizerShard, PerTensorStateIsForWholeMatrixOptimizersOnly) {
  const ParameterTable table = SmallTable();
  int exit_code = 0;
  EXPECT_NE(ErrorOf([&] { OptimizerShard(Unregistered(ShardMode::kElementwise, 1), table, 0, 9); },
                    &exit_code)
                .find("per-tensor state 's'"),
            std::string::npos);
  EXPECT_EQ(exit_code, kExitFailure);
  OptimizerShard whole(Unregistered(ShardMode::kWholeMatrix, 2), table, 0, table.total());
  EXPECT_EQ(whole.State()[0].values.size(), 2 * table.params().size());
}

// An optimizer of these tests only: a state "m" of the hidden matrices and "e" of the rest; each
// update checks that it sees exactly its tensor's states and writes tensor index + 1 into them.
class Carrying final : public Optimizer {
 public:
  explicit Carrying(const ParameterTable& table) : table_(table) {}
  ShardMode shard_mode() const override { return ShardMode::kElementwise; }
  std::vector<StateSpec> state() const override {
    return {{"m", 0, kHiddenMatrices}, {"e", 0, kHiddenMatrices.Complement()}};
  }
  void Update(const TensorUpdate& u) const override {
    const bool matrix = IsHiddenMatrix(u.param.kind);
    EXPECT_EQ(u.state[0].size(), matrix ? u.weights.size() : 0u) << u.param.name;
    EXPECT_EQ(u.state[1].size(), matrix ? 0u : u.weights.size()) << u.param.name;
    const float index = static_cast<float>(&u.param - table_.params().data()) + 1;
    for (std::span<float> s : u.state) std::fill(s.begin(), s.end(), index);
  }

 private:
  const ParameterTable& table_;
};

TEST(OptimizerShard, AStateCarriedBySomeTensorsIsAllocatedForThoseOnlyInSlotOrder) {
  const ParameterTable table = SmallTable();  // embed [0,35) norm [35,40) linear [40,70)
  OptimizerConfig config = ConfigFor("SGD");  // output [70,100) norm [100,105) head [105,140)
  config.optimizer = std::make_shared<Carrying>(table);
  OptimizerShard shard(config, table, 17, 80);
  std::vector<float> w(63), g(63);
  shard.Step(w.data(), g.data(), 1e-3, 1, 17);
  std::vector<ShardState> state = shard.State();
  std::vector<float> m(30, 3.0f), e(18, 1.0f);
  m.insert(m.end(), 10, 4.0f);  // linear whole, then output's first 10
  e.insert(e.end(), 5, 2.0f);   // embed's last 18, then layer.norm
  EXPECT_EQ(state[0].values, m);
  EXPECT_EQ(state[1].values, e);
  // Over [0, n): the carrying tensors concatenated in table order.
  const FullStateLayout full = LayOutFullState(state[0].spec, table);
  const size_t none = FullStateLayout::kNotCarried;
  EXPECT_EQ(full.offsets, (std::vector<size_t>{none, none, 0, 30, none, none}));
  EXPECT_EQ(full.size, 60u);
  EXPECT_EQ(LayOutFullState(state[1].spec, table).size, 80u);
  OptimizerShard whole(config, table, 0, table.total());
  EXPECT_EQ(whole.State()[0].values.size(), 60u);
  EXPECT_EQ(whole.State()[1].values.size(), 80u);
}

TEST(OptimizerShard, AWholeMatrixOptimizerRefusesARangeThatCutsATensor) {
  const ParameterTable table = SmallTable();
  const OptimizerConfig config = Unregistered(ShardMode::kWholeMatrix, 0);
  EXPECT_NE(
      ErrorOf([&] { OptimizerShard(config, table, 0, 36); }).find("holds only part of layer.norm"),
      std::string::npos);
  EXPECT_EQ(ErrorOf([&] { OptimizerShard(config, table, 35, 40); }), "");  // layer.norm whole
  OptimizerShard owner(config, table, std::vector<size_t>{1, 4});
  std::vector<float> w(5), g(5);
  EXPECT_NE(ErrorOf([&] {
              owner.StepMatrix(2, {w.data(), 5}, {g.data(), 5}, 1e-3, 1);
            }).find("does not hold that tensor"),
            std::string::npos);
  EXPECT_EQ(ErrorOf([&] { owner.StepMatrix(4, {w.data(), 5}, {g.data(), 5}, 1e-3, 1); }), "");
}

}  // namespace
}  // namespace crucible
