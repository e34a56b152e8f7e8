// crucible lr-find --config FILE [--set k=v ...] [--min 1e-6 --max 1 --steps 100]
//                  [--apply OUT.toml [--overwrite]] [--out DIR]
#include <memory>

#include "cli/command.h"
#include "common/config.h"
#include "train/lr_finder.h"

namespace crucible {
namespace {

struct LrFindCommandOptions {
  LrFindOptions sweep;
  std::vector<std::string> overrides;
};

CommandRun SetupLrFind(CLI::App& app) {
  auto options = std::make_shared<LrFindCommandOptions>();
  app.add_option("-c,--config", options->sweep.config_path, "TOML config file of the run")
      ->required();
  app.add_option("--set", options->overrides,
                 "override a key: section.key=value (TOML value; a bare word is a string)")
      ->take_all();
  app.add_option("--min", options->sweep.min_lr, "first learning rate of the sweep")
      ->capture_default_str();
  app.add_option("--max", options->sweep.max_lr, "last learning rate of the sweep")
      ->capture_default_str();
  app.add_option("--steps", options->sweep.steps, "optimizer steps of the sweep (at least 5)")
      ->capture_default_str();
  app.add_option("--smoothing", options->sweep.smoothing,
                 "factor of the bias-corrected moving average of the loss, in [0, 1)")
      ->capture_default_str();
  app.add_option("--out", options->sweep.out_dir,
                 "folder for lr_find.json, lr_find.svg and the scratch run (default: <run "
                 "directory>-lr-find; never inside the run directory)");
  app.add_option("--apply", options->sweep.apply_path,
                 "write the config with optimizer.lr = the suggestion to this file (a copy; "
                 "never the --config file; its folder must exist)");
  app.add_flag("--overwrite", options->sweep.overwrite,
               "let --apply replace an existing file (refused without it, before the sweep)");
  app.footer(
      "An exponential LR sweep from --min to --max on the run's model, optimizer, batch and "
      "data (fresh weights, no warmup or decay), the loss smoothed by a bias-corrected EMA "
      "(--smoothing), stopped when the smoothed loss exceeds 4x its best or the loss is not "
      "finite. "
      "Suggests the smaller of blow-up/10 and the steepest-descent LR (the first 10 points "
      "skipped; the steepest descent when the sweep never blew up), always below the LR of the "
      "step before the blow-up; exit 2 when there is none (too few points before the blow-up) or "
      "the curve is flat (random tokens). See "
      "docs/lr-find.md. Exit codes: 0 done, 2 usage or config error, 65 bad data, 74 I/O "
      "error.");
  return [options]() {
    return RunLrFind(Config::Load(options->sweep.config_path, options->overrides), options->sweep);
  };
}

CommandRegistrar lr_find_registrar(
    "lr-find", "suggest a learning rate: an LR sweep on the run's model and data", SetupLrFind);

}  // namespace
}  // namespace crucible
