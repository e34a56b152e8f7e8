#include "rl/grpo_loss.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace crucible {
namespace {

// TRL's nanstd with no NaNs: sqrt(mean((x - mean)^2) * n / (n - 1)); 0 for n < 2 (TRL's rule for
// a group of one generation, or a batch of one).
double BesselStd(std::span<const double> values, double mean) {
  if (values.size() < 2) return 0;
  double squares = 0;
  for (double value : values) squares += (value - mean) * (value - mean);
  const double count = static_cast<double>(values.size());
  return std::sqrt(squares / count * (count / (count - 1)));
}

double Mean(std::span<const double> values) {
  double sum = 0;
  for (double value : values) sum += value;
  return sum / static_cast<double>(values.size());
}

double Sigmoid(double x) {
  return 1 / (1 + std::exp(-x));
}

bool IsClippedType(GrpoLossType type) {
  return type == GrpoLossType::kGrpo || type == GrpoLossType::kBnpo ||
         type == GrpoLossType::kDrGrpo || type == GrpoLossType::kDapo ||
         type == GrpoLossType::kLuspo;
}

}  // namespace

RewardScaling ParseRewardScaling(const std::string& name, const std::string& key) {
  if (name == "group") return RewardScaling::kGroup;
  if (name == "batch") return RewardScaling::kBatch;
  if (name == "none") return RewardScaling::kNone;
  throw UsageError(key + " = \"" + name + "\": expected \"group\", \"batch\" or \"none\"");
}

GrpoLossType ParseGrpoLossType(const std::string& name, const std::string& key) {
  static const std::pair<const char*, GrpoLossType> kTypes[] = {
      {"grpo", GrpoLossType::kGrpo},      {"bnpo", GrpoLossType::kBnpo},
      {"dr_grpo", GrpoLossType::kDrGrpo}, {"dapo", GrpoLossType::kDapo},
      {"luspo", GrpoLossType::kLuspo},    {"cispo", GrpoLossType::kCispo},
      {"sapo", GrpoLossType::kSapo},      {"vespo", GrpoLossType::kVespo}};
  for (const auto& [type_name, type] : kTypes)
    if (name == type_name) return type;
  throw UsageError(
      key + " = \"" + name +
      "\": expected one of TRL's loss types grpo, bnpo, dr_grpo, dapo, luspo, cispo, sapo, vespo");
}

ImportanceSamplingLevel ParseImportanceSamplingLevel(const std::string& name,
                                                     const std::string& key) {
  if (name == "token") return ImportanceSamplingLevel::kToken;
  if (name == "sequence") return ImportanceSamplingLevel::kSequence;
  throw UsageError(key + " = \"" + name + "\": expected \"token\" or \"sequence\"");
}

const char* GrpoLossTypeName(GrpoLossType type) {
  switch (type) {
    case GrpoLossType::kGrpo:
      return "grpo";
    case GrpoLossType::kBnpo:
      return "bnpo";
    case GrpoLossType::kDrGrpo:
      return "dr_grpo";
    case GrpoLossType::kDapo:
      return "dapo";
    case GrpoLossType::kLuspo:
      return "luspo";
    case GrpoLossType::kCispo:
      return "cispo";
    case GrpoLossType::kSapo:
      return "sapo";
    case GrpoLossType::kVespo:
      return "vespo";
  }
  return "?";
}

std::vector<double> ComputeAdvantages(std::span<const double> rewards, std::size_t group_size,
                                      RewardScaling scaling) {
  if (group_size == 0 || rewards.size() % group_size != 0)
    throw UsageError("GRPO advantages: " + std::to_string(rewards.size()) +
                     " rewards do not split into groups of " + std::to_string(group_size));
  const double batch_std = scaling == RewardScaling::kBatch ? BesselStd(rewards, Mean(rewards)) : 0;
  std::vector<double> advantages(rewards.size());
  for (std::size_t start = 0; start < rewards.size(); start += group_size) {
    const std::span<const double> group = rewards.subspan(start, group_size);
    const double mean = Mean(group);
    const double std = scaling == RewardScaling::kGroup ? BesselStd(group, mean) : batch_std;
    for (std::size_t i = 0; i < group_size; ++i) {
      const double centred = group[i] - mean;
      advantages[start + i] = scaling == RewardScaling::kNone ? centred : centred / (std + 1e-4);
    }
  }
  return advantages;
}

GrpoBatchTotals GrpoLocalTotals(std::span<const float> mask, std::size_t sequences) {
  GrpoBatchTotals totals;
  totals.sequences = static_cast<double>(sequences);
  for (float m : mask) totals.tokens += m;
  totals.micro_batches = 1;
  return totals;
}

GrpoMetrics GrpoMetricsFromSums(const GrpoLossSums& sums) {
  GrpoMetrics metrics;
  const double tokens = std::max(sums.tokens, 1.0), counted = std::max(sums.clip_counted, 1.0);
  metrics.kl = sums.kl / tokens;
  metrics.mean_ratio = sums.ratio / tokens;
  metrics.clip_low_mean = sums.clip_low / counted;
  metrics.clip_high_mean = sums.clip_high / counted;
  metrics.clip_region_mean = sums.clip_region / counted;
  metrics.cispo_clip_ratio = sums.cispo_clip / counted;
  metrics.clip_low_min = sums.clip_low_min > 1e299 ? 0 : sums.clip_low_min;
  metrics.clip_high_max = sums.clip_high_max < -1e299 ? 0 : sums.clip_high_max;
  return metrics;
}

GrpoLossSums GrpoLoss(const GrpoLossConfig& config, const GrpoBatchTotals& totals,
                      std::size_t sequences, std::size_t positions, std::span<const float> logp,
                      std::span<const float> old_logp, std::span<const float> ref_logp,
                      std::span<const float> mask, std::span<const double> advantages,
                      std::span<float> dloss_dlogp) {
  const std::size_t size = sequences * positions;
  const bool kl_on = config.beta != 0;
  if (logp.size() != size || old_logp.size() != size || mask.size() != size ||
      dloss_dlogp.size() != size || advantages.size() != sequences ||
      (kl_on && ref_logp.size() != size))
    throw UsageError("GRPO loss: arrays do not match " + std::to_string(sequences) +
                     " sequences of " + std::to_string(positions) + " positions");
  const GrpoLossType type = config.loss_type;
  if (type == GrpoLossType::kDrGrpo && !(config.max_completion_length > 0))
    throw UsageError("GRPO loss_type = \"dr_grpo\" needs max_completion_length > 0");
  const bool sequence_level =
      config.importance_sampling_level == ImportanceSamplingLevel::kSequence;
  const double low = 1 - config.epsilon_low, high = 1 + config.epsilon_high;

  double local_tokens = 0;
  for (float m : mask) local_tokens += m;

  GrpoLossSums sums;
  sums.tokens = local_tokens;
  std::vector<double> direct(positions);  // sequence level: a row's direct derivatives
  for (std::size_t b = 0; b < sequences; ++b) {
    const std::size_t row = b * positions;
    const double advantage = advantages[b];
    double length = 0, log_ratio_sum = 0, clamped_log_ratio_sum = 0;
    for (std::size_t t = 0; t < positions; ++t) {
      const double m = mask[row + t], log_ratio = double(logp[row + t]) - double(old_logp[row + t]);
      length += m;
      log_ratio_sum += log_ratio * m;
      clamped_log_ratio_sum += std::clamp(log_ratio, -20.0, 20.0) * m;
    }
    const double safe_length = std::max(length, 1.0);
    const double sequence_weight = std::exp(log_ratio_sum / safe_length);  // GSPO's w_b

    // The aggregation weight of each token of this sequence.
    double scale = 0;
    switch (type) {
      case GrpoLossType::kGrpo:
      case GrpoLossType::kSapo:
        scale = 1 / (safe_length * totals.sequences);
        break;
      case GrpoLossType::kBnpo:
        scale = 1 / (std::max(local_tokens, 1.0) * totals.micro_batches);
        break;
      case GrpoLossType::kDrGrpo:
        scale = 1 / (totals.sequences * config.max_completion_length);
        break;
      case GrpoLossType::kDapo:
      case GrpoLossType::kCispo:
      case GrpoLossType::kVespo:
        scale = 1 / std::max(totals.tokens, 1.0);
        break;
      case GrpoLossType::kLuspo:
        scale = 1 / totals.sequences;
        break;
    }

    double phi = 0;  // vespo's gamma weight
    if (type == GrpoLossType::kVespo) {
      const bool positive = advantage >= 0;
      const double k = positive ? config.vespo_k_pos : config.vespo_k_neg;
      const double lambda =
          std::max(positive ? config.vespo_lambda_pos : config.vespo_lambda_neg, 1e-4);
      const double log_w = std::clamp(clamped_log_ratio_sum, std::log(1e-8), 20.0);
      phi = std::exp(lambda + k * log_w - lambda * std::exp(log_w));
      if (!std::isfinite(phi)) phi = 0;
    }

    double dloss_dweight_sum = 0;  // sequence level: Σ_t scale m dl_t/dw
    double low_clipped = 0, high_clipped = 0;
    for (std::size_t t = 0; t < positions; ++t) {
      const double m = mask[row + t], lp = logp[row + t];
      const double w = sequence_level ? sequence_weight : std::exp(lp - double(old_logp[row + t]));
      double l = 0, dl_dw = 0, dl_dlogp = 0;  // dl_dlogp: the direct part, w held fixed
      bool clipped_low = false, clipped_high = false, clipped_cispo = false;
      if (IsClippedType(type)) {
        const bool capped = config.delta > 0 && w > config.delta;
        const double c1 = capped ? config.delta : w, dc1 = capped ? 0 : 1;
        const double c2 = std::clamp(w, low, high), dc2 = (w >= low && w <= high) ? 1 : 0;
        const double a = c1 * advantage, c = c2 * advantage;
        if (a < c) {
          l = -a, dl_dw = -advantage * dc1;
        } else if (c < a) {
          l = -c, dl_dw = -advantage * dc2;
        } else {  // torch.min of two equal values passes half the gradient to each
          l = -a, dl_dw = -advantage * (dc1 + dc2) / 2;
        }
        clipped_low = c1 < low && advantage < 0;
        clipped_high = c1 > high && advantage > 0;
      } else if (type == GrpoLossType::kCispo) {
        const double held = std::min(w, config.epsilon_high);
        l = -held * advantage * lp, dl_dlogp = -held * advantage;
        clipped_cispo = w > config.epsilon_high && advantage > 0;
      } else if (type == GrpoLossType::kSapo) {
        const double tau =
            advantage > 0 ? config.sapo_temperature_pos : config.sapo_temperature_neg;
        const double s = Sigmoid(tau * (w - 1));
        l = -s * 4 / tau * advantage, dl_dw = -advantage * 4 * s * (1 - s);
      } else {  // vespo
        l = -phi * advantage * lp, dl_dlogp = -phi * advantage;
      }
      double kl = 0;
      if (kl_on) {
        const double difference = double(ref_logp[row + t]) - lp, e = std::exp(difference);
        const double k3 = e - difference - 1, dk3 = 1 - e;
        if (config.kl_bias_correction) {
          kl = k3 * w, dl_dlogp += config.beta * dk3 * w, dl_dw += config.beta * k3;
        } else {
          kl = k3, dl_dlogp += config.beta * dk3;
        }
        l += config.beta * kl;
      }
      sums.loss += scale * m * l;
      sums.kl += m * kl;
      sums.ratio += m * w;
      if (!sequence_level) {
        dloss_dlogp[row + t] = static_cast<float>(scale * m * (dl_dlogp + dl_dw * w));
        sums.clip_low += m * clipped_low, sums.clip_high += m * clipped_high;
        sums.clip_region += m * (clipped_low || clipped_high), sums.cispo_clip += m * clipped_cispo;
        low_clipped += m * clipped_low, high_clipped += m * clipped_high;
      } else {
        direct[t] = scale * m * dl_dlogp;
        dloss_dweight_sum += scale * m * dl_dw;
        if (t == 0) {  // one count per sequence
          sums.clip_low += clipped_low, sums.clip_high += clipped_high;
          sums.clip_region += clipped_low || clipped_high, sums.cispo_clip += clipped_cispo;
          low_clipped = clipped_low, high_clipped = clipped_high;
        }
      }
    }
    if (sequence_level) {
      // dw_b/dlogp_t = w_b m_t / max(len_b, 1)
      for (std::size_t t = 0; t < positions; ++t)
        dloss_dlogp[row + t] = static_cast<float>(direct[t] + dloss_dweight_sum * sequence_weight *
                                                                  mask[row + t] / safe_length);
      sums.clip_counted += 1;
      sums.clip_low_min = std::min(sums.clip_low_min, low_clipped);
      sums.clip_high_max = std::max(sums.clip_high_max, high_clipped);
    } else if (length > 0) {
      sums.clip_low_min = std::min(sums.clip_low_min, low_clipped / length);
      sums.clip_high_max = std::max(sums.clip_high_max, high_clipped / length);
    }
  }
  if (!sequence_level) sums.clip_counted = local_tokens;
  return sums;
}

}  // namespace crucible
