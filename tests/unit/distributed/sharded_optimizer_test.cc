// ShardedOptimizer (distributed/sharded_optimizer.h) on one rank: the factory's choice, and
// MatrixOwnerOptimizer's state layouts (its tensors concatenated, the full state as one rank over
// [0, n) holds it) against FlatRangeOptimizer; a mixed optimizer (Muon with AdamW) split over
// 1, 2 and 4 simulated ranks as MatrixOwnerOptimizer splits it. Across real ranks:
// tests/integration/test_whole_matrix_zero.py.
#include "distributed/sharded_optimizer.h"

#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <vector>

#include "../optim/optim_test_util.h"
#include "common/error.h"
#include "optim/matrix_owners.h"

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

// On one rank the owner holds every whole-matrix tensor: its steps must give FlatRangeOptimizer's
// bits, its gathered state FlatRangeOptimizer's state, and a scattered state must come back
// whole. For Muon (with AdamW) only the matrices travel; AdamW's tensors are updated in the range.
TEST(MatrixOwnerOptimizer, OnOneRankMatchesAFlatRangeInWeightsAndInEveryStateLayout) {
  const ParameterTable table = SmallTable();  // matrices: layer.linear, layer.output (60)
  const std::unique_ptr<Communicator> comm = Communicator::OneRank();
  for (const auto& [config, travelling] :
       {std::pair{WholeMatrixConfig(), table.total()}, std::pair{ConfigFor("Muon"), size_t{60}}})
    for (int stage : {1, 3}) {
      SCOPED_TRACE(config.name + " stage " + std::to_string(stage));
      DataParallel data_parallel(*comm, table.total(), stage);
      FlatRangeOptimizer flat(config, table, data_parallel);
      MatrixOwnerOptimizer owner(config, table, data_parallel);
      EXPECT_EQ(owner.BufferBytes(), 3 * 4 * travelling);
      std::vector<float> flat_weights = Values(table.total(), 1), owner_weights = flat_weights;
      for (int64_t step = 1; step <= 3; ++step) {
        const std::vector<float> grads = Values(table.total(), 10 + step);
        flat.Step(flat_weights.data(), grads.data(), 1e-2, step, 0);
        owner.Step(owner_weights.data(), grads.data(), 1e-2, step, 0);
      }
      EXPECT_EQ(owner_weights, flat_weights);
      EXPECT_NE(owner_weights, Values(table.total(), 1));

      owner.GatherFullState();
      std::vector<ShardState> gathered = owner.full_state().State(), expected = flat.LocalState();
      ASSERT_EQ(gathered.size(), expected.size());
      for (size_t s = 0; s < gathered.size(); ++s) {
        EXPECT_EQ(gathered[s].values, expected[s].values) << gathered[s].spec.name;
        EXPECT_EQ(gathered[s].values.size(), LayOutFullState(gathered[s].spec, table).size);
      }

      // A loaded state (here: 0, 1, 2, ...) becomes the owner's, then gathers back unchanged.
      owner.ReleaseFullState();
      EXPECT_TRUE(owner.full_state().State()[0].values.empty());
      std::vector<std::vector<float>> loaded;
      for (ShardState& state : owner.full_state().State()) {
        state.values.resize(LayOutFullState(state.spec, table).size);
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

// What MatrixOwnerOptimizer does on `world` ranks, without MPI: rank r's shard holds the matrices
// AssignMatrixOwners gives it and the parts of AdamW's tensors in its ZeRO range (chunks of 4).
// Returns the weights after three steps, each rank's state, and the state as a checkpoint
// gathers it (owners' tensors in table order; ranges in rank order).
struct SplitRun {
  std::vector<float> weights;
  std::vector<std::vector<std::vector<float>>> rank_state;  // [rank][spec]
  std::vector<std::vector<float>> gathered;                 // [spec]
};

SplitRun RunSplit(const OptimizerConfig& config, const ParameterTable& table, int world) {
  const std::vector<int> owners = AssignMatrixOwners(table, world, WholeTensors(config, table));
  std::vector<std::unique_ptr<OptimizerShard>> shards;
  for (int r = 0; r < world; ++r) {
    const Range range = ShardLayout(table.total(), world, r, 4).Owned();
    shards.push_back(std::make_unique<OptimizerShard>(config, table, range.begin, range.end,
                                                      TensorsOwnedBy(owners, r)));
  }
  SplitRun run{Values(table.total(), 1), {}, {}};
  for (int64_t step = 1; step <= 3; ++step) {
    const std::vector<float> grads = Values(table.total(), 10 + step);
    for (int r = world; r-- > 0;) {  // any order: each rank writes only its own elements
      shards[r]->Step(run.weights.data(), grads.data(), 1e-2, step);
      for (size_t t : TensorsOwnedBy(owners, r)) {
        const ParamInfo& p = table.params()[t];
        shards[r]->StepMatrix(t, {run.weights.data() + p.offset, p.numel},
                              {grads.data() + p.offset, p.numel}, 1e-2, step);
      }
    }
  }
  const std::vector<StateSpec> specs = config.optimizer->state();
  run.rank_state.resize(world);
  run.gathered.resize(specs.size());
  for (size_t s = 0; s < specs.size(); ++s) {
    for (int r = 0; r < world; ++r) run.rank_state[r].push_back(shards[r]->State()[s].values);
    if (StateShardMode(config, table, specs[s]) == ShardMode::kElementwise) {
      for (int r = 0; r < world; ++r)
        run.gathered[s].insert(run.gathered[s].end(), run.rank_state[r][s].begin(),
                               run.rank_state[r][s].end());
      continue;
    }
    std::vector<size_t> used(world, 0);
    for (size_t t = 0; t < table.params().size(); ++t) {
      const size_t count = specs[s].FloatsOf(table.params()[t]);
      if (count == 0) continue;
      const std::vector<float>& mine = run.rank_state[owners[t]][s];
      run.gathered[s].insert(run.gathered[s].end(), mine.begin() + used[owners[t]],
                             mine.begin() + used[owners[t]] + count);
      used[owners[t]] += count;
    }
  }
  return run;
}

TEST(MixedSharding, AdamWsTensorsAreSplitByRangeTheMatricesByOwnerWithTheBitsOfOneRank) {
  const ParameterTable table = SmallTable();         // embed [0,35) norm [35,40) linear [40,70)
  const OptimizerConfig config = ConfigFor("Muon");  // output [70,100) norm [100,105) head
  const SplitRun one = RunSplit(config, table, 1);
  for (int world : {2, 4}) {
    const SplitRun split = RunSplit(config, table, world);
    EXPECT_EQ(split.weights, one.weights) << world;
    EXPECT_EQ(split.gathered, one.gathered) << world;
  }
  EXPECT_NE(one.weights, Values(table.total(), 1));
  // On 4 ranks (shards of 36: [0,36) [36,72) [72,108) [108,140)) the head [105,140) is cut:
  // rank 2 keeps exp_avg of its first 3 elements (after final.norm's 5), rank 3 of the other 32;
  // the embedding's 35 lie on rank 0 with 1 of layer.norm, which rank 1 continues (4 of it).
  const SplitRun four = RunSplit(config, table, 4);
  const size_t exp_avg = 3;
  ASSERT_EQ(config.optimizer->state()[exp_avg].name, "exp_avg");
  EXPECT_EQ(four.rank_state[0][exp_avg].size(), 36u);
  EXPECT_EQ(four.rank_state[1][exp_avg].size(), 4u);
  EXPECT_EQ(four.rank_state[2][exp_avg].size(), 5u + 3u);
  EXPECT_EQ(four.rank_state[3][exp_avg].size(), 32u);
  // The matrices (30 elements each) go whole to two owners; their momentum is nowhere else.
  size_t momentum = 0, holders = 0;
  for (int r = 0; r < 4; ++r) {
    momentum += four.rank_state[r][0].size();
    holders += four.rank_state[r][0].empty() ? 0 : 1;
  }
  EXPECT_EQ(momentum, 60u);
  EXPECT_EQ(holders, 2u);
}

}  // namespace
}  // namespace crucible
