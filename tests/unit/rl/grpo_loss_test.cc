// The GRPO objective (rl/grpo_loss.h): advantages by hand for each scaling, the loss of each
// loss_type on hand-made batches, the derivative against a central finite difference for every
// loss type and both importance-sampling levels, the split of a batch over ranks summing to the
// whole, and TRL's clip metrics. (Agreement with TRL's own code: test_grpo_loss_trl.py.)
#include "rl/grpo_loss.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/error.h"

namespace crucible {
namespace {

TEST(GrpoAdvantages, GroupScalingUsesBesselStdAndTrlEpsilon) {
  const std::vector<double> rewards = {1, 0, 0, 1, 2, 2, 2, 2};
  const std::vector<double> advantages = ComputeAdvantages(rewards, 4, RewardScaling::kGroup);
  // Group 1: mean 0.5, std with Bessel's correction sqrt(4 * 0.25 / 3) = sqrt(1/3).
  const double std = std::sqrt(1.0 / 3.0);
  EXPECT_DOUBLE_EQ(advantages[0], 0.5 / (std + 1e-4));
  EXPECT_DOUBLE_EQ(advantages[1], -0.5 / (std + 1e-4));
  // Group 2: all equal, std 0: advantage 0.
  for (int i = 4; i < 8; ++i) EXPECT_EQ(advantages[i], 0);
}

TEST(GrpoAdvantages, BatchScalingKeepsTheGroupMean) {
  const std::vector<double> rewards = {1, 0, 3, 3};
  const std::vector<double> advantages = ComputeAdvantages(rewards, 2, RewardScaling::kBatch);
  // Batch mean 1.75, squared deviations 0.5625 + 3.0625 + 1.5625 + 1.5625 = 6.75, / 3 = 2.25:
  // std 1.5.
  EXPECT_DOUBLE_EQ(advantages[0], 0.5 / (1.5 + 1e-4));
  EXPECT_DOUBLE_EQ(advantages[1], -0.5 / (1.5 + 1e-4));
  EXPECT_EQ(advantages[2], 0);
}

TEST(GrpoAdvantages, NoneIsMeanOnlyAndOneGenerationGivesZero) {
  const std::vector<double> rewards = {1, 0, 0, 0};
  const std::vector<double> none = ComputeAdvantages(rewards, 4, RewardScaling::kNone);
  EXPECT_DOUBLE_EQ(none[0], 0.75);
  EXPECT_DOUBLE_EQ(none[1], -0.25);
  for (double advantage : ComputeAdvantages(rewards, 1, RewardScaling::kGroup))
    EXPECT_EQ(advantage, 0);
  EXPECT_THROW(ComputeAdvantages(rewards, 3, RewardScaling::kGroup), Error);
}

TEST(GrpoLossNames, TrlNamesParseAndOthersAreUsageErrors) {
  for (const char* name : {"grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo", "vespo"})
    EXPECT_STREQ(GrpoLossTypeName(ParseGrpoLossType(name, "grpo.loss_type")), name);
  try {
    ParseGrpoLossType("ppo", "grpo.loss_type");
    FAIL();
  } catch (const Error& error) {
    EXPECT_EQ(error.exit_code(), kExitUsage);
    EXPECT_NE(std::string(error.what()).find("grpo.loss_type = \"ppo\""), std::string::npos);
  }
}

// A batch: 2 sequences of 3 positions, the second with one padding position.
struct Batch {
  std::size_t sequences = 2, positions = 3;
  std::vector<float> logp = {-1.0f, -0.5f, -2.0f, -0.7f, -1.2f, -3.0f};
  std::vector<float> old_logp = {-1.1f, -0.5f, -1.5f, -0.6f, -1.25f, -3.0f};
  std::vector<float> ref_logp = {-0.9f, -0.6f, -1.8f, -0.8f, -1.0f, -3.0f};
  std::vector<float> mask = {1, 1, 1, 1, 1, 0};
  std::vector<double> advantages = {1.5, -0.8};
};

double Loss(const GrpoLossConfig& config, const Batch& batch,
            std::vector<float>* gradient = nullptr) {
  std::vector<float> dloss(batch.logp.size());
  const GrpoLossSums sums = GrpoLoss(config, GrpoLocalTotals(batch.mask, batch.sequences),
                                     batch.sequences, batch.positions, batch.logp, batch.old_logp,
                                     batch.ref_logp, batch.mask, batch.advantages, dloss);
  if (gradient) *gradient = dloss;
  return sums.loss;
}

TEST(GrpoLoss, OnPolicyWithoutKlIsMinusTheMeanAdvantageOfEachAggregation) {
  Batch batch;
  batch.old_logp = batch.logp;  // w = 1 everywhere: l_t = -A
  GrpoLossConfig config;
  config.loss_type = GrpoLossType::kGrpo;  // mean of sequence means: (-1.5 + 0.8) / 2
  EXPECT_NEAR(Loss(config, batch), -0.35, 1e-12);
  config.loss_type = GrpoLossType::kDapo;  // token mean: (-1.5 * 3 + 0.8 * 2) / 5
  EXPECT_NEAR(Loss(config, batch), -0.58, 1e-12);
  config.loss_type = GrpoLossType::kBnpo;  // one micro-batch: the same as dapo
  EXPECT_NEAR(Loss(config, batch), -0.58, 1e-12);
  config.loss_type = GrpoLossType::kDrGrpo;  // sum / (2 sequences * 4)
  config.max_completion_length = 4;
  EXPECT_NEAR(Loss(config, batch), -2.9 / 8, 1e-12);
  config.loss_type = GrpoLossType::kLuspo;  // mean of sequence sums
  EXPECT_NEAR(Loss(config, batch), -2.9 / 2, 1e-12);
  config.loss_type = GrpoLossType::kSapo;  // sigmoid(0) * 4 / tau = 2 / tau, per sequence mean
  EXPECT_NEAR(Loss(config, batch), (-2.0 * 1.5 + 2.0 / 1.05 * 0.8) / 2, 1e-12);
}

TEST(GrpoLoss, ClippedTokenAndKlByHand) {
  Batch batch;
  batch.sequences = 1, batch.positions = 1;
  batch.logp = {std::log(1.5f)}, batch.old_logp = {0}, batch.ref_logp = {0}, batch.mask = {1};
  batch.advantages = {2};
  GrpoLossConfig config;
  config.loss_type = GrpoLossType::kDapo;
  config.beta = 0.1;
  config.kl_bias_correction = false;
  // w = 1.5 > 1.2 with A > 0: the clipped term 1.2 * 2 wins the min, with zero slope in w.
  const double lp = std::log(1.5f), k3 = std::exp(-lp) + lp - 1;
  std::vector<float> gradient;
  EXPECT_NEAR(Loss(config, batch, &gradient), -2.4 + 0.1 * k3, 1e-7);
  EXPECT_NEAR(gradient[0], 0.1 * (1 - std::exp(-lp)), 1e-7);
  // With the bias correction, kl is k3 * w, and its derivative gains k3 * w.
  config.kl_bias_correction = true;
  const double w = std::exp(lp);
  EXPECT_NEAR(Loss(config, batch, &gradient), -2.4 + 0.1 * k3 * w, 1e-7);
  EXPECT_NEAR(gradient[0], 0.1 * ((1 - std::exp(-lp)) * w + k3 * w), 1e-6);
}

TEST(GrpoLoss, DrGrpoWithoutMaxCompletionLengthIsAUsageError) {
  GrpoLossConfig config;
  config.loss_type = GrpoLossType::kDrGrpo;
  EXPECT_THROW(Loss(config, Batch()), Error);
}

// dL/dlogp against central differences in double (the loss is evaluated on float inputs, so the
// step is large enough to be exact in float and the tolerance allows float rounding).
void ExpectGradientMatchesFiniteDifference(const GrpoLossConfig& config) {
  Batch batch;
  std::mt19937 random(7);
  std::uniform_real_distribution<float> noise(-0.15f, 0.15f);
  batch.sequences = 4, batch.positions = 5;
  batch.logp.assign(20, 0), batch.old_logp.assign(20, 0), batch.ref_logp.assign(20, 0),
      batch.mask.assign(20, 1);
  for (int i = 0; i < 20; ++i) {
    batch.old_logp[i] = -1.0f + noise(random) * 4;
    batch.logp[i] = batch.old_logp[i] + noise(random);
    batch.ref_logp[i] = batch.old_logp[i] + noise(random);
  }
  batch.mask[9] = batch.mask[13] = batch.mask[14] = 0;
  batch.advantages = {1.2, -0.7, 0.3, -1.1};
  std::vector<float> gradient;
  Loss(config, batch, &gradient);
  for (std::size_t i = 0; i < batch.logp.size(); ++i) {
    const float step = 1.0f / 1024;
    Batch plus = batch, minus = batch;
    plus.logp[i] += step, minus.logp[i] -= step;
    const double numeric = (Loss(config, plus) - Loss(config, minus)) / (2.0 * step);
    EXPECT_NEAR(gradient[i], numeric, 2e-5 + 1e-3 * std::abs(numeric))
        << GrpoLossTypeName(config.loss_type) << " token " << i;
    if (batch.mask[i] == 0) {
      EXPECT_EQ(gradient[i], 0);
    }
  }
}

// cispo and vespo hold their weights constant (TRL detaches them), so their gradient is not the
// derivative of their loss value: CispoAndVespoHoldTheirWeightsConstant checks them.
TEST(GrpoLoss, GradientMatchesFiniteDifferenceForEveryLossTypeAndLevel) {
  for (GrpoLossType type : {GrpoLossType::kGrpo, GrpoLossType::kBnpo, GrpoLossType::kDrGrpo,
                            GrpoLossType::kDapo, GrpoLossType::kLuspo, GrpoLossType::kSapo}) {
    for (auto level : {ImportanceSamplingLevel::kToken, ImportanceSamplingLevel::kSequence}) {
      GrpoLossConfig config;
      config.loss_type = type;
      config.importance_sampling_level = level;
      config.beta = 0.04;
      config.max_completion_length = 8;
      config.epsilon_low = 0.1, config.epsilon_high = 0.12;
      ExpectGradientMatchesFiniteDifference(config);
      config.kl_bias_correction = false;
      config.delta = 1.08;
      ExpectGradientMatchesFiniteDifference(config);
    }
  }
}

TEST(GrpoLoss, CispoAndVespoHoldTheirWeightsConstant) {
  Batch batch;
  batch.sequences = 1, batch.positions = 2;
  batch.logp = {-1.0f, -2.0f}, batch.old_logp = {-1.0f - std::log(1.5f), -2.0f},
  batch.mask = {1, 1};
  batch.ref_logp = batch.logp, batch.advantages = {2};
  GrpoLossConfig config;
  config.loss_type = GrpoLossType::kCispo;
  config.epsilon_high = 1.2;
  std::vector<float> gradient;
  // l_t = -min(w, 1.2) A logp_t, over 2 tokens; the gradient is -min(w, 1.2) A / 2.
  EXPECT_NEAR(Loss(config, batch, &gradient), (1.2 * 2 * 1.0 + 1.0 * 2 * 2.0) / 2, 1e-6);
  EXPECT_NEAR(gradient[0], -1.2 * 2 / 2, 1e-6);
  EXPECT_NEAR(gradient[1], -1.0 * 2 / 2, 1e-6);
  config.loss_type = GrpoLossType::kVespo;
  // log W = log 1.5; phi = exp(3 + 2 log 1.5 - 3 * 1.5) for A >= 0 (k_pos 2, lambda_pos 3).
  const double phi = std::exp(3 + 2 * std::log(1.5) - 3 * 1.5);
  EXPECT_NEAR(Loss(config, batch, &gradient), phi * 2 * 3.0 / 2, 1e-6);
  EXPECT_NEAR(gradient[0], -phi * 2 / 2, 1e-6);
  EXPECT_NEAR(gradient[1], -phi * 2 / 2, 1e-6);
}

TEST(GrpoLoss, RanksSummingTheirSharesGiveTheWholeBatch) {
  Batch batch;
  for (GrpoLossType type :
       {GrpoLossType::kGrpo, GrpoLossType::kDrGrpo, GrpoLossType::kDapo, GrpoLossType::kLuspo}) {
    GrpoLossConfig config;
    config.loss_type = type;
    config.beta = 0.05;
    config.max_completion_length = 3;
    std::vector<float> whole_gradient;
    const double whole = Loss(config, batch, &whole_gradient);
    // Each sequence on its own rank, with the totals summed over both.
    GrpoBatchTotals totals;
    for (std::size_t b = 0; b < 2; ++b) {
      const GrpoBatchTotals share = GrpoLocalTotals(std::span(batch.mask).subspan(b * 3, 3), 1);
      totals.sequences += share.sequences, totals.tokens += share.tokens,
          totals.micro_batches += share.micro_batches;
    }
    double summed = 0;
    for (std::size_t b = 0; b < 2; ++b) {
      const auto rows = [&](const std::vector<float>& v) { return std::span(v).subspan(b * 3, 3); };
      std::vector<float> gradient(3);
      summed += GrpoLoss(config, totals, 1, 3, rows(batch.logp), rows(batch.old_logp),
                         rows(batch.ref_logp), rows(batch.mask),
                         std::span(batch.advantages).subspan(b, 1), gradient)
                    .loss;
      for (int t = 0; t < 3; ++t) EXPECT_FLOAT_EQ(gradient[t], whole_gradient[b * 3 + t]);
    }
    EXPECT_NEAR(summed, whole, 1e-12) << GrpoLossTypeName(type);
  }
}

TEST(GrpoLoss, ClipMetricsFollowTrl) {
  Batch batch;
  batch.sequences = 1, batch.positions = 4;
  // w = 1.5 (high), 0.5 (low), 1.0, 1.5; the advantage is negative, so only low clips count.
  batch.logp = {std::log(1.5f), std::log(0.5f), 0, std::log(1.5f)};
  batch.old_logp = {0, 0, 0, 0}, batch.ref_logp = batch.old_logp, batch.mask = {1, 1, 1, 0};
  batch.advantages = {-1};
  GrpoLossConfig config;
  std::vector<float> dloss(4);
  GrpoLossSums sums = GrpoLoss(config, GrpoLocalTotals(batch.mask, 1), 1, 4, batch.logp,
                               batch.old_logp, batch.ref_logp, batch.mask, batch.advantages, dloss);
  GrpoMetrics metrics = GrpoMetricsFromSums(sums);
  EXPECT_NEAR(metrics.clip_low_mean, 1.0 / 3, 1e-12);
  EXPECT_EQ(metrics.clip_high_mean, 0);
  EXPECT_NEAR(metrics.clip_region_mean, 1.0 / 3, 1e-12);
  EXPECT_NEAR(metrics.mean_ratio, 1.0, 1e-6);
  EXPECT_NEAR(metrics.clip_low_min, 1.0 / 3, 1e-12);
  batch.advantages = {1};
  sums = GrpoLoss(config, GrpoLocalTotals(batch.mask, 1), 1, 4, batch.logp, batch.old_logp,
                  batch.ref_logp, batch.mask, batch.advantages, dloss);
  metrics = GrpoMetricsFromSums(sums);
  EXPECT_NEAR(metrics.clip_high_mean, 1.0 / 3, 1e-12);
  EXPECT_NEAR(metrics.clip_high_max, 1.0 / 3, 1e-12);
  EXPECT_EQ(metrics.clip_low_mean, 0);
}

}  // namespace
}  // namespace crucible
