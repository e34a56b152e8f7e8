// The bit-exact smoke gate: a fixed small training run whose per-step loss and gradient-norm
// bit patterns and final per-tensor weight hashes must equal a stored golden file. Any change
// in any kernel's rounding, in data order or in the optimizer shows up as a difference; the gate
// names the first differing step and tensor.
#pragma once

#include <string>
#include <vector>

namespace crucible {

struct SmokeOptions {
  std::string golden;    // tests/golden/smoke.json
  int ranks = 1;         // 1, or more through mpirun (the golden is the same for any count)
  bool update = false;   // rewrite the golden instead of comparing
  std::string work_dir;  // where the run goes; empty: a temporary folder, removed after
  std::string binary;    // the crucible binary to run; empty: this one
  // Run with debug.portable_exact = true (compute/portable/): the same bits on every device,
  // compared with its own golden (tests/golden/smoke-portable.json).
  bool portable = false;
  // training.device of the run ("cpu", "cuda"): the config (and so the golden) stays the same;
  // the device is passed as --set training.device. Only --portable promises one golden for
  // every device.
  std::string device = "cpu";
  // Tensor parallelism (docs/parallelism.md): 0 runs the default config; N >= 1 runs the
  // tensor-parallel smoke config (split dimensions in 4 chunks, the layout-free exact reduction)
  // at tensor_parallel_degree N, against its own golden (tests/golden/smoke-tp.json), the same
  // for every degree and rank count. `ranks` must be a multiple of it.
  int tensor_parallel = 0;
  // N > 0: the deepseek_v3 smoke with its experts split over N ranks (expert_parallel_degree N),
  // against the family's golden: the same bits at every degree.
  int expert_parallel = 0;
  // The model family of the run: "llama" (the default config) or "deepseek_v3" (its own smoke
  // config: a dense layer then a MoE layer with grouped routing, a shared expert and the balance
  // bias, against tests/golden/smoke-deepseek_v3.json).
  std::string model = "llama";
  // The GRPO smoke (docs/post-training.md, "GRPO loop"): `crucible grpo` on the default smoke
  // config with a [grpo] table (a reward command, iterations 2, beta 0.1) and a BPE tokenizer
  // trained first on a fixed text; its per-step GRPO metrics are compared bit for bit too,
  // against tests/golden/smoke_grpo.json, the same for 1, 2 and 4 ranks. Catches a cross-rank
  // reduction switched from SUM to AVG (debug.grpo_average_reduction) at 2 ranks or more.
  bool grpo = false;
  // More --set overrides for the run (test-only switches such as debug.fake_loss_divisor).
  std::vector<std::string> sets;
};

// Returns 0 when the run matches the golden (or it was updated), 1 on a mismatch. A missing
// golden is a UsageError before the run; so is the run's own exit 2 (a device this build or
// machine cannot run), with the run's message.
int RunSmoke(const SmokeOptions& options);

// The fixed configuration of the smoke run (TOML); `portable` adds debug.portable_exact = true,
// `tensor_parallel` the tensor-parallel smoke's keys (4 KV heads, 4 chunks, the default block48);
// `model` "deepseek_v3" replaces the [model] table with the MoE family's.
std::string SmokeConfig(bool portable = false, bool tensor_parallel = false,
                        const std::string& model = "llama");

// The [grpo] table the GRPO smoke appends to SmokeConfig() (model.tokenizer_path and
// grpo.prompts are set on the command line: the golden's config holds no path).
std::string SmokeGrpoConfig();

}  // namespace crucible
