#include <gtest/gtest.h>

#include <array>

#include "optim/balance_bias.h"
#include "optim/optimizer_shard.h"

namespace crucible {
namespace {

OptimizerConfig ConfigFor(const std::string& name, double speed) {
  Config config = Config::Defaults();
  config.ApplyOverride("optimizer.name=" + name);
  config.ApplyOverride("model.bias_update_speed=" + std::to_string(speed));
  return BuildOptimizerConfig(config);
}

// b <- b - speed * sign(g): an overloaded expert's bias (g > 0) falls, an idle one's rises, a
// balanced one's stays, whatever the learning rate; no state, no decay.
TEST(BalanceBias, MovesEachBiasAgainstTheSignOfItsLoadDeviationBySpeed) {
  for (const char* name : {"AdamW", "Muon", "Lion", "SGD"}) {
    const OptimizerConfig config = ConfigFor(name, 0.25);
    ParamInfo bias;
    bias.name = "model.layers.1.mlp.gate.e_score_correction_bias";
    bias.kind = ParamKind::kBalanceBias;
    bias.numel = 3;
    bias.shape = {3};
    std::array<float, 3> w = {0.5f, -1.0f, 2.0f};
    const std::array<float, 3> g = {0.125f, -3.0f, 0.0f};
    const GroupSettings& group = config.groups.Of(ParamKind::kBalanceBias).settings;
    std::vector<std::span<float>> no_state(config.optimizer->state().size());
    for (size_t i = 0; i < no_state.size(); ++i)
      EXPECT_EQ(config.optimizer->state()[i].FloatsOf(bias), 0u) << name;
    config.optimizer->Update({bias, group, /*lr=*/7.0, /*step=*/3, 0, w, g, no_state});
    EXPECT_EQ(w, (std::array<float, 3>{0.25f, -0.75f, 2.0f})) << name;
    EXPECT_EQ(config.optimizer->shard_mode_of(bias), ShardMode::kElementwise) << name;
  }
}

TEST(BalanceBias, ASpeedOfZeroKeepsTheBias) {
  const OptimizerConfig config = ConfigFor("AdamW", 0.0);
  ParamInfo bias;
  bias.kind = ParamKind::kBalanceBias;
  bias.numel = 2;
  std::array<float, 2> w = {0.5f, -1.0f};
  const std::array<float, 2> g = {1.0f, -1.0f};
  std::vector<std::span<float>> no_state(config.optimizer->state().size());
  config.optimizer->Update(
      {bias, config.groups.Of(ParamKind::kBalanceBias).settings, 1.0, 1, 0, w, g, no_state});
  EXPECT_EQ(w, (std::array<float, 2>{0.5f, -1.0f}));
}

}  // namespace
}  // namespace crucible
