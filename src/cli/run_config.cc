#include "cli/run_config.h"

#include <cstdio>

namespace crucible {

std::shared_ptr<RunConfigOptions> AddRunConfigOptions(CLI::App& app, const char* config_help) {
  auto options = std::make_shared<RunConfigOptions>();
  app.add_option("-c,--config", options->config_path, config_help);
  app.add_option("--set", options->overrides,
                 "override a key: section.key=value (TOML value; a bare word is a string)")
      ->take_all();
  app.add_option("--resume", options->resume,
                 "auto (default: the newest checkpoint that verifies, if the run directory has "
                 "any), none, or a checkpoint folder");
  app.add_flag("--print-config", options->print_config,
               "print the resolved config as TOML and exit");
  return options;
}

Config LoadRunConfig(const RunConfigOptions& options) {
  if (options.config_path.empty()) {
    Config config = Config::Defaults();
    for (const auto& o : options.overrides) config.ApplyOverride(o);
    return config;
  }
  return Config::Load(options.config_path, options.overrides);
}

bool PrintedConfig(const RunConfigOptions& options, const Config& config) {
  if (!options.print_config) return false;
  std::fputs(config.ToToml().c_str(), stdout);
  return true;
}

}  // namespace crucible
