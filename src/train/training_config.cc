#include "train/training_config.h"

#include <cmath>
#include <cstdlib>

#include "common/error.h"
#include "common/strings.h"
#include "data/token_source.h"
#include "launch/environment.h"
#include "launch/rank_environment.h"

namespace crucible {

namespace {

// A whole non-negative number: all of `text` (and nothing else).
bool ParseCount(const std::string& text, int64_t* value) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) return false;
  char* end = nullptr;
  *value = std::strtoll(text.c_str(), &end, 10);
  return *end == '\0' && *value >= 0 && *value < (int64_t{1} << 53);
}

// [training] batch_ramp: entries "<batch>@<start>", in order. <batch> is "<n>x" (n times
// global_batch_size) or "<n>" (samples); <start> is a step, or "<n>tokens" (the first step that
// begins with at least n tokens consumed).
BatchSchedule BuildBatchRamp(const Config& config, const TrainingConfig& t) {
  std::vector<BatchStage> stages{{1, t.global_batch}};
  const int64_t unit = t.shape.micro_batch * t.world;
  for (const std::string& entry : config.StringList("training.batch_ramp")) {
    auto fail = [&](const std::string& why) {
      return UsageError(
          StrFormat("training.batch_ramp: stage \"%s\": %s", entry.c_str(), why.c_str()));
    };
    const size_t at = entry.find('@');
    if (at == std::string::npos)
      throw fail("expected <batch>@<start>, e.g. \"4x@100\" or \"64@20000tokens\"");
    std::string batch_text = entry.substr(0, at), start_text = entry.substr(at + 1);
    const bool multiple = EndsWith(batch_text, "x");
    const bool tokens = EndsWith(start_text, "tokens");
    if (multiple) batch_text.pop_back();
    if (tokens) start_text.resize(start_text.size() - 6);
    int64_t batch = 0, start = 0;
    if (!ParseCount(batch_text, &batch) || batch < 1 || !ParseCount(start_text, &start))
      throw fail("expected <batch>@<start>, e.g. \"4x@100\" or \"64@20000tokens\"");
    if (multiple) batch *= t.global_batch;
    const BatchStage& last = stages.back();
    if (batch <= last.global_batch)
      throw fail(StrFormat("its global batch %lld does not grow from the stage before (%lld)",
                           (long long)batch, (long long)last.global_batch));
    if (batch % unit != 0)
      throw fail(
          StrFormat("its global batch %lld is not a multiple of local_batch_size x ranks "
                    "(%lld x %d)",
                    (long long)batch, (long long)t.shape.micro_batch, t.world));
    int64_t first_step = start;
    if (tokens) {  // the first step after the last stage's start that begins at >= start tokens
      const int64_t before = BatchSchedule(stages).SamplesBefore(last.first_step) * t.shape.seq_len;
      const int64_t per_step = last.global_batch * t.shape.seq_len;
      first_step = start <= before ? last.first_step
                                   : last.first_step + (start - before + per_step - 1) / per_step;
    }
    if (first_step <= last.first_step)
      throw fail(
          StrFormat("it starts at step %lld, not after the stage before (step %lld): "
                    "stages must be in order",
                    (long long)first_step, (long long)last.first_step));
    stages.push_back({first_step, batch});
  }
  return BatchSchedule(std::move(stages));
}

RampLrRule BuildRampLr(const Config& config, bool ramped) {
  const std::string& rule = config.String("training.batch_ramp_lr");
  if (rule != "constant" && !ramped)
    throw UsageError("training.batch_ramp_lr = \"" + rule +
                     "\" needs a training.batch_ramp (the global batch never changes)");
  if (rule == "constant") return RampLrRule::kConstant;
  if (rule == "linear") return RampLrRule::kLinear;
  if (rule == "sqrt") return RampLrRule::kSqrt;
  throw UsageError("training.batch_ramp_lr must be constant, linear or sqrt, not \"" + rule + "\"");
}

GuardConfig BuildGuards(const Config& config) {
  GuardConfig g;
  g.max_consecutive_skips = config.Int("training.max_consecutive_skips");
  const std::string& metric = config.String("training.spike_skip");
  if (metric == "loss")
    g.spike_metric = SpikeMetric::kLoss;
  else if (metric == "grad_norm")
    g.spike_metric = SpikeMetric::kGradNorm;
  else if (metric != "off")
    throw UsageError("training.spike_skip must be off, loss or grad_norm, not \"" + metric + "\"");
  g.spike_window = config.Int("training.spike_window");
  g.spike_warmup = config.Int("training.spike_warmup");
  g.spike_k = config.Float("training.spike_k");
  g.spike_limit = config.Int("training.spike_limit");
  if (g.spike_warmup > g.spike_window)
    throw UsageError(StrFormat(
        "training.spike_warmup (%lld) must not exceed training.spike_window (%lld): the window "
        "could never arm",
        (long long)g.spike_warmup, (long long)g.spike_window));
  g.grad_norm_rise_warn = config.Float("training.grad_norm_rise_warn");
  if (g.grad_norm_rise_warn != 0 && g.grad_norm_rise_warn <= 1)
    throw UsageError(StrFormat("training.grad_norm_rise_warn must be 0 (off) or above 1, not %g",
                               g.grad_norm_rise_warn));
  for (const std::string& item : Split(config.String("debug.skip_steps"), ',')) {
    int64_t step = 0;
    if (Trim(item).empty()) continue;
    if (!ParseCount(std::string(Trim(item)), &step) || step < 1)
      throw UsageError("debug.skip_steps: \"" + item +
                       "\" is not a step number (a comma-separated list of steps >= 1)");
    g.skip_steps.push_back(step);
  }
  return g;
}

}  // namespace

// [training] device and mixed precision. The GPU of a rank is its local rank: LOCAL_RANK (what
// `crucible launch` and torchrun set), else what the MPI launcher says.
BackendOptions BuildBackendOptions(const Config& config) {
  BackendOptions options;
  options.device = config.String("training.device");
  options.portable_exact = config.Bool("debug.portable_exact");
  options.share_gpu = config.Bool("debug.share_gpu");
  const std::string param = config.String("training.mixed_precision_param");
  if (param == "bfloat16")
    options.compute = ComputePrecision::kBfloat16;
  else if (param != "float32")
    throw UsageError("training.mixed_precision_param: expected float32 or bfloat16, got '" + param +
                     "'");
  options.bf16_path = config.String("debug.bf16_path");
  if (options.bf16_path != "auto" && options.bf16_path != "emulated" &&
      options.bf16_path != "native" && options.bf16_path != "avx512_bf16" &&
      options.bf16_path != "amx")
    throw UsageError("debug.bf16_path: expected auto, emulated, native, avx512_bf16 or amx, got '" +
                     options.bf16_path + "'");
  options.gemm_library = config.String("debug.gemm_library");
  if (options.gemm_library != "auto" && options.gemm_library != "openblas" &&
      options.gemm_library != "onednn")
    throw UsageError("debug.gemm_library: expected auto, openblas or onednn, got '" +
                     options.gemm_library + "'");
  const std::string reduce = config.String("training.mixed_precision_reduce");
  if (reduce != "float32")
    throw UsageError("training.mixed_precision_reduce: expected float32, got '" + reduce +
                     "' (gradients are reduced as exact sums of float32 values)");
  const Environment env = CurrentEnvironment();
  const auto local = env.find("LOCAL_RANK");
  options.local_rank = local != env.end() ? std::atoi(local->second.c_str())
                                          : RankIdentityFromEnvironment(env, "").local_rank;
  return options;
}

double TrainingConfig::LrFactor(int64_t step) const {
  const double ratio =
      static_cast<double>(batches.GlobalBatch(step)) / static_cast<double>(global_batch);
  switch (ramp_lr) {
    case RampLrRule::kLinear:
      return ratio;
    case RampLrRule::kSqrt:
      return std::sqrt(ratio);
    case RampLrRule::kConstant:
      break;
  }
  return 1.0;
}

TrainingConfig BuildTrainingConfig(Config& config, int world) {
  TrainingConfig t;
  t.world = world;
  t.steps = config.Int("training.steps");
  t.shape.seq_len = config.Int("training.seq_len");
  t.shape.micro_batch = config.Int("training.local_batch_size");
  t.global_batch = config.Int("training.global_batch_size");
  if (t.global_batch == 0) t.global_batch = t.shape.micro_batch * world;
  if (t.global_batch % (t.shape.micro_batch * world) != 0)
    throw UsageError(StrFormat(
        "training.global_batch_size (%lld) must be a positive multiple of local_batch_size x ranks "
        "(%lld x %d)",
        (long long)t.global_batch, (long long)t.shape.micro_batch, world));
  config.Set("training.global_batch_size", t.global_batch);
  t.shape.accumulation = t.global_batch / (t.shape.micro_batch * world);
  t.batches = BuildBatchRamp(config, t);
  t.stages = ResolvedDataStages(config, t.batches, t.shape.seq_len);
  if (!t.stages.empty()) {
    CheckStagedDataset(config, t.stages);
    const int64_t total = TotalStageSteps(t.stages);
    if (config.IsSet("training.steps") && t.steps != total) {
      std::string lengths;
      for (const DataStage& stage : t.stages)
        lengths += StrFormat("%s%s %lld", lengths.empty() ? "" : " + ", stage.name.c_str(),
                             (long long)stage.steps);
      throw UsageError(StrFormat(
          "%straining.steps = %lld but the stages of [[data.stages]] add up to %lld steps (%s): "
          "remove training.steps (the stages set it) or make them agree",
          config.Origin("training.steps").empty()
              ? ""
              : (config.Origin("training.steps") + ": ").c_str(),
          (long long)t.steps, (long long)total, lengths.c_str()));
    }
    t.steps = total;
    config.Set("training.steps", total);
  }
  t.ramp_lr = BuildRampLr(config, !t.batches.constant());
  t.guards = BuildGuards(config);
  t.shape.zero_stage = static_cast<int>(config.Int("parallelism.zero_stage"));
  t.shape.overlap = config.Bool("parallelism.overlap_grad_reduce") && world > 1;
  t.shape.exact_grid =
      ExactGrid::Parse(config.String("parallelism.exact_reduction"), "parallelism.exact_reduction");
  t.max_norm = config.Float("training.max_norm");
  t.log_freq = config.Int("metrics.log_freq");
  t.consistency_check_steps = config.Int("parallelism.consistency_check_steps");
  t.validation_freq = config.Int("validation.freq");
  t.seed = static_cast<uint64_t>(config.Int("debug.seed"));
  t.backend = BuildBackendOptions(config);
  t.metrics_jsonl = config.Bool("metrics.enable_jsonl");
  t.metrics_per_rank = config.Bool("metrics.per_rank");
  if (config.Bool("metrics.enable_tensorboard")) {
    t.tensorboard_folder = config.String("metrics.save_tb_folder");
    if (t.tensorboard_folder.empty())
      throw UsageError(
          "metrics.save_tb_folder is empty: name the folder for the TensorBoard event files "
          "(relative to the run directory, or absolute), or set metrics.enable_tensorboard = "
          "false");
  }
  t.profile = config.Bool("metrics.profile");
  t.checkpoint_enable = config.Bool("checkpoint.enable");
  t.init_weights = config.String("model.init_weights");
  t.initial_load_hf = config.String("checkpoint.initial_load_hf");
  return t;
}

}  // namespace crucible
