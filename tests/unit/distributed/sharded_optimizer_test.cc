// ShardedOptimizer (distributed/sharded_optimizer.h) on one rank: the factory's choice, and
// MatrixOwnerOptimizer's state layouts (its tensors concatenated, the full state as one rank over
// [0, n) holds it) against FlatRangeOptimizer. Across ranks: tests/integration/
// test_whole_matrix_zero.py.
#include "distributed/sharded_optimizer.h"

#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <vector>

#include "../optim/optim_test_util.h"
#include "common/error.h"

namespace crucible {
namespace {

using optim_test::ConfigFor;
using optim_test::SmallTable;
using optim_test::Values;

// A whole-matrix rule of this test only, with a per-element and a per-tensor state:
// s += g; c += sum(g) (in element order); w -= lr (s + c).
class SumOfGradients final : public Optimizer {
 public:
  ShardMode shard_mode() const override { return ShardMode::kWholeMatrix; }
  std::vector<StateSpec> state() const override { return {{"sum"}, {"total", 1}}; }
  void Update(const TensorUpdate& u) const override {
    float total = u.state[1][0];
    for (float g : u.grads) total += g;
    u.state[1][0] = total;
    for (size_t i = 0; i < u.weights.size(); ++i) {
      u.state[0][i] += u.grads[i];
      u.weights[i] -= static_cast<float>(u.lr) * (u.state[0][i] + total);
    }
  }
};

OptimizerConfig WholeMatrixConfig() {
  OptimizerConfig config = ConfigFor("SGD");
  config.name = "SumOfGradients";
  config.optimizer = std::make_shared<SumOfGradients>();
  return config;
}

TEST(MakeShardedOptimizer, OneRankUpdatesAFlatRangeWhateverTheOptimizerAndStage) {
  const ParameterTable table = SmallTable();
  const std::unique_ptr<Communicator> comm = Communicator::OneRank();
  for (int stage : {0, 1, 3}) {
    DataParallel data_parallel(*comm, table.total(), stage);
    const OptimizerConfig whole = WholeMatrixConfig();
    const auto optimizer = MakeShardedOptimizer(whole, table, data_parallel);
    EXPECT_NE(dynamic_cast<FlatRangeOptimizer*>(optimizer.get()), nullptr) << stage;
    // Its full state is its own shard (over [0, n)), which nothing needs to gather or free.
    EXPECT_EQ(&optimizer->full_state().State()[0].values, &optimizer->LocalState()[0].values);
    optimizer->ReleaseFullState();
    EXPECT_EQ(optimizer->LocalState()[0].values.size(), table.total());
    EXPECT_EQ(optimizer->BufferBytes(), 0u);
  }
}

TEST(MatrixOwnerOptimizer, IsForWholeMatrixOptimizersUnderZero1Or3) {
  const ParameterTable table = SmallTable();
  const std::unique_ptr<Communicator> comm = Communicator::OneRank();
  DataParallel stage0(*comm, table.total(), 0), stage1(*comm, table.total(), 1);
  const OptimizerConfig whole = WholeMatrixConfig(), elementwise = ConfigFor("AdamW");
  EXPECT_THROW(MatrixOwnerOptimizer(whole, table, stage0), Error);
  EXPECT_THROW(MatrixOwnerOptimizer(elementwise, table, stage1), Error);
}

// On one rank the owner holds every tensor: its steps must give FlatRangeOptimizer's bits, its
// gathered state FlatRangeOptimizer's state, and a scattered state must come back whole.
TEST(MatrixOwnerOptimizer, OnOneRankMatchesAFlatRangeInWeightsAndInEveryStateLayout) {
  const ParameterTable table = SmallTable();
  const std::unique_ptr<Communicator> comm = Communicator::OneRank();
  const OptimizerConfig config = WholeMatrixConfig();
  for (int stage : {1, 3}) {
    DataParallel data_parallel(*comm, table.total(), stage);
    FlatRangeOptimizer flat(config, table, data_parallel);
    MatrixOwnerOptimizer owner(config, table, data_parallel);
    EXPECT_EQ(owner.BufferBytes(), 3 * 4 * table.total());
    std::vector<float> flat_weights = Values(table.total(), 1), owner_weights = flat_weights;
    for (int64_t step = 1; step <= 3; ++step) {
      const std::vector<float> grads = Values(table.total(), 10 + step);
      flat.Step(flat_weights.data(), grads.data(), 1e-2, step, 0);
      owner.Step(owner_weights.data(), grads.data(), 1e-2, step, 0);
    }
    EXPECT_EQ(owner_weights, flat_weights) << stage;
    EXPECT_NE(owner_weights, Values(table.total(), 1));

    owner.GatherFullState();
    std::vector<ShardState> gathered = owner.full_state().State(), expected = flat.LocalState();
    ASSERT_EQ(gathered.size(), 2u);
    for (size_t s = 0; s < gathered.size(); ++s)
      EXPECT_EQ(gathered[s].values, expected[s].values) << gathered[s].spec.name;
    EXPECT_EQ(gathered[1].values.size(), table.params().size());

    // A loaded state (here: 0, 1, 2, ...) becomes the owner's, then gathers back unchanged.
    owner.ReleaseFullState();
    EXPECT_TRUE(owner.full_state().State()[0].values.empty());
    std::vector<std::vector<float>> loaded;
    for (ShardState& state : owner.full_state().State()) {
      state.values.resize(state.spec.per_tensor > 0 ? table.params().size() : table.total());
      std::iota(state.values.begin(), state.values.end(), 0.0f);
      loaded.push_back(state.values);
    }
    owner.ScatterFullState();
    owner.ReleaseFullState();
    owner.GatherFullState();
    for (size_t s = 0; s < loaded.size(); ++s)
      EXPECT_EQ(owner.full_state().State()[s].values, loaded[s]) << s;
  }
}

}  // namespace
}  // namespace crucible
