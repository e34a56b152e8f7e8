#include "train/trainer.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "ckpt/hf.h"
#include "ckpt/model_weights.h"
#include "common/error.h"
#include "common/files.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/profile.h"
#include "common/strings.h"
#include "common/timer.h"
#include "data/token_source.h"
#include "distributed/communicator.h"
#include "distributed/data_parallel.h"
#include "distributed/exact_sum.h"
#include "distributed/mesh.h"
#include "distributed/param_access.h"
#include "distributed/sharded_optimizer.h"
#include "kernels/cpu/kernels.h"
#include "model/model.h"
#include "optim/clipping.h"
#include "optim/lr_schedule.h"
#include "train/checkpointing.h"
#include "train/detectors.h"
#include "train/divergence.h"
#include "train/memory_plan.h"
#include "train/mfu.h"
#include "train/rank_agreement.h"
#include "train/run_lock.h"
#include "train/stop_signals.h"
#include "train/validation.h"

namespace crucible {

std::string RunDirectory(const Config& config) {
  const std::string& folder = config.String("job.dump_folder");
  return folder.empty() ? JoinPath("runs", config.String("job.name")) : folder;
}

namespace {

// A JSON-lines log (metrics.jsonl, metrics-rank<r>.jsonl): each line is written and flushed as
// it comes, so a killed run loses at most the line being written. Closed when destroyed.
class JsonLinesFile {
 public:
  JsonLinesFile() = default;
  JsonLinesFile(const JsonLinesFile&) = delete;
  JsonLinesFile& operator=(const JsonLinesFile&) = delete;
  ~JsonLinesFile() { Close(); }

  void Open(const std::string& path, bool append) {
    path_ = path;
    file_ = std::fopen(path.c_str(), append ? "a" : "w");
    if (!file_) ThrowErrno("cannot open " + path);
  }
  bool is_open() const { return file_ != nullptr; }
  void Append(const nlohmann::json& record) {
    const std::string text = record.dump() + "\n";
    if (std::fwrite(text.data(), 1, text.size(), file_) != text.size() || std::fflush(file_) != 0)
      ThrowErrno("cannot write " + path_);
  }
  void Close() {
    if (file_) std::fclose(file_);
    file_ = nullptr;
  }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

// VmHWM of this process, in bytes (0 where /proc is unavailable).
double PeakResidentBytes() {
  if (!FileExists("/proc/self/status")) return 0;
  for (const std::string& line : Split(ReadFile("/proc/self/status"), '\n'))
    if (StartsWith(line, "VmHWM:")) return std::strtod(line.c_str() + 6, nullptr) * 1024.0;
  return 0;
}

// Keeps the metrics.jsonl lines of steps up to `last_step` (a resumed run rewrites the steps
// after its checkpoint), atomically; returns how many lines were kept.
int64_t TruncateMetrics(const std::string& path, int64_t last_step) {
  if (!FileExists(path)) return 0;
  std::string kept;
  int64_t lines = 0;
  for (const std::string& line : Split(ReadFile(path), '\n')) {
    if (line.empty()) continue;
    nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    if (!record.is_object() || !record.contains("step") || !record["step"].is_number_integer())
      continue;  // a line cut by a kill
    if (record["step"].get<int64_t>() > last_step) continue;
    kept += line + "\n";
    ++lines;
  }
  AtomicWriteFile(path, kept);
  return lines;
}

// Rank 0 creates and locks the run directory, before anything in it is written; every rank
// learns whether that worked (and rank 0's exit code), so a refused job stops on every rank
// instead of leaving the others waiting in the next collective.
std::unique_ptr<RunLock> TakeRunDirectory(const std::string& run_dir, Communicator& comm) {
  std::unique_ptr<RunLock> lock;
  int64_t exit_code = 0;
  std::string failure;
  if (comm.rank() == 0) {
    try {
      MakeDirectories(run_dir);
      lock = std::make_unique<RunLock>(run_dir);
    } catch (const Error& e) {
      exit_code = e.exit_code();
      failure = e.what();
    }
  }
  comm.AllReduceInt64(&exit_code, 1, "run-directory lock");  // only rank 0 adds its code
  if (exit_code == 0) return lock;
  if (comm.rank() == 0) throw Error(static_cast<int>(exit_code), failure);
  throw Error(static_cast<int>(exit_code),
              StrFormat("rank %d: stopped: rank 0 could not take the run directory %s (rank 0 "
                        "says why)",
                        comm.rank(), run_dir.c_str()));
}

}  // namespace

int RunTraining(Config config, const std::string& resume_mode) {
  Timer wall;
  EnableKernelProfile(config.Bool("metrics.profile"));
  // Test-only: CRUCIBLE_TEST_PERTURB_KERNEL=rmsnorm moves every RMSNorm output by one ULP, so
  // tests can show that the smoke gate notices a kernel whose rounding changed.
  if (const char* perturb = std::getenv("CRUCIBLE_TEST_PERTURB_KERNEL"))
    kernels::g_perturb_rmsnorm_for_tests = std::string(perturb) == "rmsnorm";
  StopSignals stop_signals;
  // ---- resolve the config ----
  config.Validate();
  const std::shared_ptr<const ModelSpec> model_spec = BuildModelSpec(config);
  OptimizerConfig optimizer_config = BuildOptimizerConfig(config);
  LrScheduleConfig schedule = BuildLrScheduleConfig(config);
  const int64_t steps = config.Int("training.steps");
  const int64_t seq_len = config.Int("training.seq_len");
  const int64_t micro_batch = config.Int("training.local_batch_size");
  // Data parallelism spans every rank of the job: mesh.data_parallel() is mesh.world().
  const std::unique_ptr<ProcessMesh> mesh =
      ProcessMesh::Create(MeshShape{}, config.Float("comm.train_timeout_seconds"));
  Communicator& comm = mesh->world();
  const int world = comm.size();
  const int rank = comm.rank();
  const bool leader = rank == 0;
  if (comm.distributed()) SetLogRank(rank);
  int64_t global_batch = config.Int("training.global_batch_size");
  if (global_batch == 0) global_batch = micro_batch * world;
  if (global_batch % (micro_batch * world) != 0)
    throw UsageError(StrFormat(
        "training.global_batch_size (%lld) must be a positive multiple of local_batch_size x ranks "
        "(%lld x %d)",
        (long long)global_batch, (long long)micro_batch, world));
  config.Set("training.global_batch_size", global_batch);
  CheckRanksAgree(config, resume_mode, comm);  // on the resolved config, before anything else
  const int64_t accumulation = global_batch / (micro_batch * world);
  // Before anything is allocated: an absurd size is a config error, not an out-of-memory.
  CheckTrainingFits(
      config, *model_spec,
      {micro_batch, seq_len, accumulation, static_cast<int>(config.Int("parallelism.zero_stage")),
       config.Bool("parallelism.overlap_grad_reduce") && world > 1},
      comm);
  const int64_t log_freq = config.Int("metrics.log_freq");
  const double max_norm = config.Float("training.max_norm");

  std::unique_ptr<TokenSource> source = MakeTokenSource(config, model_spec->vocab_size());

  // ---- run directory ----
  const std::string run_dir = RunDirectory(config);
  // Held until the last file is written (destroyed after everything that writes in run_dir).
  const std::unique_ptr<RunLock> run_lock = TakeRunDirectory(run_dir, comm);

  // ---- model, buffers, optimizer ----
  const std::unique_ptr<Model> model = model_spec->Build(micro_batch, seq_len);
  const ParameterTable& table = model->table();
  const size_t n_params = table.total();
  // Flat buffers are padded so that ZeRO shards are whole gradient-norm chunks.
  DataParallel data_parallel(mesh->data_parallel(), n_params,
                             static_cast<int>(config.Int("parallelism.zero_stage")));
  const int zero_stage = data_parallel.zero_stage();
  // ZeRO-3: a rank stores only its shard of the weights and gradients; weights[i - base] and
  // grads[i - base] hold parameter i of it. Otherwise base is 0 and the buffers are full.
  const bool sharded = zero_stage == 3;
  const size_t padded = data_parallel.padded_size(), shard = data_parallel.shard_size();
  const size_t base = sharded ? data_parallel.shard_begin() : 0;
  std::vector<float> weights(sharded ? shard : padded), grads(sharded ? shard : padded);
  ExactAccumulator accumulator(sharded ? 0 : padded);
  const size_t update_begin = data_parallel.update_begin(), update_end = data_parallel.update_end();
  // Checkpoints hold the optimizer state of every parameter (optimizer->full_state()): a resume
  // loads it and each rank keeps its part, so a checkpoint resumes on any number of ranks, and
  // before a save rank 0 gathers it. Under ZeRO its buffers exist only while a resume or a save
  // needs them.
  const std::unique_ptr<ShardedOptimizer> optimizer =
      MakeShardedOptimizer(optimizer_config, table, data_parallel);
  Checkpointing checkpointing(config, run_dir, *model_spec, table, &optimizer->full_state(), rank,
                              world);
  // Loading a checkpoint or a model file fills a full buffer; under ZeRO-3 each rank then keeps
  // its shard (a fresh init writes the shard directly).
  const bool loads_full_model = checkpointing.HasCheckpointToResume(resume_mode) ||
                                !config.String("model.init_weights").empty() ||
                                !config.String("checkpoint.initial_load_hf").empty();
  std::vector<float> full_load(sharded && loads_full_model ? padded : 0);
  float* load_target = sharded ? full_load.data() : weights.data();
  const ResumePoint resume = checkpointing.Resume(resume_mode, load_target);
  if (resume.resumed) optimizer->ScatterFullState();
  optimizer->ReleaseFullState();
  // ZeRO-3: rank 0 gathers the full weights when a save, an evaluation or the final hash needs
  // them (every rank must call this; others get nullptr).
  std::vector<float> gathered;
  auto full_weights = [&]() -> const float* {
    if (!sharded) return weights.data();
    if (leader) gathered.resize(padded);
    comm.GatherFloatToRoot(weights.data(), gathered.data(), shard, "parameter gather");
    return leader ? gathered.data() : nullptr;
  };
  auto release_gathered = [&]() { std::vector<float>().swap(gathered); };
  Detectors detectors(config, table, update_begin, update_end);
  DivergenceGuard divergence(table, data_parallel, [&]() -> std::string {
    if (!leader) return "kept by rank 0";  // only rank 0 saves
    if (!checkpointing.enabled()) return "none (checkpoint.enable = false)";
    if (checkpointing.last_saved_step() <= 0) return "none";
    return JoinPath(checkpointing.root(),
                    "step-" + std::to_string(checkpointing.last_saved_step()));
  });
  // After the resume check, so a config that cannot resume does not replace the run's record.
  if (leader) AtomicWriteFile(JoinPath(run_dir, "config.toml"), config.ToToml());
  if (!resume.resumed) {
    const std::string& init_path = config.String("model.init_weights");
    const std::string& hf_path = config.String("checkpoint.initial_load_hf");
    if (!init_path.empty() && !hf_path.empty())
      throw UsageError(
          "model.init_weights and checkpoint.initial_load_hf are both set; choose one");
    if (!hf_path.empty()) {
      ImportHfModel(hf_path, *model_spec, table, load_target);
      PrintLine("phase=initial_load_hf from=" + hf_path);
    } else if (!init_path.empty()) {
      LoadModelWeights(init_path, table, load_target);
    } else if (sharded) {  // a non-empty shard starts at update_begin == base
      model_spec->InitWeights(table, static_cast<uint64_t>(config.Int("debug.seed")), update_begin,
                              update_end, weights.data());
    } else {
      model_spec->InitWeights(table, static_cast<uint64_t>(config.Int("debug.seed")), 0, n_params,
                              load_target);
    }
  }
  if (sharded && !full_load.empty()) {
    std::copy(full_load.begin() + base, full_load.begin() + base + shard, weights.begin());
    std::vector<float>().swap(full_load);
  }

  const bool fresh_model = !resume.resumed && config.String("model.init_weights").empty() &&
                           config.String("checkpoint.initial_load_hf").empty();
  if (detectors.bf16_storage())
    for (size_t i = sharded ? update_begin : 0; i < (sharded ? update_end : n_params); ++i)
      weights[i - base] = RoundToBfloat16(weights[i - base]);
  // Peak of the whole job: every rank measures its own share of the machine at the same time.
  const PeakFlops peak = ResolvePeakFlops(config, comm);
  const double flops_per_token = model_spec->TrainFlopsPerToken(table, seq_len);
  MfuMeter mfu_meter(peak, flops_per_token);
  const int threads = omp_get_max_threads();
  if (leader) {
    PrintLine(StrFormat(
        "phase=start run_dir=%s params=%zu %s seq_len=%lld global_batch=%lld micro_batch=%lld "
        "accumulation=%lld ranks=%d zero_stage=%d threads=%d activations=%s peak_gflops=%.4g "
        "peak_source=%s data=%s",
        run_dir.c_str(), n_params, model_spec->Summary().c_str(), (long long)seq_len,
        (long long)global_batch, (long long)micro_batch, (long long)accumulation, world,
        data_parallel.zero_stage(), threads,
        HumanBytes(static_cast<double>(model->activation_bytes())).c_str(), peak.gflops,
        peak.source.c_str(), source->Describe().c_str()));
  }

  // ---- how the model reaches parameters and gradients ----
  const bool overlap = config.Bool("parallelism.overlap_grad_reduce") && world > 1;
  std::string non_finite_where;  // first tensor with a non-finite gradient in this micro-batch
  auto on_non_finite = [&](int unit, const float* unit_grads) {
    if (non_finite_where.empty())
      non_finite_where =
          detectors.FindNonFinite(unit_grads, table.units()[unit].begin, table.units()[unit].end);
  };
  std::unique_ptr<ReplicatedAccess> replicated;
  std::unique_ptr<ShardedAccess> sharded_access;
  if (sharded)
    sharded_access = std::make_unique<ShardedAccess>(table, data_parallel, weights.data(),
                                                     overlap || world == 1, on_non_finite);
  else
    replicated = std::make_unique<ReplicatedAccess>(
        table, data_parallel, accumulator, weights.data(), grads.data(), overlap, on_non_finite);
  ParameterAccess& access = sharded ? static_cast<ParameterAccess&>(*sharded_access) : *replicated;
  const int64_t consistency_steps = config.Int("parallelism.consistency_check_steps");
  const bool check_consistency = world > 1 && consistency_steps > 0;
  if (sharded_access) sharded_access->EnableHashing(check_consistency);

  if (leader) {
    // Memory per rank (the parameter-sized buffers, from their real sizes; formula in
    // docs/distributed.md): weights and gradients (the full padded buffers, or the shard under
    // ZeRO-3), the exact accumulator (16 bytes per element, the shard's sums under ZeRO-3), the
    // optimizer state of this rank's part, the gather/gradient/reduction buffers of ZeRO-3 or of
    // overlapped ZeRO-1 reductions, and those a whole-matrix optimizer moves pieces through.
    double state_floats = 0;
    for (const ShardState& state : optimizer->LocalState()) state_floats += state.values.size();
    const double buffers =
        (sharded_access
             ? sharded_access->buffer_bytes()
             : (overlap ? static_cast<double>(data_parallel.OverlapBufferBytes()) : 0.0)) +
        static_cast<double>(optimizer->BufferBytes());
    const double weight_bytes = 4.0 * weights.size(), grad_bytes = 4.0 * grads.size();
    const double accumulator_bytes = 16.0 * accumulator.size();
    const double total = weight_bytes + grad_bytes + accumulator_bytes + 4 * state_floats + buffers;
    PrintLine(StrFormat(
        "phase=memory zero_stage=%d weights=%s grads=%s accumulator=%s optimizer_state=%s "
        "comm_buffers=%s model_state_bytes=%.0f activations=%s communicated_per_step=%s "
        "overlap=%s",
        zero_stage, HumanBytes(weight_bytes).c_str(), HumanBytes(grad_bytes).c_str(),
        HumanBytes(accumulator_bytes).c_str(), HumanBytes(4 * state_floats).c_str(),
        HumanBytes(buffers).c_str(), total,
        HumanBytes(static_cast<double>(model->activation_bytes())).c_str(),
        HumanBytes(static_cast<double>(data_parallel.CommunicatedBytesPerStep(accumulation)))
            .c_str(),
        overlap ? "on" : "off"));
  }

  JsonLinesFile metrics, rank_metrics;
  if (leader && config.Bool("metrics.enable_jsonl")) {
    std::string path = JoinPath(run_dir, "metrics.jsonl");
    if (resume.resumed) TruncateMetrics(path, resume.progress.step);
    metrics.Open(path, resume.resumed);
  }

  std::unique_ptr<Validation> validation;
  if (leader) validation = std::make_unique<Validation>(config, model_spec, run_dir);
  const bool validate = data_parallel.Any(leader && validation->enabled());
  if (config.Bool("metrics.per_rank") && world > 1)
    rank_metrics.Open(JoinPath(run_dir, StrFormat("metrics-rank%d.jsonl", rank)), resume.resumed);

  // ---- the loop ----
  // This rank's slice of a step's global batch, read once per step: inputs and targets of
  // `accumulation` micro-batches, one after the other.
  const int64_t N = micro_batch * seq_len;
  std::vector<int32_t> sample(seq_len + 1), inputs(accumulation * N), targets(accumulation * N);
  auto load_slice = [&](int64_t first_sample) {
    for (int64_t b = 0; b < accumulation * micro_batch; ++b) {
      source->Sample(first_sample + b, sample.data());
      std::copy(sample.begin(), sample.begin() + seq_len, inputs.begin() + b * seq_len);
      std::copy(sample.begin() + 1, sample.end(), targets.begin() + b * seq_len);
    }
  };
  double last_loss = resume.resumed ? resume.progress.loss : std::nan("");
  int64_t tokens_seen = resume.progress.tokens_seen;
  Timer train_timer;
  const int64_t corrupt_rank = config.Int("debug.corrupt_rank");
  const int64_t corrupt_step = config.Int("debug.corrupt_step");
  const double fake_loss_divisor = config.Float("debug.fake_loss_divisor");
  const int64_t inject_nan_step = config.Int("debug.inject_nan_step");
  const ParamInfo* inject_nan_tensor =
      inject_nan_step > 0 ? &table.Find(config.String("debug.inject_nan_tensor")) : nullptr;
  for (int64_t step = resume.progress.step + 1; step <= steps; ++step) {
    Timer step_timer;
    mesh->SetStep(step);
    // Replicas must agree before they are used. Checked before the step's forward pass, because
    // under ZeRO-1 the next parameter all-gather would overwrite a corrupted replica (after it
    // had already produced wrong gradients).
    // (ZeRO-3 has no persistent replica: it compares what the ranks gathered, after the step.)
    if (!sharded && check_consistency && step > 1 && (step - 1) % consistency_steps == 0)
      data_parallel.CheckConsistency(weights.data(), n_params, step - 1);
    if (sharded && corrupt_rank == rank && corrupt_step == step)
      sharded_access->CorruptNextGather();  // test only
    // This rank's micro-batches are the consecutive global micro-batches
    // [rank * accumulation, (rank + 1) * accumulation) of the step's global batch.
    const int64_t first = (step - 1) * global_batch + rank * accumulation * micro_batch;
    // Valid-token count of the whole global batch, so every micro-batch's gradient is scaled by
    // the same 1/valid (the loss is the token-weighted mean over the global batch).
    load_slice(first);
    int64_t valid_local = 0;
    for (int32_t t : targets) valid_local += t >= 0 ? 1 : 0;
    const int64_t valid_total = data_parallel.Sum(valid_local);
    if (valid_total == 0)
      throw DataError(
          StrFormat("step %lld: the global batch has no valid target tokens", (long long)step));
    const float loss_scale = 1.0f / static_cast<float>(valid_total);
    std::vector<double> micro_losses(accumulation);
    bool finite = true;
    if (sharded)
      sharded_access->BeginStep();
    else
      accumulator.Zero();
    for (int64_t m = 0; m < accumulation; ++m) {
      if (replicated) replicated->BeginMicroBatch(m + 1 == accumulation);
      const bool inject = inject_nan_tensor && step == inject_nan_step && leader && m == 0;
      const int64_t nan_at = inject ? static_cast<int64_t>(inject_nan_tensor->offset) : -1;
      if (replicated) replicated->SetTestNan(nan_at);
      if (sharded_access) sharded_access->SetTestNan(nan_at);
      // Pre-training weighs every target token 1 (no loss weights).
      micro_losses[m] =
          model->Forward(access, inputs.data() + m * N, targets.data() + m * N, nullptr).loss;
      model->Backward(access, loss_scale);
      if (!non_finite_where.empty()) {
        finite = false;
        LogWarn(StrFormat(
            "step %lld: non-finite gradient in %s (micro-batch %lld); the update "
            "will be skipped",
            (long long)step, non_finite_where.c_str(), (long long)(rank * accumulation + m)));
        non_finite_where.clear();
      }
    }
    finite = !data_parallel.Any(!finite);
    // The gradient reductions still in flight (all of them without overlap): the time this
    // rank waits here is the communication the backward pass did not hide.
    Timer reduce_timer;
    if (sharded)
      sharded_access->FinishStep(grads.data());
    else if (overlap)
      data_parallel.FinishReductions(accumulator, grads.data());
    else
      data_parallel.ReduceGradients(accumulator, grads.data());
    const double reduce_wait_seconds = reduce_timer.Seconds();
    if (sharded && check_consistency && step % consistency_steps == 0)
      data_parallel.CheckConsistentHash(sharded_access->TakeGatheredHash(), step,
                                        "gathered parameters");
    const double loss = data_parallel.OrderedSum(micro_losses) / static_cast<double>(valid_total) /
                        fake_loss_divisor;  // the divisor is a test-only fault
    divergence.CheckLoss(loss, step);
    if (leader && fresh_model && step == 1)
      detectors.CheckFirstLoss(loss, model_spec->vocab_size());
    const double lr = LearningRate(schedule, step);
    double grad_norm = std::sqrt(data_parallel.GradNormSquared(grads.data(), base));
    if (!finite) grad_norm = std::nan("");
    if (!std::isfinite(grad_norm)) {
      if (leader)
        LogWarn(
            StrFormat("step %lld: non-finite gradient norm; skipping the update", (long long)step));
    } else {
      float clip = ClipScale(grad_norm, max_norm);
      if (clip < 1.0f) {
#pragma omp parallel for schedule(static)
        for (int64_t i = static_cast<int64_t>(update_begin); i < static_cast<int64_t>(update_end);
             ++i)
          grads[i - base] *= clip;
      }
      detectors.BeforeUpdate(weights.data(), base);
      optimizer->Step(weights.data(), grads.data(), lr, step, base);
      detectors.AfterUpdate(weights.data(), step, base);
      divergence.CheckWeights(weights.data(), base, update_begin, update_end, step);
      data_parallel.GatherParams(weights.data());
    }
    if (!sharded && corrupt_rank == rank && corrupt_step == step) {
      // Test-only: flip one bit of this rank's replica, as a faulty node would.
      uint32_t bits;
      std::memcpy(&bits, &weights[n_params / 2], 4);
      bits ^= 1u << 3;
      std::memcpy(&weights[n_params / 2], &bits, 4);
    }
    tokens_seen += global_batch * seq_len;
    last_loss = loss;
    const double step_seconds = step_timer.Seconds();
    const double tokens_per_second = static_cast<double>(global_batch * seq_len) / step_seconds;
    const double mfu = leader ? mfu_meter.Percent(tokens_per_second, step) : 0.0;  // rank 0 logs
    if (leader && (step % log_freq == 0 || step == steps)) {
      PrintLine(StrFormat("step=%lld loss=%.6f lr=%.6e grad_norm=%.6f tok/s=%.1f mfu=%.2f",
                          (long long)step, loss, lr, grad_norm, tokens_per_second, mfu));
    }
    if (metrics.is_open()) {
      metrics.Append({{"step", step},
                      {"loss", loss},
                      {"lr", lr},
                      {"grad_norm", std::isfinite(grad_norm) ? nlohmann::json(grad_norm)
                                                             : nlohmann::json(nullptr)},
                      {"tokens", tokens_seen},
                      {"tok_per_s", tokens_per_second},
                      {"mfu", std::isfinite(mfu) ? nlohmann::json(mfu) : nlohmann::json(nullptr)},
                      {"step_seconds", step_seconds},
                      {"reduce_wait_s", reduce_wait_seconds}});
    }
    if (rank_metrics.is_open()) {
      // This rank's own view: its micro-batches' share of the loss and its time.
      double local_loss = 0.0;
      for (double l : micro_losses) local_loss += l;
      rank_metrics.Append({{"step", step},
                           {"rank", rank},
                           {"host", comm.host()},
                           {"local_loss_sum", local_loss},
                           {"local_valid_tokens", valid_local},
                           {"step_seconds", step_seconds},
                           {"reduce_wait_s", reduce_wait_seconds}});
    }
    // ---- evaluation during training (rank 0; the others wait at the barrier) ----
    if (validate && (step % config.Int("validation.freq") == 0 || step == steps)) {
      bool keep_going = true;
      const float* eval_weights = full_weights();
      if (leader) keep_going = validation->Run(step, eval_weights, n_params);
      release_gathered();
      comm.Barrier("validation");
      if (data_parallel.Any(!keep_going))
        throw UsageError(
            StrFormat("stopped by the eval gate at step %lld (validation.gate_action = "
                      "stop); the last checkpoint is kept",
                      (long long)step));
    }
    // ---- checkpoints and stop signals ----
    checkpointing.NoteStepTime(step_seconds);
    checkpointing.Poll();
    TrainingProgress progress{step, step * global_batch, tokens_seen, loss, lr};
    // Every rank must agree to stop at the same step, or the others would wait in a collective.
    int signal_number = StopSignals::Requested();
    if (data_parallel.Any(signal_number != 0)) {
      // And name the same signal: the one the lowest rank that got one received.
      const uint64_t mine = static_cast<uint64_t>(signal_number);
      std::vector<uint64_t> received(world);
      comm.AllGatherU64(&mine, received.data(), 1, "stop-signal all-gather");
      for (auto it = received.rbegin(); it != received.rend(); ++it)
        if (*it != 0) signal_number = static_cast<int>(*it);
    }
    // The leader decides (the "auto" interval depends on its measured save stalls).
    const bool due = data_parallel.Any(leader && checkpointing.Due(step, steps));
    const bool save_now =
        due || (signal_number != 0 && checkpointing.enabled() &&
                data_parallel.Any(leader && checkpointing.last_saved_step() != step));
    const float* save_weights = nullptr;
    if (save_now) {
      optimizer->GatherFullState();
      save_weights = full_weights();
    }
    if (leader && due)
      checkpointing.Save(progress, save_weights, false, step == steps ? "final" : "interval");
    if (signal_number != 0) {
      // 143 only with a complete checkpoint of this step; without one, 75.
      std::string saved = "none";
      int exit_code = kExitStoppedNoCheckpoint;
      if (checkpointing.enabled()) {
        if (leader && checkpointing.last_saved_step() != step)
          checkpointing.Save(progress, save_weights, true, SignalName(signal_number));
        if (leader) checkpointing.Finish();
        saved = JoinPath(checkpointing.root(), "step-" + std::to_string(step));
        exit_code = kExitSignalled;
      } else if (leader) {
        LogWarn("stopped without a checkpoint (checkpoint.enable = false): exit 75");
      }
      // Printed before the barrier, so no rank can exit (and make srun or mpirun end the job)
      // before the line is out; the save is complete by now.
      if (leader)
        PrintLine(StrFormat("stopped step=%lld signal=%s checkpoint=%s exit=%d", (long long)step,
                            SignalName(signal_number), saved.c_str(), exit_code));
      optimizer->ReleaseFullState();
      release_gathered();
      comm.Barrier("stop");
      metrics.Close();
      rank_metrics.Close();
      mesh->Finalize();
      return exit_code;
    }
    if (save_now) {  // rank 0's full copies exist only while a save needs them
      optimizer->ReleaseFullState();
      release_gathered();
    }
  }
  metrics.Close();
  rank_metrics.Close();
  if (leader) checkpointing.Finish();

  const float* final_weights = full_weights();
  const uint64_t weights_hash = leader ? Hash64(final_weights, n_params * sizeof(float)) : 0;
  if (leader && config.Bool("checkpoint.enable")) {
    divergence.CheckFinalWeights(final_weights);
    PrintLine("phase=save path=" + JoinPath(run_dir, "model.safetensors"));
    SaveModelWeights(JoinPath(run_dir, "model.safetensors"), table, *model_spec, final_weights);
  }
  const double train_seconds = train_timer.Seconds();
  // Peak resident memory of every rank (VmHWM), to hold the memory report against reality.
  double peak_rss = PeakResidentBytes();
  std::vector<double> peaks(world);
  comm.AllGatherDouble(&peak_rss, peaks.data(), 1, "peak-memory all-gather");
  if (leader) {
    std::string list;
    for (double p : peaks) {
      if (!list.empty()) list += ',';
      list += StrFormat("%.0f", p);
    }
    PrintLine("phase=memory_peak rss_bytes_per_rank=" + list);
  }
  if (leader && KernelProfileEnabled()) PrintKernelProfile();
  comm.Barrier("end of training");
  mesh->Finalize();
  if (leader)
    PrintLine(StrFormat(
        "done steps=%lld tokens=%lld wall_s=%.2f train_s=%.2f final_loss=%.6f "
        "tok/s=%.1f weights_xxh3=%s",
        (long long)steps, (long long)tokens_seen, wall.Seconds(), train_seconds, last_loss,
        train_seconds > 0 ? tokens_seen / train_seconds : 0.0, HexU64(weights_hash).c_str()));
  return kExitOk;
}

}  // namespace crucible
