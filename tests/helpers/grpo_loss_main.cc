// test_grpo_loss_helper: the GRPO objective of src/rl/grpo_loss.h on one batch given as JSON on
// stdin, for tests/integration/test_grpo_loss_trl.py (a test-only program, not installed).
//   stdin:  {"config": {"loss_type", "importance_sampling_level", "epsilon_low", "epsilon_high",
//            "delta", "beta", "kl_bias_correction", "max_completion_length", ...},
//            "scale_rewards", "group_size", "sequences", "positions",
//            "logp", "old_logp", "ref_logp", "mask" (B*T), "rewards" (B)}
//   stdout: {"advantages", "loss", "dloss_dlogp", "metrics": {...}}
// The batch is one micro-batch on one rank: the totals are its own.
#include <iostream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "rl/grpo_loss.h"

int main() {
  using namespace crucible;
  try {
    const nlohmann::json input = nlohmann::json::parse(std::cin);
    const nlohmann::json& json_config = input.at("config");
    GrpoLossConfig config;
    config.loss_type = ParseGrpoLossType(json_config.value("loss_type", "dapo"), "loss_type");
    config.importance_sampling_level = ParseImportanceSamplingLevel(
        json_config.value("importance_sampling_level", "token"), "level");
    config.epsilon_low = json_config.value("epsilon_low", config.epsilon_low);
    config.epsilon_high = json_config.value("epsilon_high", config.epsilon_high);
    config.delta = json_config.value("delta", config.delta);
    config.beta = json_config.value("beta", config.beta);
    config.kl_bias_correction = json_config.value("kl_bias_correction", config.kl_bias_correction);
    config.max_completion_length =
        json_config.value("max_completion_length", config.max_completion_length);
    config.sapo_temperature_pos =
        json_config.value("sapo_temperature_pos", config.sapo_temperature_pos);
    config.sapo_temperature_neg =
        json_config.value("sapo_temperature_neg", config.sapo_temperature_neg);

    const auto sequences = input.at("sequences").get<std::size_t>();
    const auto positions = input.at("positions").get<std::size_t>();
    const auto logp = input.at("logp").get<std::vector<float>>();
    const auto old_logp = input.at("old_logp").get<std::vector<float>>();
    const auto ref_logp = input.at("ref_logp").get<std::vector<float>>();
    const auto mask = input.at("mask").get<std::vector<float>>();
    const auto rewards = input.at("rewards").get<std::vector<double>>();
    const std::vector<double> advantages = ComputeAdvantages(
        rewards, input.at("group_size").get<std::size_t>(),
        ParseRewardScaling(input.value("scale_rewards", "group"), "scale_rewards"));

    std::vector<float> dloss_dlogp(sequences * positions);
    const GrpoLossSums sums =
        GrpoLoss(config, GrpoLocalTotals(mask, sequences), sequences, positions, logp, old_logp,
                 ref_logp, mask, advantages, dloss_dlogp);
    const GrpoMetrics metrics = GrpoMetricsFromSums(sums);
    nlohmann::json output = {
        {"advantages", advantages}, {"loss", sums.loss}, {"dloss_dlogp", dloss_dlogp}};
    output["metrics"] = {{"kl", metrics.kl},
                         {"mean_ratio", metrics.mean_ratio},
                         {"clip_ratio/low_mean", metrics.clip_low_mean},
                         {"clip_ratio/high_mean", metrics.clip_high_mean},
                         {"clip_ratio/region_mean", metrics.clip_region_mean},
                         {"clip_ratio/low_min", metrics.clip_low_min},
                         {"clip_ratio/high_max", metrics.clip_high_max},
                         {"cispo_clip_ratio", metrics.cispo_clip_ratio}};
    std::cout << output.dump() << "\n";
    return 0;
  } catch (const Error& error) {
    std::cerr << "test_grpo_loss_helper: " << error.what() << "\n";
    return error.exit_code();
  } catch (const std::exception& error) {
    std::cerr << "test_grpo_loss_helper: " << error.what() << "\n";
    return 1;
  }
}
