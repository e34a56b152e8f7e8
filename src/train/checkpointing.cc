#include "train/checkpointing.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "ckpt/interval.h"
#include "common/error.h"
#include "common/files.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/timer.h"
#include "crucible_version.h"

namespace crucible {
namespace {

// A snapshot of the state is one memory copy per buffer. (A copy split over OpenMP threads was
// measured slower on a loaded 2-core machine; bench/checkpoint_bench.py compares against memcpy.)
void CopyBuffer(float* destination, const float* source, size_t count) {
  if (count > 0) std::memcpy(destination, source, count * sizeof(float));
}

// Sizes `buffer` to `count` zeros backed by transparent huge pages where the kernel allows
// (madvise before the first touch): a snapshot copy then takes far fewer TLB misses.
void AllocateSnapshotBuffer(std::vector<float>* buffer, size_t count) {
  buffer->clear();
  buffer->shrink_to_fit();
  buffer->reserve(count);
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  uintptr_t begin = (reinterpret_cast<uintptr_t>(buffer->data()) + kHuge - 1) & ~(kHuge - 1);
  uintptr_t end = (reinterpret_cast<uintptr_t>(buffer->data() + count)) & ~(kHuge - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
  buffer->assign(count, 0.0f);
}

// The size of an optimizer state buffer that covers every parameter, as checkpoints hold it.
size_t FullStateSize(const StateSpec& spec, const ParameterTable& table) {
  return LayOutFullState(spec, table).size;
}

// Which tensors of the table carry `spec` (ckpt's OptimizerStateValues::carried).
std::vector<bool> CarriedBy(const StateSpec& spec, const ParameterTable& table) {
  std::vector<bool> carried;
  for (const ParamInfo& param : table.params()) carried.push_back(spec.Carries(param));
  return carried;
}

std::string ReadLatest(const std::string& root) {
  std::string path = JoinPath(root, "latest");
  if (!FileExists(path)) return "none";
  try {
    return Trim(ReadConfigFile(path));
  } catch (const Error&) {
    return "unreadable";
  }
}

}  // namespace

Checkpointing::Checkpointing(const Config& config, const std::string& run_dir,
                             const ModelSpec& model, const ParameterTable& table,
                             OptimizerShard* optimizer, const BatchSchedule& batches, int rank,
                             int world_size)
    : config_(config),
      run_dir_(run_dir),
      root_(JoinPath(run_dir, config.String("checkpoint.folder"))),
      model_(model),
      table_(table),
      optimizer_(optimizer),
      batches_(batches),
      rank_(rank),
      world_size_(world_size) {
  enabled_ = config.Bool("checkpoint.enable");
  async_ = config.Bool("checkpoint.async");
  keep_latest_k_ = config.Int("checkpoint.keep_latest_k");
  keep_every_n_ = config.Int("checkpoint.keep_every_n");
  if (config.String("checkpoint.folder").empty())
    throw UsageError("checkpoint.folder: must not be empty (default \"ckpt\")");
  if (keep_latest_k_ < 0)
    throw UsageError("checkpoint.keep_latest_k: must not be negative (0 keeps all)");
  if (keep_every_n_ < 0)
    throw UsageError("checkpoint.keep_every_n: must not be negative (0: none)");
  if (config.HoldsString("checkpoint.interval")) {
    const std::string& interval = config.String("checkpoint.interval");
    if (interval != "auto")
      throw UsageError("checkpoint.interval: expected a number of steps or \"auto\", got \"" +
                       interval + "\"");
    auto_interval_ = true;
    const double mtbf_hours = config.Float("checkpoint.mtbf_hours");
    if (mtbf_hours < 0)
      throw UsageError("checkpoint.mtbf_hours: must not be negative (0: from evidence)");
    MtbfEstimate mtbf = EstimateMtbf(JoinPath(run_dir, "launch/attempts.jsonl"), mtbf_hours);
    mtbf_seconds_ = mtbf.seconds;
    mtbf_source_ = mtbf.source;
    if (mtbf.source == "attempts.jsonl")
      mtbf_source_ += StrFormat("(failures=%lld,observed_h=%.2f)", (long long)mtbf.failures,
                                mtbf.observed_seconds / 3600.0);
  } else {
    interval_steps_ = config.Int("checkpoint.interval");
    if (interval_steps_ < 1)
      throw UsageError("checkpoint.interval: must be at least 1 step, or \"auto\"");
  }
  config_hash_ = HexU64(Hash64(config.ToToml().data(), config.ToToml().size()));
  last_saved_step_ = 0;
  if (enabled_ && async_ && rank_ == 0) {
    // Only rank 0 writes checkpoints. Allocate and touch the host snapshot now, on the writer
    // thread while the run starts, so a save's stall is a warm memory copy and the start is not
    // delayed by the page faults.
    std::vector<size_t> sizes;
    for (const ShardState& state : optimizer_->State()) {
      snapshot_.optimizer_state.push_back(
          {state.spec.name, {}, state.spec.per_tensor, CarriedBy(state.spec, table_)});
      sizes.push_back(FullStateSize(state.spec, table_));
    }
    writer_.Start([this, sizes]() {
      AllocateSnapshotBuffer(&snapshot_.weights, table_.total());
      for (size_t i = 0; i < sizes.size(); ++i)
        AllocateSnapshotBuffer(&snapshot_.optimizer_state[i].values, sizes[i]);
    });
  }
}

Checkpointing::~Checkpointing() {
  try {
    writer_.Wait();
  } catch (const std::exception& e) {
    LogError(e.what());
  }
}

uint64_t Checkpointing::StateBytes() const {
  uint64_t bytes = table_.total() * sizeof(float);
  for (const ShardState& state : optimizer_->State()) bytes += state.values.size() * sizeof(float);
  return bytes;
}

bool Checkpointing::HasCheckpointToResume(const std::string& mode) const {
  if (mode == "none") return false;
  if (mode == "auto")
    return !ListCheckpoints(root_).empty() || FileExists(JoinPath(root_, "latest"));
  return true;
}

ResumePoint Checkpointing::Resume(const std::string& mode, float* weights) {
  ResumePoint point;
  if (mode == "none") {
    if (!ListCheckpoints(root_).empty())
      LogInfo("--resume none: starting at step 0; the checkpoints in " + root_ +
              " stay (a new save of the same step moves the old folder aside)");
    return point;
  }
  auto warn = [](const std::string& line) { LogWarn(line); };
  std::string dir;
  if (mode == "auto") {
    if (ListCheckpoints(root_).empty() && !FileExists(JoinPath(root_, "latest"))) return point;
    PrintLine("phase=resume status=verifying root=" + root_);
    std::optional<std::string> found = FindResumeCheckpoint(root_, warn);
    if (!found) return point;
    dir = *found;
  } else {
    if (!IsDirectory(mode)) throw UsageError("--resume " + mode + ": no such checkpoint folder");
    if (FileExists(JoinPath(mode, "MANIFEST")) || FileExists(JoinPath(mode, "COMPLETE")) ||
        FileExists(JoinPath(mode, "state.json"))) {
      std::string failure = VerifyCheckpoint(mode);
      if (!failure.empty())
        throw DataError("--resume " + mode + ": " + failure +
                        " (an explicit checkpoint does not fall back; use --resume auto)");
      dir = mode;
    } else {  // a folder of checkpoints, or a run directory
      std::string folder = IsDirectory(JoinPath(mode, config_.String("checkpoint.folder")))
                               ? JoinPath(mode, config_.String("checkpoint.folder"))
                               : mode;
      std::optional<std::string> found = FindResumeCheckpoint(folder, warn);
      if (!found) throw UsageError("--resume " + mode + ": holds no checkpoint (step-<n> folders)");
      dir = *found;
    }
  }
  PrintLine("phase=resume status=loading from=" + dir);
  // Under ZeRO the full optimizer state exists only while a resume or a save needs it.
  std::vector<OptimizerStateTarget> targets;
  for (const ShardState& state : optimizer_->State()) {
    if (state.values.empty()) state.values.resize(FullStateSize(state.spec, table_));
    targets.push_back(
        {state.spec.name, &state.values, state.spec.per_tensor, CarriedBy(state.spec, table_)});
  }
  Timer timer;
  const std::string saved_config_path = JoinPath(dir, "config.toml");
  Config saved = Config::Parse(ReadConfigFile(saved_config_path), saved_config_path);
  ConfigChanges changes = CompareResumeConfigs(saved, config_);
  if (!changes.breaking.empty()) {
    std::string keys;
    for (const auto& line : changes.breaking) keys += (keys.empty() ? "" : "; ") + line;
    throw UsageError("cannot resume from " + dir +
                     ": the config changed in keys that break "
                     "resume: " +
                     keys +
                     ". Restore them, or start over with --resume none in "
                     "another job.dump_folder");
  }
  for (const auto& line : changes.harmless) LogInfo("resume: config changed (allowed): " + line);

  nlohmann::json state = LoadCheckpoint(dir, table_, weights, targets, 0);
  auto number = [&](const char* key) -> int64_t {
    if (!state.contains(key) || !state[key].is_number_integer())
      throw DataError(JoinPath(dir, "state.json") + ": missing integer '" + key + "'");
    return state[key].get<int64_t>();
  };
  point.resumed = true;
  point.path = dir;
  point.progress.step = number("step");
  point.progress.consumed_samples = number("consumed_samples");
  point.progress.tokens_seen = number("tokens_seen");
  point.progress.loss = state.value("loss", std::nan(""));
  point.progress.lr = state.value("lr", 0.0);
  point.progress.guards = state.value("guards", nlohmann::json());
  point.progress.step_batches = state.value("step_batches", nlohmann::json());
  const int64_t expected = batches_.SamplesBefore(point.progress.step + 1);
  if (point.progress.consumed_samples != expected)
    throw DataError(StrFormat(
        "%s/state.json: consumed_samples %lld is not the %lld samples of steps 1..%lld (global "
        "batch %lld%s)",
        dir.c_str(), (long long)point.progress.consumed_samples, (long long)expected,
        (long long)point.progress.step, (long long)batches_.GlobalBatch(1),
        batches_.constant() ? "" : ", then training.batch_ramp"));
  if (state.value("world_size", 1) != world_size_)
    LogInfo(StrFormat("resume: the checkpoint was written by %d ranks, this run has %d",
                      state.value("world_size", 1), world_size_));
  last_saved_step_ = point.progress.step;
  PrintLine(StrFormat("phase=resume from=%s step=%lld consumed_samples=%lld load_s=%.3f",
                      dir.c_str(), (long long)point.progress.step,
                      (long long)point.progress.consumed_samples, timer.Seconds()));
  return point;
}

void Checkpointing::NoteStepTime(double seconds) {
  step_seconds_sum_ += seconds;
  ++step_count_;
  if (auto_interval_ && step_count_ == 1) ReviseInterval(false);
}

bool Checkpointing::Due(int64_t step, int64_t last_step) const {
  if (!enabled_) return false;
  if (step == last_step) return true;
  if (auto_interval_) return next_auto_save_ > 0 && step >= next_auto_save_;
  return step % interval_steps_ == 0;
}

void Checkpointing::ReviseInterval(bool after_save) {
  if (!auto_interval_ || step_count_ == 0) return;
  const double step_seconds = step_seconds_sum_ / static_cast<double>(step_count_);
  double cost;
  const char* cost_source;
  if (cost_count_ > 0) {
    cost = cost_sum_ / static_cast<double>(cost_count_);
    cost_source = "measured";
  } else {  // before the first save: a memory copy at ~4 GB/s, or a disk write at ~0.5 GB/s
    cost = static_cast<double>(StateBytes()) / (async_ ? 4e9 : 5e8);
    cost_source = "assumed";
  }
  const double interval_seconds = YoungDalyIntervalSeconds(cost, mtbf_seconds_);
  const int64_t steps = IntervalSteps(interval_seconds, step_seconds);
  const bool changed = steps != interval_steps_;
  interval_steps_ = steps;
  next_auto_save_ = last_saved_step_ + interval_steps_;
  if (changed || !after_save) {
    PrintLine(StrFormat(
        "phase=checkpoint_interval rule=young_daly interval_steps=%lld interval_s=%.6f cost_s=%.6f "
        "cost_source=%s step_s=%.6f mtbf_h=%.6f mtbf_source=%s expected_lost_pct=%.3f "
        "next_save_step=%lld",
        (long long)interval_steps_, interval_seconds, cost, cost_source, step_seconds,
        mtbf_seconds_ / 3600.0, mtbf_source_.c_str(),
        100.0 * ExpectedLostFraction(cost, interval_seconds, mtbf_seconds_),
        (long long)next_auto_save_));
  }
}

void Checkpointing::CopySnapshot(const TrainingProgress& progress, const float* weights) {
  snapshot_.step = progress.step;
  snapshot_.weights.resize(table_.total());
  CopyBuffer(snapshot_.weights.data(), weights, table_.total());
  std::vector<ShardState> state = optimizer_->State();
  snapshot_.optimizer_state.resize(state.size());
  for (size_t i = 0; i < state.size(); ++i) {
    OptimizerStateValues& copy = snapshot_.optimizer_state[i];
    copy.name = state[i].spec.name;
    copy.per_tensor = state[i].spec.per_tensor;
    copy.carried = CarriedBy(state[i].spec, table_);
    copy.values.resize(state[i].values.size());
    CopyBuffer(copy.values.data(), state[i].values.data(), state[i].values.size());
  }
  snapshot_.optimizer_begin = 0;
  snapshot_.config_toml = config_.ToToml();
  const int64_t global_batch = config_.Int("training.global_batch_size");
  snapshot_.state = {
      {"format", "crucible-checkpoint/1"},
      {"step", progress.step},
      {"consumed_samples", progress.consumed_samples},
      {"tokens_seen", progress.tokens_seen},
      {"loss",
       std::isfinite(progress.loss) ? nlohmann::json(progress.loss) : nlohmann::json(nullptr)},
      {"lr", progress.lr},
      {"data_cursor",
       {{"next_sample", progress.consumed_samples},
        {"global_batch_size", global_batch},
        {"dataset", config_.String("training.dataset")},
        {"dataset_path", config_.String("training.dataset_path")},
        {"rule", batches_.constant()
                     ? "step s reads samples [(s-1)*global_batch_size, s*global_batch_size)"
                     : "step s reads the next global batch of its training.batch_ramp stage"}}},
      {"rng",
       {{"generator", "philox4x32-10"},
        {"seed", config_.Int("debug.seed")},
        {"state",
         "counter-based: every draw is keyed by (seed, stream, index); nothing else to save"}}},
      {"lr_schedule",
       {{"position", progress.step},
        {"lr", progress.lr},
        {"decay_type", config_.String("lr_scheduler.decay_type")},
        {"warmup_steps", config_.Int("lr_scheduler.warmup_steps")},
        {"total_steps", config_.Int("training.steps")}}},
      {"optimizer",
       {{"name", optimizer_->config().name},
        {"step", progress.step},
        {"begin", 0},
        {"end", table_.total()}}},
      {"config_hash", config_hash_},
      {"world_size", world_size_},
      {"crucible_version", CRUCIBLE_VERSION}};
  if (!progress.guards.is_null()) snapshot_.state["guards"] = progress.guards;
  if (!progress.step_batches.is_null()) snapshot_.state["step_batches"] = progress.step_batches;
}

void Checkpointing::WriteSnapshot() {
  const int64_t step = snapshot_.step;
  try {
    snapshot_.state["weights_xxh3"] =
        HexU64(Hash64(snapshot_.weights.data(), snapshot_.weights.size() * sizeof(float)));
    SaveStats stats = WriteCheckpoint(root_, snapshot_, table_, model_, PrintLine);
    PrintLine(StrFormat(
        "phase=checkpoint step=%lld status=complete path=%s bytes=%llu write_s=%.3f",
        (long long)step, stats.path.c_str(), (unsigned long long)stats.bytes, stats.seconds));
    for (const auto& removed : PruneCheckpoints(root_, keep_latest_k_, keep_every_n_))
      LogInfo("pruned " + removed + " (checkpoint.keep_latest_k / keep_every_n)");
  } catch (const Error& e) {
    throw Error(e.exit_code(), StrFormat("checkpoint step-%lld was not saved: %s; the previous "
                                         "checkpoint is intact (latest: %s)",
                                         (long long)step, e.what(), ReadLatest(root_).c_str()));
  }
}

void Checkpointing::Save(const TrainingProgress& progress, const float* weights, bool synchronous,
                         const std::string& reason) {
  Timer stall;
  double wait_seconds = 0;
  if (writer_.Busy()) {
    PrintLine(StrFormat("phase=checkpoint step=%lld status=waiting reason=previous_save_running",
                        (long long)progress.step));
    Timer wait;
    writer_.Wait();
    wait_seconds = wait.Seconds();
  }
  writer_.Wait();  // joins a finished save; rethrows its error
  Timer copy;
  CopySnapshot(progress, weights);
  const double copy_seconds = copy.Seconds();
  const bool background = async_ && !synchronous;
  if (background) {
    writer_.Start([this]() { WriteSnapshot(); });
  } else {
    PrintLine(StrFormat("phase=checkpoint step=%lld status=writing mode=sync reason=%s",
                        (long long)progress.step, reason.c_str()));
    WriteSnapshot();
  }
  const double stall_seconds = stall.Seconds();
  PrintLine(
      StrFormat("phase=checkpoint step=%lld mode=%s reason=%s stall_s=%.4f copy_s=%.4f "
                "wait_s=%.4f state_bytes=%llu",
                (long long)progress.step, background ? "async" : "sync", reason.c_str(),
                stall_seconds, copy_seconds, wait_seconds, (unsigned long long)StateBytes()));
  // The same figures, durable in the run directory for `crucible report` (docs/checkpoints.md).
  const std::string record =
      nlohmann::json{{"step", progress.step},      {"mode", background ? "async" : "sync"},
                     {"reason", reason},           {"stall_s", stall_seconds},
                     {"copy_s", copy_seconds},     {"wait_s", wait_seconds},
                     {"state_bytes", StateBytes()}}
          .dump() +
      "\n";
  if (std::FILE* file = std::fopen(JoinPath(run_dir_, "checkpoints.jsonl").c_str(), "a")) {
    std::fputs(record.c_str(), file);
    if (std::fclose(file) != 0) LogWarn("cannot write " + JoinPath(run_dir_, "checkpoints.jsonl"));
  } else {
    LogWarn("cannot open " + JoinPath(run_dir_, "checkpoints.jsonl"));
  }
  last_saved_step_ = progress.step;
  cost_sum_ += stall_seconds;
  ++cost_count_;
  ReviseInterval(true);
}

void Checkpointing::Poll() {
  writer_.Rethrow();
}

void Checkpointing::Finish() {
  if (writer_.Busy()) PrintLine("phase=checkpoint status=waiting reason=finishing_background_save");
  writer_.Wait();
}

}  // namespace crucible
