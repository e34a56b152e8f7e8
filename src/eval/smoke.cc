#include "eval/smoke.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "ckpt/safetensors.h"
#include "common/error.h"
#include "common/files.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/strings.h"

namespace crucible {

std::string SmokeConfig(bool portable, bool tensor_parallel, const std::string& model) {
  std::string config = std::string(R"([job]
name = "smoke"

[model]
flavor = "debug"
vocab_size = 512
dim = 64
n_layers = 2
n_heads = 4
n_kv_heads = 2
ffn_hidden_dim = 160

[training]
steps = 8
seq_len = 64
local_batch_size = 2
global_batch_size = 4
dataset = "synthetic"

[optimizer]
name = "AdamW"
lr = 3e-3

[lr_scheduler]
warmup_steps = 2
decay_type = "cosine"

[checkpoint]
enable = true
interval = 1000

[metrics]
peak_gflops = 1.0

[debug]
seed = 1234
)") + (portable ? "portable_exact = true\n" : "");
  if (model == "deepseek_v3") {
    // The debug flavor's MLA (query compression, partial RoPE) and MoE (8 experts in 2 groups,
    // top-2 from 1 group, a shared expert, the routed scaling factor), at the same width: one
    // dense layer, then a MoE layer; the balance bias moves every step.
    const std::string llama =
        "flavor = \"debug\"\nvocab_size = 512\ndim = 64\nn_layers = 2\n"
        "n_heads = 4\nn_kv_heads = 2\nffn_hidden_dim = 160\n";
    config.replace(config.find(llama), llama.size(),
                   "name = \"deepseek_v3\"\nflavor = \"debug\"\nvocab_size = 512\ndim = 64\n"
                   "n_layers = 2\nn_heads = 4\nffn_hidden_dim = 160\nq_lora_rank = 48\n"
                   "kv_lora_rank = 32\nmoe_intermediate_size = 32\nbias_update_speed = 0.01\n");
    // Four micro-batches a step: the golden holds for 1, 2 and 4 ranks.
    const std::string batch = "global_batch_size = 4\n";
    config.replace(config.find(batch), batch.size(), "global_batch_size = 8\n");
  }
  if (!tensor_parallel) return config;
  // Every split dimension in 4 chunks (heads 4, KV heads 4, FFN 160, vocabulary 512), so that
  // degrees 1, 2 and 4 give the same bits; the default exact reduction (block48), whose blocks
  // start at every chunk of every tensor.
  const std::string kv = "n_kv_heads = 2\n";
  config.replace(config.find(kv), kv.size(), "n_kv_heads = 4\n");
  return config + "\n[parallelism]\ntensor_parallel_chunks = 4\n";
}

std::string SmokeGrpoConfig() {
  // 8 completions a step (2 prompts, the global batch of 8), scored by their JSON line's length mod
  // 7 (a spread of rewards in every group); 4 rollout batches of 2 optimizer steps.
  return R"(
[grpo]
task = "command"
reward_command = "awk '{ print length($0) % 7 }'"
group_size = 4
prompts_per_step = 2
max_new_tokens = 12
iterations = 2
beta = 0.1
loss_type = "grpo"
)";
}

namespace {

// The GRPO smoke's tokenizer text and prompts.
constexpr const char* kGrpoText =
    "What is the sum of the digits of 48213? Finish with a line \"Answer: <integer>\".\n"
    "Answer: 18\n";
constexpr const char* kGrpoPrompts =
    "{\"prompt\": \"What is the sum of the digits of 48213?\"}\n"
    "{\"prompt\": \"What is the sum\"}\n"
    "{\"prompt\": \"Finish with a line\"}\n";
// What the GRPO smoke compares of each step, in this order, after loss and grad_norm.
constexpr const char* kGrpoMetrics[] = {
    "reward_mean", "completion_length",     "grpo_loss", "kl", "entropy",
    "mean_ratio",  "clip_ratio_region_mean"};

std::string Bits(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, 8);
  return HexU64(bits);
}

// Runs argv with extra environment; output to log_path. Returns the exit status.
int RunChild(const std::vector<std::string>& argv, const std::vector<std::string>& env,
             const std::string& log_path) {
  pid_t pid = ::fork();
  if (pid < 0) ThrowErrno("fork");
  if (pid == 0) {
    int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
    std::_Exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string SelfPath() {
  std::vector<char> buffer(4096);
  ssize_t n = ::readlink("/proc/self/exe", buffer.data(), buffer.size() - 1);
  if (n <= 0) ThrowErrno("readlink /proc/self/exe");
  return std::string(buffer.data(), n);
}

nlohmann::ordered_json Observe(const std::string& run_dir, bool grpo) {
  nlohmann::ordered_json result;
  result["steps"] = nlohmann::ordered_json::array();
  std::string metrics = ReadFile(JoinPath(run_dir, "metrics.jsonl"));
  for (const std::string& line : Split(metrics, '\n')) {
    if (Trim(line).empty()) continue;
    nlohmann::json record = nlohmann::json::parse(line);
    double loss = record["loss"].get<double>();
    double grad_norm =
        record["grad_norm"].is_null() ? std::nan("") : record["grad_norm"].get<double>();
    result["steps"].push_back({{"step", record["step"].get<int64_t>()},
                               {"loss", loss},
                               {"loss_bits", Bits(loss)},
                               {"grad_norm", grad_norm},
                               {"grad_norm_bits", Bits(grad_norm)}});
    if (!grpo) continue;
    nlohmann::ordered_json& step = result["steps"].back();
    for (const char* key : kGrpoMetrics) {
      const double value = record.value(key, std::nan(""));
      step[key] = value;
      step[std::string(key) + "_bits"] = Bits(value);
    }
  }
  SafetensorsReader weights(JoinPath(run_dir, "model.safetensors"));
  result["tensors"] = nlohmann::ordered_json::object();
  std::vector<float> buffer;
  for (const auto& t : weights.tensors()) {
    buffer.resize(t.numel());
    weights.ReadFloat32(t.name, t.shape, buffer.data());
    result["tensors"][t.name] = HexU64(Hash64(buffer.data(), buffer.size() * sizeof(float)));
  }
  return result;
}

}  // namespace

int RunSmoke(const SmokeOptions& options) {
  // The golden is read before the run, so a wrong --golden fails at once.
  std::string golden_text;
  if (!options.update) {
    if (!FileExists(options.golden))
      throw UsageError(options.golden + ": golden file not found (create it with crucible smoke " +
                       (options.portable ? "--portable " : "") + "--update)");
    golden_text = ReadConfigFile(options.golden);
  }
  std::string work = options.work_dir;
  bool temporary = work.empty();
  if (temporary) {
    char pattern[] = "/tmp/crucible-smoke-XXXXXX";
    if (!::mkdtemp(pattern)) ThrowErrno("mkdtemp");
    work = pattern;
  }
  MakeDirectories(work);
  const std::string config_path = JoinPath(work, "smoke.toml");
  const std::string run_dir = JoinPath(work, "run");
  if (options.tensor_parallel > 0 && options.ranks % options.tensor_parallel != 0)
    throw UsageError(StrFormat("smoke --tp %d: --ranks %d is not a multiple of it",
                               options.tensor_parallel, options.ranks));
  if (options.tensor_parallel > 0 && options.portable)
    throw UsageError(
        "smoke --tp with --portable: the portable kernels have no tensor-parallel "
        "version yet");
  if (options.expert_parallel > 0 && options.model != "deepseek_v3")
    throw UsageError("smoke --ep: only --model deepseek_v3 has experts to split");
  if (options.expert_parallel > 0 && options.ranks % options.expert_parallel != 0)
    throw UsageError(StrFormat("smoke --ep %d: --ranks %d is not a multiple of it",
                               options.expert_parallel, options.ranks));
  if (options.model != "llama" && options.model != "deepseek_v3")
    throw UsageError("smoke --model '" + options.model + "': expected llama or deepseek_v3");
  if (options.grpo && (options.model != "llama" || options.tensor_parallel > 0 ||
                       options.expert_parallel > 0 || options.portable))
    throw UsageError(
        "smoke --grpo: runs the default llama config only (no --model, --tp, --ep or "
        "--portable)");
  if (options.model != "llama" && (options.tensor_parallel > 0 || options.portable))
    throw UsageError("smoke --model " + options.model + ": the family has no " +
                     (options.portable ? "portable kernels" : "tensor parallelism") + " yet");
  std::string config = SmokeConfig(options.portable, options.tensor_parallel > 0, options.model);
  if (options.grpo) {  // 8 completions a step: 2 per rank at 4 ranks
    const std::string batch = "global_batch_size = 4\n";
    config.replace(config.find(batch), batch.size(), "global_batch_size = 8\n");
    config += SmokeGrpoConfig();
  }
  AtomicWriteFile(config_path, config);
  const std::string binary = options.binary.empty() ? SelfPath() : options.binary;
  // Pin OpenBLAS and oneDNN to one kernel family each so the golden holds on any x86-64-v3 CPU
  // (with oneDNN at AVX2, the products take the AVX2 row of kernels/cpu/gemm_library.h's table,
  // what an AVX2-only machine runs), and fix the thread count (results do not depend on it, but the
  // run should be the same run). CRUCIBLE_SMOKE_THREADS overrides the count (tests run the portable
  // gate on 1 and 2 threads).
  const char* threads = std::getenv("CRUCIBLE_SMOKE_THREADS");
  std::vector<std::string> env = {"OPENBLAS_CORETYPE=Haswell", "DNNL_MAX_CPU_ISA=AVX2",
                                  std::string("OMP_NUM_THREADS=") + (threads             ? threads
                                                                     : options.ranks > 1 ? "1"
                                                                                         : "2")};
  std::vector<std::string> argv;
  if (options.ranks > 1) {
    env.push_back("OMPI_ALLOW_RUN_AS_ROOT=1");
    env.push_back("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1");
    argv = {"mpirun", "--oversubscribe",   "-np", std::to_string(options.ranks),
            "-x",     "OPENBLAS_CORETYPE", "-x",  "DNNL_MAX_CPU_ISA",
            "-x",     "OMP_NUM_THREADS"};
    if (std::getenv("CRUCIBLE_TEST_PERTURB_KERNEL")) {
      argv.push_back("-x");
      argv.push_back("CRUCIBLE_TEST_PERTURB_KERNEL");
    }
  }
  for (const std::string& a :
       {binary, std::string(options.grpo ? "grpo" : "train"), std::string("--config"), config_path,
        std::string("--set"), "job.dump_folder=" + run_dir, std::string("--resume"),
        std::string("none")})
    argv.push_back(a);
  if (options.grpo) {
    // A BPE tokenizer trained on a fixed text (the trainer is deterministic), and the prompts.
    const std::string text = JoinPath(work, "grpo_text.txt");
    std::string repeated;
    for (int i = 0; i < 20; ++i) repeated += kGrpoText;
    AtomicWriteFile(text, repeated);
    AtomicWriteFile(JoinPath(work, "prompts.jsonl"), kGrpoPrompts);
    const std::string tokenizer = JoinPath(work, "tokenizer.json");
    const int made = RunChild({binary, "tokenizer", "train", text, "-o", tokenizer, "--vocab-size",
                               "300", "--min-frequency", "1"},
                              env, JoinPath(work, "tokenizer.log"));
    if (made != 0)
      throw Error(kExitFailure,
                  StrFormat("smoke --grpo: training its tokenizer failed with exit %d; see %s",
                            made, JoinPath(work, "tokenizer.log").c_str()));
    for (const std::string& item :
         {"model.tokenizer_path=" + tokenizer, "grpo.prompts=" + JoinPath(work, "prompts.jsonl")}) {
      argv.push_back("--set");
      argv.push_back(item);
    }
  }
  if (options.device != "cpu") {
    argv.push_back("--set");
    argv.push_back("training.device=" + options.device);
  }
  if (options.tensor_parallel > 0) {
    argv.push_back("--set");
    argv.push_back(StrFormat("parallelism.tensor_parallel_degree=%d", options.tensor_parallel));
  }
  if (options.expert_parallel > 0) {
    argv.push_back("--set");
    argv.push_back(StrFormat("parallelism.expert_parallel_degree=%d", options.expert_parallel));
  }
  for (const std::string& item : options.sets) {
    argv.push_back("--set");
    argv.push_back(item);
  }
  const std::string log_path = JoinPath(work, "train.log");
  std::string degrees;
  if (options.tensor_parallel > 0)
    degrees += StrFormat(" tensor_parallel=%d", options.tensor_parallel);
  if (options.expert_parallel > 0)
    degrees += StrFormat(" expert_parallel=%d", options.expert_parallel);
  PrintLine(StrFormat("phase=smoke status=training ranks=%d%s device=%s log=%s", options.ranks,
                      degrees.c_str(), options.device.c_str(), log_path.c_str()));
  int status = RunChild(argv, env, log_path);
  if (status != 0) {
    // The run's own error line when it has one (mpirun adds its banners after it), else the last.
    const std::string prefix = "crucible: error: ";
    std::string last_line, error_line;
    for (const std::string& line : Split(ReadFile(log_path), '\n')) {
      if (!Trim(line).empty()) last_line = line;
      if (StartsWith(line, prefix)) error_line = line;
    }
    if (!error_line.empty()) last_line = error_line;
    // The run refusing its configuration (a device this build or this machine cannot run) is
    // the smoke's usage error, not a difference: said once, without the run's own prefix.
    if (status == kExitUsage)
      throw UsageError(
          "smoke: " +
          (StartsWith(last_line, prefix) ? last_line.substr(prefix.size()) : last_line) +
          " (the run's log: " + log_path + ")");
    throw Error(kExitFailure, StrFormat("smoke: the training run failed with exit %d (%s); see %s",
                                        status, last_line.c_str(), log_path.c_str()));
  }
  nlohmann::ordered_json observed = Observe(run_dir, options.grpo);
  int result = 0;
  if (options.update) {
    nlohmann::ordered_json golden;
    golden["about"] =
        options.grpo ? "crucible smoke --grpo golden file: regenerate only with `crucible smoke "
                       "--grpo --update`"
        : options.portable
            ? "crucible smoke --portable golden file (one for every device): regenerate only with "
              "`crucible smoke --portable --update`"
            : "crucible smoke golden file: regenerate only with `crucible smoke --update`";
    golden["config"] = config;
    golden["steps"] = observed["steps"];
    golden["tensors"] = observed["tensors"];
    MakeDirectories(ParentDirectory(options.golden));
    AtomicWriteFile(options.golden, golden.dump(2) + "\n");
    PrintLine("smoke: golden written to " + options.golden);
  } else {
    nlohmann::json golden;
    try {
      golden = nlohmann::json::parse(golden_text);
    } catch (const nlohmann::json::exception& e) {
      throw DataError(options.golden + ": not valid JSON: " + e.what());
    }
    if (golden.value("config", "") != config)
      PrintLine("smoke: note: the golden was made with a different smoke config");
    const auto& want_steps = golden["steps"];
    const auto& got_steps = observed["steps"];
    for (size_t i = 0; i < std::max(want_steps.size(), got_steps.size()) && result == 0; ++i) {
      if (i >= want_steps.size() || i >= got_steps.size()) {
        PrintLine(StrFormat("smoke: FAIL step count differs: %zu steps, golden has %zu",
                            got_steps.size(), want_steps.size()));
        result = 1;
        break;
      }
      std::vector<std::string> keys = {"loss", "grad_norm"};
      if (options.grpo) keys.insert(keys.end(), std::begin(kGrpoMetrics), std::end(kGrpoMetrics));
      for (const std::string& name : keys) {
        const char* key = name.c_str();
        std::string bits_key = name + "_bits";
        if (want_steps[i][bits_key] != got_steps[i][bits_key]) {
          PrintLine(StrFormat(
              "smoke: FAIL first difference at step %lld: %s %.17g (bits %s), golden %.17g (bits "
              "%s)",
              (long long)got_steps[i]["step"].get<int64_t>(), key, got_steps[i][key].get<double>(),
              got_steps[i][bits_key].get<std::string>().c_str(), want_steps[i][key].get<double>(),
              want_steps[i][bits_key].get<std::string>().c_str()));
          result = 1;
          break;
        }
      }
    }
    for (const auto& [name, hash] : golden["tensors"].items()) {
      if (!observed["tensors"].contains(name)) {
        PrintLine("smoke: FAIL tensor " + name + " is missing");
        result = 1;
        break;
      }
      if (observed["tensors"][name] != hash) {
        PrintLine(StrFormat("smoke: FAIL first differing tensor: %s (xxh3 %s, golden %s)",
                            name.c_str(), observed["tensors"][name].get<std::string>().c_str(),
                            hash.get<std::string>().c_str()));
        result = 1;
        break;
      }
    }
    if (result == 0)
      PrintLine(StrFormat(
          "smoke: PASS %zu steps and %zu tensors bit-identical to %s (ranks=%d%s device=%s)",
          got_steps.size(), observed["tensors"].size(), options.golden.c_str(), options.ranks,
          options.tensor_parallel > 0
              ? StrFormat(" tensor_parallel=%d", options.tensor_parallel).c_str()
              : "",
          options.device.c_str()));
  }
  if (temporary) {
    std::error_code error;
    std::filesystem::remove_all(work, error);
    if (error) LogWarn("smoke: could not remove " + work + ": " + error.message());
  }
  return result;
}

}  // namespace crucible
