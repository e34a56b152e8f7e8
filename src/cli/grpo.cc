// crucible grpo --config FILE [--set section.key=value ...]
#include <memory>

#include "cli/command.h"
#include "cli/run_config.h"
#include "common/config.h"
#include "rl/grpo_trainer.h"

namespace crucible {
namespace {

CommandRun SetupGrpo(CLI::App& app) {
  const auto options = AddRunConfigOptions(app, "TOML config file with a [grpo] section");
  app.footer(
      "On-policy GRPO from model.init_weights (docs/post-training.md, \"GRPO loop\"); config "
      "keys: crucible config keys ([grpo]). Exit codes: 0 done, 2 config error, 3 diverged, 65 "
      "bad data (prompts file, reward command), 74 I/O error.");
  return [options]() {
    const Config config = LoadRunConfig(*options);
    if (PrintedConfig(*options, config)) return 0;
    return RunGrpo(config, options->resume);
  };
}

CommandRegistrar grpo_registrar(
    "grpo", "on-policy RL with verifiable rewards: crucible grpo --config FILE [--set k=v]",
    SetupGrpo);

}  // namespace
}  // namespace crucible
