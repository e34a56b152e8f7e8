// crucible grpo --config FILE [--set section.key=value ...]
#include <memory>

#include "cli/command.h"
#include "common/config.h"
#include "rl/grpo_trainer.h"

namespace crucible {
namespace {

struct GrpoOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  bool print_config = false;
  std::string resume = "auto";
};

CommandRun SetupGrpo(CLI::App& app) {
  auto options = std::make_shared<GrpoOptions>();
  app.add_option("-c,--config", options->config_path, "TOML config file with a [grpo] section");
  app.add_option("--set", options->overrides,
                 "override a key: section.key=value (TOML value; a bare word is a string)")
      ->take_all();
  app.add_option("--resume", options->resume,
                 "auto (the newest checkpoint that verifies, if any), none, or a checkpoint "
                 "folder, as crucible train")
      ->capture_default_str();
  app.add_flag("--print-config", options->print_config,
               "print the resolved config as TOML and exit");
  app.footer(
      "On-policy GRPO from model.init_weights (docs/post-training.md, \"GRPO loop\"); config "
      "keys: crucible config keys ([grpo]). Exit codes: 0 done, 2 config error, 3 diverged, 65 "
      "bad data (prompts file, reward command), 74 I/O error.");
  return [options]() {
    Config config = options->config_path.empty()
                        ? Config::Defaults()
                        : Config::Load(options->config_path, options->overrides);
    if (options->config_path.empty())
      for (const auto& o : options->overrides) config.ApplyOverride(o);
    if (options->print_config) {
      std::fputs(config.ToToml().c_str(), stdout);
      return 0;
    }
    return RunGrpo(config, options->resume);
  };
}

CommandRegistrar grpo_registrar(
    "grpo", "on-policy RL with verifiable rewards: crucible grpo --config FILE [--set k=v]",
    SetupGrpo);

}  // namespace
}  // namespace crucible
