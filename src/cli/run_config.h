// The options of the commands that run from a training config (crucible train, crucible grpo):
// --config, --set, --resume and --print-config, and the Config they make.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"

namespace crucible {

struct RunConfigOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  bool print_config = false;
  std::string resume = "auto";
};

// Adds the four options to `app`; `config_help` describes --config.
std::shared_ptr<RunConfigOptions> AddRunConfigOptions(CLI::App& app, const char* config_help);

// --config (the defaults when absent) with the --set overrides applied.
Config LoadRunConfig(const RunConfigOptions& options);

// With --print-config: prints `config` as TOML and returns true (the command then exits 0).
bool PrintedConfig(const RunConfigOptions& options, const Config& config);

}  // namespace crucible
