// The GRPO objective on one batch of rollouts, per token, as pure functions over host arrays:
// group-normalised advantages, the clipped policy-gradient loss with a KL penalty to a reference,
// its derivative with respect to each token's log-probability, and TRL's metrics. The formulas
// are those of TRL 1.16.0 (trl/trainer/grpo_trainer.py, _generate_and_score_completions and
// _compute_loss), by the same names; tests/integration/test_grpo_loss_trl.py checks them against
// TRL's own code and a PyTorch reference written from the papers.
//
// Shapes: a batch is B sequences (completions) of T positions, row-major; logp[b*T+t] is the
// policy's log-probability of completion token t of sequence b, mask[b*T+t] is 1 for a token that
// is trained on and 0 for padding (and masked tool output or truncated completions). len_b = Σ_t
// mask[b,t]. Values under mask 0 are never read into the loss (they may be anything finite).
//
// Advantages (ComputeAdvantages), over the rewards r of the whole global batch, in groups of G
// consecutive completions of one prompt; mean_g is the group's mean:
//   "group" (TRL's default)  A = (r - mean_g) / (std_g + 1e-4)
//   "batch"                  A = (r - mean_g) / (std_batch + 1e-4)  (PPO Lite; the group mean)
//   "none"                   A = r - mean_g                         (Dr. GRPO)
// std is TRL's nanstd: sqrt(mean((x - mean)^2) * n / (n - 1)), Bessel's correction; a group of
// G = 1 (or a batch of 1) has std 0 by TRL's rule, so its advantage is 0.
//
// Per token, with w the importance weight, A its sequence's advantage, eps_low/eps_high the clip
// range:
//   importance_sampling_level "token":    w_t = exp(logp_t - old_logp_t)
//                             "sequence": w_b = exp(Σ_t mask (logp_t - old_logp_t) / max(len_b, 1))
//                                         (GSPO), the same for every token of sequence b
//   KL (TRL's k3 estimator)   kl_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1, times w when
//                             kl_bias_correction (TRL 1.16's use_bias_correction_kl, default on)
//   grpo, bnpo, dr_grpo, dapo, luspo:
//       l_t = -min(c1 A, c2 A) + beta kl_t,  c2 = clip(w, 1 - eps_low, 1 + eps_high),
//             c1 = min(w, delta) when delta > 0 (INTELLECT-2's two-sided clip), else w
//   cispo  l_t = -min(w, eps_high) A logp_t + beta kl_t   (min(w, eps_high) held constant)
//   sapo   l_t = -(4 / tau) sigmoid(tau (w - 1)) A + beta kl_t,
//               tau = sapo_temperature_pos when A > 0, else sapo_temperature_neg
//   vespo  l_t = -phi_b A logp_t + beta kl_t                  (phi_b held constant):
//               log W_b = clamp(Σ_t mask clamp(logp_t - old_logp_t, -20, 20), ln 1e-8, 20),
//               phi_b = exp(lambda + k log W_b - lambda W_b), (k, lambda) = (vespo_k_pos,
//               vespo_lambda_pos) when A >= 0 else the _neg pair, lambda clamped to >= 1e-4
//
// Aggregation (loss_type), over the global batch; N = GrpoBatchTotals below:
//   grpo, sapo      L = Σ_b (Σ_t mask l_t / max(len_b, 1)) / N.sequences  (sequence means)
//   bnpo            L = Σ_m (Σ_{t in m} mask l_t / max(len_m, 1)) / N.micro_batches
//                       each micro-batch m (one call of GrpoLoss) normalised by its own tokens
//                       (TRL: "the local batch"), then the mean over micro-batches
//   dr_grpo         L = Σ mask l_t / (N.sequences * max_completion_length)
//   dapo, cispo,    L = Σ mask l_t / max(N.tokens, 1)
//   vespo
//   luspo           L = Σ_b Σ_t mask l_t / N.sequences  (the mean of sequence sums)
// On one rank with one micro-batch, L is TRL's loss for that batch. Across data-parallel ranks,
// each rank's GrpoLoss returns its share of L and of the gradient: their SUM over ranks is the
// global loss (TRL gets the same by averaging ranks whose shares are scaled by the rank count).
//
// Gradient, sign convention: dloss_dlogp[b*T+t] = dL/dlogp_t (0 under mask 0), the total
// derivative (through w, the KL and, at sequence level, every token of the sequence). The model's
// token cross-entropy is CE_t = -logp_t, so dL/dθ = Σ_t weight_t dCE_t/dθ with
// weight_t = -dloss_dlogp_t: the existing weighted cross-entropy backward, with those weights held
// constant, gives the GRPO gradient. At the clip edges the derivative is PyTorch's: min of two
// equal values passes half to each, clamp passes the gradient on its closed range.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace crucible {

enum class RewardScaling { kGroup, kBatch, kNone };
enum class GrpoLossType { kGrpo, kBnpo, kDrGrpo, kDapo, kLuspo, kCispo, kSapo, kVespo };
enum class ImportanceSamplingLevel { kToken, kSequence };

// Parsing of TRL's names ("group", "batch", "none"; "grpo", "bnpo", "dr_grpo", "dapo", "luspo",
// "cispo", "sapo", "vespo"; "token", "sequence"); `key` names the config key in the UsageError
// thrown for any other value.
RewardScaling ParseRewardScaling(const std::string& name, const std::string& key);
GrpoLossType ParseGrpoLossType(const std::string& name, const std::string& key);
ImportanceSamplingLevel ParseImportanceSamplingLevel(const std::string& name,
                                                     const std::string& key);
const char* GrpoLossTypeName(GrpoLossType type);

// rewards: the global batch, groups of `group_size` consecutive completions (size a multiple of
// it, every value finite). Returns one advantage per completion. A pure function of its inputs,
// summed in index order: computing it from the gathered rewards on every rank gives the same bits
// whatever the rank count (the rewards are G numbers per prompt, cheap to all-gather).
std::vector<double> ComputeAdvantages(std::span<const double> rewards, std::size_t group_size,
                                      RewardScaling scaling);

// TRL's GRPOConfig fields of the loss, with TRL 1.16.0's defaults.
struct GrpoLossConfig {
  GrpoLossType loss_type = GrpoLossType::kDapo;
  ImportanceSamplingLevel importance_sampling_level = ImportanceSamplingLevel::kToken;
  double epsilon_low = 0.2;          // TRL's epsilon
  double epsilon_high = 0.2;         // TRL's epsilon_high (defaults to epsilon); cispo's eps_max
  double delta = 0;                  // > 0: upper clamp of c1 (TRL's delta); 0: off (TRL's None)
  double beta = 0;                   // KL coefficient; 0: ref_logp is not read
  bool kl_bias_correction = true;    // TRL's use_bias_correction_kl
  double max_completion_length = 0;  // dr_grpo's constant (> 0 for dr_grpo)
  double sapo_temperature_pos = 1.0, sapo_temperature_neg = 1.05;
  double vespo_k_pos = 2.0, vespo_lambda_pos = 3.0, vespo_k_neg = 3.0, vespo_lambda_neg = 2.0;
};

// The normalisers of the aggregation: sums over the whole global batch (every rank, every
// micro-batch of one optimizer step), reduced with SUM before GrpoLoss is called. Each call's
// share is GrpoLocalTotals(its mask); the loop sums the shares in one place.
struct GrpoBatchTotals {
  double sequences = 0;      // global batch: completions (grpo, sapo, dr_grpo, luspo)
  double tokens = 0;         // global batch: Σ mask (dapo, cispo, vespo)
  double micro_batches = 0;  // global batch: calls of GrpoLoss (bnpo)
};
GrpoBatchTotals GrpoLocalTotals(std::span<const float> mask, std::size_t sequences);

// What one call returns that crosses ranks: every field is a sum over this call's tokens or
// sequences, to be reduced with SUM over ranks and micro-batches (the two extremes excepted:
// MIN and MAX), then turned into metrics by GrpoMetricsFromSums. The counted set of the clip
// metrics is the tokens (mask 1) at token level and the sequences at sequence level, as in TRL.
struct GrpoLossSums {
  double loss = 0;          // this call's share of L (already divided by the GrpoBatchTotals)
  double tokens = 0;        // Σ mask: the denominator of kl and ratio
  double kl = 0;            // Σ mask kl_t (including the w factor of kl_bias_correction)
  double ratio = 0;         // Σ mask w_t
  double clip_counted = 0;  // tokens (token level) or sequences (sequence level) counted below
  double clip_low = 0;      // w < 1 - eps_low and A < 0 (w after the delta clamp)
  double clip_high = 0;     // w > 1 + eps_high and A > 0
  double clip_region = 0;   // either of the two
  double cispo_clip = 0;    // cispo: w > eps_high and A > 0
  double clip_low_min =
      1e300;  // reduce with MIN: min over sequences of the sequence's low-clip mean
  double clip_high_max = -1e300;  // reduce with MAX: max over sequences of the high-clip mean
};

// TRL's logged names: kl, clip_ratio/{low_mean, high_mean, region_mean, low_min, high_max},
// cispo_clip_ratio; mean_ratio is Crucible's (the masked token mean of w).
struct GrpoMetrics {
  double kl = 0, mean_ratio = 0;
  double clip_low_mean = 0, clip_high_mean = 0, clip_region_mean = 0;
  double clip_low_min = 0, clip_high_max = 0, cispo_clip_ratio = 0;
};
GrpoMetrics GrpoMetricsFromSums(const GrpoLossSums& sums);

// One micro-batch. logp, old_logp, ref_logp, mask, dloss_dlogp: B*T; advantages: B (this
// micro-batch's rows of ComputeAdvantages). ref_logp may be empty when beta == 0. dloss_dlogp is
// overwritten. Throws UsageError when the array sizes disagree or for dr_grpo without
// max_completion_length. (luspo at token level is allowed, as in TRL.)
GrpoLossSums GrpoLoss(const GrpoLossConfig& config, const GrpoBatchTotals& totals,
                      std::size_t sequences, std::size_t positions, std::span<const float> logp,
                      std::span<const float> old_logp, std::span<const float> ref_logp,
                      std::span<const float> mask, std::span<const double> advantages,
                      std::span<float> dloss_dlogp);

}  // namespace crucible
