// crucible smoke [--golden FILE] [--ranks N] [--update]
#include "eval/smoke.h"

#include <memory>

#include "cli/command.h"

namespace crucible {
namespace {

CommandRun SetupSmoke(CLI::App& app) {
  auto options = std::make_shared<SmokeOptions>();
  options->golden = "tests/golden/smoke.json";
  app.add_option("--golden", options->golden, "golden file to compare with (or write)")
      ->capture_default_str();
  app.add_option("--ranks", options->ranks,
                 "MPI ranks (mpirun); the golden is the same for any count")
      ->check(CLI::Range(1, 64));
  app.add_flag("--update", options->update,
               "rewrite the golden file from this run (explicit only)");
  app.add_option("--work-dir", options->work_dir,
                 "keep the run in this folder instead of a temporary one");
  app.footer(
      "Exit codes: 0 bit-identical to the golden, 1 a difference (the first differing step "
      "and tensor are printed), 2 usage error.");
  return [options]() { return RunSmoke(*options); };
}

CommandRegistrar smoke_registrar("smoke",
                                 "bit-exact smoke gate: a fixed run compared with a golden file",
                                 SetupSmoke);

}  // namespace
}  // namespace crucible
