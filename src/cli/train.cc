// crucible train --config FILE [--set section.key=value ...]
#include <cmath>
#include <memory>

#include "cli/command.h"
#include "cli/run_config.h"
#include "common/config.h"
#include "common/log.h"
#include "common/strings.h"
#include "train/trainer.h"

namespace crucible {
namespace {

CommandRun SetupTrain(CLI::App& app) {
  const auto options = AddRunConfigOptions(app, "TOML config file (configs/*.toml)");
  app.footer(
      "Config keys: crucible config keys. Exit codes: 0 done, 2 config error, 3 diverged (the "
      "loss or the weights went non-finite), 65 bad data, 74 I/O error, 143 stopped by "
      "SIGTERM/SIGUSR1 after a checkpoint.");
  return [options]() {
    const Config config = LoadRunConfig(*options);
    if (PrintedConfig(*options, config)) return 0;
    return RunTraining(config, options->resume);
  };
}

CommandRun SetupConfig(CLI::App& app) {
  auto sub = app.add_subcommand("keys", "list every config key with its type, default and meaning");
  app.require_subcommand(1);
  return [sub]() {
    if (!sub->parsed()) return 2;
    std::string section;
    for (const auto& spec : Config::Schema()) {
      std::string s = spec.key.substr(0, spec.key.find('.'));
      if (s != section) {
        std::printf("%s[%s]\n", section.empty() ? "" : "\n", s.c_str());
        section = s;
      }
      std::string help = spec.help;
      if (std::isfinite(spec.range.min) || std::isfinite(spec.range.max))
        help += " (valid: " + spec.range.Describe(spec.type) + ")";
      std::printf("  %-32s = %-14s # %s\n", spec.key.substr(s.size() + 1).c_str(),
                  FormatConfigValue(spec.default_value).c_str(), help.c_str());
    }
    return 0;
  };
}

CommandRegistrar train_registrar("train", "train a model: crucible train --config FILE [--set k=v]",
                                 SetupTrain);
CommandRegistrar config_registrar("config", "inspect the config schema", SetupConfig);

}  // namespace
}  // namespace crucible
