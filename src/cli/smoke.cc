// crucible smoke [--golden FILE] [--model llama|deepseek_v3] [--ranks N] [--tp N] [--ep N]
//                [--grpo] [--update]
//                [--portable] [--device cpu|cuda] [--set KEY=VALUE ...]
#include "eval/smoke.h"

#include <memory>

#include "cli/command.h"
#include "common/error.h"

namespace crucible {
namespace {

CommandRun SetupSmoke(CLI::App& app) {
  auto options = std::make_shared<SmokeOptions>();
  app.add_option("--golden", options->golden,
                 "golden file to compare with (or write); default tests/golden/smoke.json, with "
                 "--portable tests/golden/smoke-portable.json, with --model deepseek_v3 "
                 "tests/golden/smoke-deepseek_v3.json");
  app.add_option("--model", options->model,
                 "model family of the run: llama (default) or deepseek_v3 (its own smoke config: "
                 "a dense layer, then a MoE layer with grouped routing, a shared expert and the "
                 "moving balance bias)")
      ->check(CLI::IsMember({"llama", "deepseek_v3"}));
  app.add_flag("--grpo", options->grpo,
               "the GRPO smoke: crucible grpo on the smoke config with a [grpo] table, its "
               "per-step GRPO metrics compared too, against tests/golden/smoke_grpo.json (the "
               "same for any --ranks)");
  app.add_flag("--portable", options->portable,
               "debug.portable_exact = true: fixed-order kernels and portable math, one golden for "
               "every device (slow)");
  app.add_option("--device", options->device,
                 "training.device of the run (cpu, cuda); with --portable the golden is the "
                 "CPU's, bit for bit; other devices need --portable or their own --golden");
  app.add_option("--ranks", options->ranks,
                 "MPI ranks (mpirun); the golden is the same for any count")
      ->check(CLI::Range(1, 64));
  app.add_option("--tp", options->tensor_parallel,
                 "tensor-parallel degree: the tensor-parallel smoke config (its split dimensions "
                 "in 4 chunks) at this degree, against tests/golden/smoke-tp.json, the same for "
                 "--tp 1, 2 and 4 and any --ranks that is a multiple of it")
      ->check(CLI::IsMember({1, 2, 4}));
  app.add_option("--ep", options->expert_parallel,
                 "expert-parallel degree (--model deepseek_v3): its experts split over this many "
                 "ranks, against the family's golden, the same for --ep 1, 2 and 4 and any --ranks "
                 "that is a multiple of it")
      ->check(CLI::IsMember({1, 2, 4}));
  app.add_option("--set", options->sets,
                 "KEY=VALUE for the run, repeatable (test-only switches such as "
                 "debug.fake_loss_divisor; the golden's config is not changed)");
  app.add_flag("--update", options->update,
               "rewrite the golden file from this run (explicit only)");
  app.add_option("--work-dir", options->work_dir,
                 "keep the run in this folder instead of a temporary one");
  app.footer(
      "Exit codes: 0 bit-identical to the golden, 1 a difference (the first differing step "
      "and tensor are printed), 2 usage error (a missing golden, checked before the run; a "
      "device this build or machine cannot run).");
  return [options]() {
    if (options->device != "cpu" && !options->portable && options->golden.empty())
      throw UsageError("smoke --device " + options->device +
                       ": tests/golden/smoke.json holds the CPU's fp32 bits, which another "
                       "device's kernels do not reproduce; add --portable (one golden for every "
                       "device) or name that device's own --golden");
    if (options->golden.empty())
      options->golden = options->grpo       ? "tests/golden/smoke_grpo.json"
                        : options->portable ? "tests/golden/smoke-portable.json"
                        : options->model != "llama"
                            ? "tests/golden/smoke-" + options->model + ".json"
                        : options->tensor_parallel > 0 ? "tests/golden/smoke-tp.json"
                                                       : "tests/golden/smoke.json";
    return RunSmoke(*options);
  };
}

CommandRegistrar smoke_registrar("smoke",
                                 "bit-exact smoke gate: a fixed run compared with a golden file",
                                 SetupSmoke);

}  // namespace
}  // namespace crucible
