// Parameter groups: which tensors each group holds, the settings today's keys give them, and that
// an update applies each tensor's group settings.
#include "optim/param_groups.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "optim/optimizer_shard.h"
#include "optim_test_util.h"

namespace crucible {
namespace {

using optim_test::ConfigFor;
using optim_test::SmallTable;
using optim_test::Values;

ParamGroups GroupsOf(const std::vector<std::string>& overrides) {
  Config config = Config::Defaults();
  for (const std::string& o : overrides) config.ApplyOverride(o);
  return BuildParamGroups(config);
}

TEST(ParamGroups, MatricesEmbeddingsHeadAndNormsByKind) {
  const ParamGroups groups = GroupsOf({});
  ASSERT_EQ(groups.groups().size(), 5u);
  EXPECT_EQ(groups.Of(ParamKind::kBalanceBias).name, "balance");
  EXPECT_EQ(groups.Of(ParamKind::kBalanceBias).settings.weight_decay, 0.0);
  EXPECT_EQ(groups.Of(ParamKind::kLinear).name, "matrices");
  EXPECT_EQ(groups.Of(ParamKind::kOutputProjection).name, "matrices");
  EXPECT_EQ(groups.Of(ParamKind::kEmbedding).name, "embeddings");
  EXPECT_EQ(groups.Of(ParamKind::kHead).name, "head");
  EXPECT_EQ(groups.Of(ParamKind::kNorm).name, "norms");
}

TEST(ParamGroups, NormsAndEmbeddingsAreNotDecayedUnlessAsked) {
  const ParamGroups plain = GroupsOf({"optimizer.weight_decay=0.25"});
  EXPECT_EQ(plain.Of(ParamKind::kLinear).settings.weight_decay, 0.25);
  EXPECT_EQ(plain.Of(ParamKind::kOutputProjection).settings.weight_decay, 0.25);
  EXPECT_EQ(plain.Of(ParamKind::kHead).settings.weight_decay, 0.25);
  EXPECT_EQ(plain.Of(ParamKind::kNorm).settings.weight_decay, 0.0);
  EXPECT_EQ(plain.Of(ParamKind::kEmbedding).settings.weight_decay, 0.0);
  const ParamGroups norms = GroupsOf({"optimizer.weight_decay=0.25", "optimizer.decay_norms=true"});
  EXPECT_EQ(norms.Of(ParamKind::kNorm).settings.weight_decay, 0.25);
  EXPECT_EQ(norms.Of(ParamKind::kEmbedding).settings.weight_decay, 0.0);
  const ParamGroups embeddings =
      GroupsOf({"optimizer.weight_decay=0.25", "optimizer.decay_embeddings=true"});
  EXPECT_EQ(embeddings.Of(ParamKind::kNorm).settings.weight_decay, 0.0);
  EXPECT_EQ(embeddings.Of(ParamKind::kEmbedding).settings.weight_decay, 0.25);
}

TEST(ParamGroups, EveryGroupTakesTheBetasEpsAndLrScaleOne) {
  const ParamGroups groups =
      GroupsOf({"optimizer.beta1=0.7", "optimizer.beta2=0.8", "optimizer.eps=1e-6"});
  for (const ParamGroup& group : groups.groups()) {
    EXPECT_EQ(group.settings.beta1, 0.7) << group.name;
    EXPECT_EQ(group.settings.beta2, 0.8) << group.name;
    EXPECT_EQ(group.settings.eps, 1e-6) << group.name;
    EXPECT_EQ(group.settings.lr_scale, 1.0) << group.name;
  }
}

TEST(ParamGroups, AKindInTwoGroupsIsAnInternalError) {
  try {
    ParamGroups({{"a", {ParamKind::kNorm}, {}}, {"b", {ParamKind::kLinear, ParamKind::kNorm}, {}}});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitFailure);
  }
}

// With a zero gradient, one SGD step only decays: a decayed tensor is multiplied by exactly
// 1 - lr x weight_decay (in float), an undecayed one is left as it was.
TEST(ParamGroups, AStepDecaysEachTensorByItsGroup) {
  const ParameterTable table = SmallTable();
  for (bool decay_norms : {false, true}) {
    OptimizerConfig config =
        ConfigFor("SGD", {"optimizer.weight_decay=0.5", std::string("optimizer.decay_norms=") +
                                                            (decay_norms ? "true" : "false")});
    OptimizerShard shard(config, table, 0, table.total());
    const std::vector<float> before = Values(table.total(), 3);
    std::vector<float> weights = before, grads(table.total(), 0.0f);
    shard.Step(weights.data(), grads.data(), 0.1, 1);
    for (const ParamInfo& p : table.params()) {
      const bool decayed =
          p.kind == ParamKind::kNorm ? decay_norms : p.kind != ParamKind::kEmbedding;
      const float factor = decayed ? 1.0f - 0.1f * 0.5f : 1.0f;
      for (size_t i = p.offset; i < p.offset + p.numel; ++i)
        ASSERT_EQ(weights[i], before[i] * factor) << p.name << " decay_norms=" << decay_norms;
    }
  }
}

// A group's lr_scale multiplies the schedule's learning rate for its tensors only.
TEST(ParamGroups, AGroupsLrScaleScalesItsTensorsUpdates) {
  const ParameterTable table = SmallTable();
  OptimizerConfig config = ConfigFor("SGD", {"optimizer.weight_decay=0"});
  std::vector<ParamGroup> groups = config.groups.groups();
  for (ParamGroup& group : groups)
    if (group.name == "norms") group.settings.lr_scale = 0.25;
  config.groups = ParamGroups(groups);
  OptimizerShard shard(config, table, 0, table.total());
  std::vector<float> weights(table.total(), 0.0f), grads(table.total(), 1.0f);
  shard.Step(weights.data(), grads.data(), 0.5, 1);
  for (const ParamInfo& p : table.params())
    EXPECT_EQ(weights[p.offset], p.kind == ParamKind::kNorm ? -0.125f : -0.5f) << p.name;
}

}  // namespace
}  // namespace crucible
