#include "train/trainer.h"

#include <omp.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>

#include "ckpt/hf.h"
#include "ckpt/model_weights.h"
#include "common/error.h"
#include "common/files.h"
#include "common/hash.h"
#include "common/host_math.h"
#include "common/log.h"
#include "common/profile.h"
#include "common/strings.h"
#include "distributed/layout_free_norm.h"
#include "launch/hostlist.h"
#include "optim/clipping.h"
#include "sft/sft_source.h"
#include "train/memory_plan.h"
#include "train/metrics_log.h"
#include "train/rank_agreement.h"
#include "train/sampled_targets.h"
#include "train/stage_eval.h"
#include "train/stages.h"
#include "train/step_hooks.h"

namespace crucible {

std::string RunDirectory(const Config& config) {
  const std::string& folder = config.String("job.dump_folder");
  if (!folder.empty()) return folder;
  const std::string& name = config.String("job.name");
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
    throw UsageError(
        (config.Origin("job.name").empty() ? "" : config.Origin("job.name") + ": ") +
        "job.name = \"" + name + "\"" +
        " is not a folder name (it names runs/<job.name>: no '/', not '.' or '..', not empty); "
        "set job.dump_folder to put the run directory elsewhere");
  return JoinPath("runs", name);
}

namespace {

// Whether two paths name one existing file.
bool SameFile(const std::string& a, const std::string& b) {
  struct stat first, second;
  return ::stat(a.c_str(), &first) == 0 && ::stat(b.c_str(), &second) == 0 &&
         first.st_dev == second.st_dev && first.st_ino == second.st_ino;
}

// Rank 0 creates and locks the run directory, and the checkpoint folder where checkpoints are
// on (it may lie outside the run directory), before anything in them is written; every rank
// learns whether that worked (and rank 0's exit code), so a refused job stops on every rank
// instead of leaving the others waiting in the next collective.
std::vector<std::unique_ptr<RunLock>> TakeRunDirectory(const std::string& run_dir,
                                                       const Config& config, Communicator& comm) {
  std::vector<std::unique_ptr<RunLock>> locks;
  int64_t exit_code = 0;
  std::string failure;
  if (comm.rank() == 0) {
    try {
      MakeDirectories(run_dir);
      locks.push_back(std::make_unique<RunLock>(run_dir));
      const std::string checkpoints = JoinPath(run_dir, config.String("checkpoint.folder"));
      if (config.Bool("checkpoint.enable")) {
        MakeDirectories(checkpoints);
        // checkpoint.folder = "." is the run directory itself, locked already.
        if (!SameFile(JoinPath(checkpoints, "train.lock"), locks.front()->path()))
          locks.push_back(std::make_unique<RunLock>(checkpoints, "checkpoint.folder"));
      }
    } catch (const Error& e) {
      exit_code = e.exit_code();
      failure = e.what();
    }
  }
  comm.AllReduceInt64(&exit_code, 1, "run-directory lock");  // only rank 0 adds its code
  if (exit_code == 0) return locks;
  if (comm.rank() == 0) throw Error(static_cast<int>(exit_code), failure);
  throw Error(static_cast<int>(exit_code),
              StrFormat("rank %d: stopped: rank 0 could not take the run directory %s (rank 0 "
                        "says why)",
                        comm.rank(), run_dir.c_str()));
}

// training.batch_ramp_lr's value.
const char* RampLrName(RampLrRule rule) {
  return rule == RampLrRule::kLinear ? "linear" : rule == RampLrRule::kSqrt ? "sqrt" : "constant";
}

// " batch_ramp=4@1,16@3,32@5 batch_ramp_lr=sqrt" (steps), or "" without a ramp.
std::string DescribeRamp(const TrainingConfig& training) {
  if (training.batches.constant()) return "";
  std::string stages;
  for (const BatchStage& stage : training.batches.stages())
    stages += StrFormat("%s%lld@%lld", stages.empty() ? "" : ",", (long long)stage.global_batch,
                        (long long)stage.first_step);
  return StrFormat(" batch_ramp=%s batch_ramp_lr=%s", stages.c_str(), RampLrName(training.ramp_lr));
}

void FreeBuffer(std::vector<float>& buffer) {
  std::vector<float>().swap(buffer);
}

// An optimizer state over a tensor- or expert-parallel rank's parts (laid out by LayOutFullState
// over `parts`) to or from the same state over the whole model's tensors. A per-tensor state
// (Muon's diagnostics; whole-matrix optimizers are refused under tensor parallelism) only of
// tensors held whole (an expert-parallel rank's).
void CopyStateParts(const StateSpec& spec, const ParameterTable& parts, float* part_values,
                    const ParameterTable& whole, float* whole_values, bool to_whole) {
  const FullStateLayout mine = LayOutFullState(spec, parts), all = LayOutFullState(spec, whole);
  ForEachPartRun(parts, whole, [&](size_t t, size_t w, size_t part, size_t at, size_t n) {
    if (mine.offsets[t] == FullStateLayout::kNotCarried) return;
    if (spec.per_tensor > 0) {
      if (parts.params()[t].sliced())
        throw Error(kExitFailure, "internal: a per-tensor optimizer state of a tensor's part");
      n = spec.per_tensor;
    }
    float* a = part_values + mine.offsets[t] + part;
    float* b = whole_values + all.offsets[w] + at;
    if (to_whole)
      std::copy(a, a + n, b);
    else
      std::copy(b, b + n, a);
  });
}

}  // namespace

// ---- setup ----

Trainer::Trainer(Config config, const std::string& resume_mode, std::unique_ptr<TokenSource> source,
                 bool whole_logits)
    : config_(std::move(config)), source_(std::move(source)) {
  ResolveConfig(resume_mode, whole_logits);
  // The schedule's (with stages, their policies' segments), scaled by the batch ramp's LR rule.
  learning_rate_ = [this](int64_t step) {
    const double scheduled = lr_segments_.empty() ? LearningRate(schedule_, step)
                                                  : SegmentedLearningRate(lr_segments_, step);
    return scheduled * training_.LrFactor(step);
  };
  AllocateState();
  LoadOrInitWeights(resume_mode);
  Announce();
  ConnectModel();
  faults_ = std::make_unique<FaultInjector>(config_, table(), rank_, resume_.resumed);
  auto metrics =
      std::make_unique<MetricsLog>(training_, run_dir_, rank_, comm().host(),
                                   resume_.resumed ? resume_.progress.step : -1, config_.ToToml());
  TensorBoardWriter* tensorboard = metrics->tensorboard();
  hooks_.push_back(std::move(metrics));
  hooks_.push_back(MakeValidationHook(*this, model_spec_, tensorboard));
  hooks_.push_back(MakeCheckpointHook(*this));
  hooks_.push_back(MakeStageEvalHook(*this, model_spec_));
  // The ranks of a tensor-parallel group read the same samples: those of their data-parallel
  // rank (with expert parallelism, their place among the data-parallel x expert-parallel ranks).
  loader_ =
      std::make_unique<DataLoader>(*source_, training_.shape.seq_len, training_.batches, data_rank_,
                                   data_size_, resume_.progress.step + 1, training_.steps);
  tokens_seen_ = resume_.progress.tokens_seen;
  last_loss_ = resume_.resumed ? resume_.progress.loss : std::nan("");
}

Trainer::~Trainer() = default;

// The config, checked on every rank and across ranks, before anything is allocated.
void Trainer::ResolveConfig(const std::string& resume_mode, bool whole_logits) {
  config_.Validate();
  EnableKernelProfile(config_.Bool("metrics.profile"));
  model_spec_ = BuildModelSpec(config_);
  optimizer_config_ = BuildOptimizerConfig(config_);
  // Tensor parallelism over consecutive ranks (one node), data parallelism over the rest.
  const int64_t tp = config_.Int("parallelism.tensor_parallel_degree");
  const int64_t chunks = config_.Int("parallelism.tensor_parallel_chunks");
  // Expert parallelism over consecutive ranks of each data-parallel group.
  const int64_t ep = config_.Int("parallelism.expert_parallel_degree");
  MeshShape shape;
  shape.tensor_parallel = static_cast<int>(tp);
  shape.expert_parallel = static_cast<int>(ep);
  try {
    mesh_ = ProcessMesh::Create(shape, config_.Float("comm.train_timeout_seconds"));
  } catch (const Error& e) {
    if (e.exit_code() != kExitUsage) throw;
    if (ep > 1)
      throw UsageError(StrFormat(
          "parallelism.expert_parallel_degree = %lld does not divide the ranks (%s): run a "
          "multiple of %lld ranks, or choose a degree that divides the ranks / "
          "parallelism.tensor_parallel_degree = %lld",
          (long long)ep, e.what(), (long long)(ep * tp), (long long)tp));
    throw UsageError(
        StrFormat("parallelism.tensor_parallel_degree = %lld: %s (the data-parallel "
                  "degree is the ranks / the tensor-parallel degree)",
                  (long long)tp, e.what()));
  }
  world_ = comm().size();
  rank_ = comm().rank();
  // SFT's template, detected from a tokenizer_config.json when not named, is written into the
  // run's config: export and generate --chat read it there.
  if (config_.String("training.dataset") == "sft" && config_.String("sft.chat_template").empty()) {
    std::string source;
    config_.Set("sft.chat_template", ResolveSftChatTemplate(config_, &source));
    if (rank_ == 0)
      PrintLine("phase=sft_template detected=" + config_.String("sft.chat_template") +
                " from=" + source);
  }
  if (comm().distributed()) SetLogRank(rank_);
  dp_size_ = mesh_->data_parallel().size();
  dp_rank_ = mesh_->data_parallel().rank();
  // The ranks of different micro-batches: the data-parallel ranks (replicas) times the
  // expert-parallel ranks (consecutive in the rank order, so world order when tp = 1).
  data_size_ = dp_size_ * mesh_->expert_parallel().size();
  data_rank_ = dp_rank_ * mesh_->expert_parallel().size() + mesh_->expert_parallel().rank();
  if (ep > 1 && tp > 1)
    throw UsageError(
        StrFormat("parallelism.expert_parallel_degree = %lld with "
                  "tensor_parallel_degree = %lld: the two together are not supported "
                  "yet (set one of them to 1)",
                  (long long)ep, (long long)tp));
  parallelism_ = ModelParallelism::TensorParallel(mesh_->tensor_parallel(),
                                                  static_cast<int>(chunks ? chunks : tp));
  parallelism_.traffic = &tp_traffic_;
  parallelism_ = parallelism_.WithExperts(mesh_->expert_parallel());
  parallelism_.expert_traffic = &ep_traffic_;
  parallelism_.sequence_parallel = config_.Bool("parallelism.sequence_parallel");
  CheckTensorParallelism();
  training_ = BuildTrainingConfig(config_, data_size_);
  training_.shape.whole_logits = whole_logits;
  // After the stages set training.steps.
  schedule_ = BuildLrScheduleConfig(config_);
  if (!training_.stages.empty()) lr_segments_ = StageLrSegments(schedule_, training_.stages);
  dump_gradients_step_ = config_.Int("debug.dump_gradients_step");
  if (dump_gradients_step_ > 0 && world_ != 1)
    throw UsageError(
        StrFormat("debug.dump_gradients_step: writes one rank's whole gradient; this "
                  "run has %d ranks: run it on one",
                  world_));
  backend_ = MakeBackend(training_.backend);  // a device this machine lacks fails here
  // Before the model is built: weight init, the RoPE tables, the schedule and the optimizer.
  SetPortableHostMath(training_.backend.portable_exact);
  if (parallelism_.tp_chunks > 1) CheckTensorParallelRun();
  // SophiaG's Hessian is scaled by the tokens of a global batch, fixed for the run.
  if (optimizer_config_.optimizer->hessian_interval() > 0 && !training_.batches.constant())
    throw UsageError("training.batch_ramp: optimizer.name = " + optimizer_config_.name +
                     " scales its Hessian estimate by a fixed batch size; a batch ramp with it is "
                     "not supported yet (remove training.batch_ramp or choose another optimizer)");
  optimizer_config_.batch_tokens = static_cast<double>(training_.tokens_per_step(1));
  // The batch ramp's LR rule scales the schedule's LR stage by stage: the decay must fit there too.
  for (const BatchStage& stage : training_.batches.stages())
    if (const double factor = training_.LrFactor(stage.first_step); factor != 1)
      CheckDecayBelowOne(
          optimizer_config_, schedule_.lr, factor,
          StrFormat("training.batch_ramp: the stage from step %lld (global batch %lld, "
                    "batch_ramp_lr = %s: %g x the LR): ",
                    (long long)stage.first_step, (long long)stage.global_batch,
                    RampLrName(training_.ramp_lr), factor));
  CheckRanksAgree(config_, resume_mode, comm());  // on the resolved config, before anything else
  // Before anything is allocated: an absurd size is a config error, not an out-of-memory.
  const std::vector<std::string> hosts =
      CheckTrainingFits(config_, *model_spec_, training_, comm(), *backend_, parallelism_);
  if (leader()) WarnOfTensorParallelGroupsAcrossHosts(hosts);
  CheckDeviceFits(*model_spec_, training_.shape, *backend_,
                  /*whole_logits=*/training_.shape.whole_logits ||
                      optimizer_config_.optimizer->hessian_interval() > 0);
  // After the memory check: the table of an absurd config (model.n_layers = 1e8) would itself not
  // fit in memory.
  CheckOptimizerFitsTable(optimizer_config_, model_spec_->BuildTable(),
                          config_.String("model.name") + " " + config_.String("model.flavor"));
  if (!source_)
    source_ = MakeTokenSource(config_, model_spec_->vocab_size(), training_.shape.seq_len,
                              training_.steps, training_.batches);
  run_dir_ = RunDirectory(config_);
  run_locks_ = TakeRunDirectory(run_dir_, config_, comm());
}

// The model, the flat buffers of this rank's part, the optimizer and the checkpoints.
void Trainer::AllocateState() {
  model_ = model_spec_->Build(training_.shape.micro_batch, training_.shape.seq_len, backend_,
                              parallelism_);
  // The whole model's table: what checkpoints, exports, validation and the weights hash see.
  whole_table_ = model_spec_->BuildTable();
  const size_t n_params = table().total();
  // Flat buffers are padded so that ZeRO shards are whole gradient-norm chunks.
  data_parallel_ = std::make_unique<DataParallel>(
      mesh_->data_parallel(), n_params, training_.shape.zero_stage, training_.shape.exact_grid);
  if (parallelism_.ep_degree > 1) {
    // Every tensor but the experts' is held by every rank of an expert group: its gradient sums
    // over the group first. The losses and flags over every rank (tp = 1: the world).
    std::vector<Range> shared;
    for (const ParamInfo& p : table().params()) {
      if (p.expert >= 0 || p.numel == 0) continue;
      if (!shared.empty() && shared.back().end == p.offset)
        shared.back().end = p.offset + p.numel;
      else
        shared.push_back({p.offset, p.offset + p.numel});
    }
    data_parallel_->SetExpertParallel(comm(), mesh_->expert_parallel(), std::move(shared));
  }
  sharded_ = data_parallel_->zero_stage() == 3;
  const size_t padded = data_parallel_->padded_size(), shard = data_parallel_->shard_size();
  base_ = sharded_ ? data_parallel_->shard_begin() : 0;
  weights_.resize(sharded_ ? shard : padded);
  grads_.resize(sharded_ ? shard : padded);
  // One rank and one micro-batch in every step: one contribution per gradient, rounded in place
  // (exact_sum.h), with no 128-bit sums (16 bytes a parameter) to keep, fill and convert.
  const ExactGrid grid = training_.shape.exact_grid;
  accumulator_ = std::make_unique<ExactAccumulator>(
      !sharded_ && world_ == 1 && training_.max_accumulation() == 1
          ? ExactAccumulator::InPlace(grid)
          : ExactAccumulator(sharded_ ? 0 : padded, grid));
  update_begin_ = data_parallel_->update_begin();
  update_end_ = data_parallel_->update_end();
  // Checkpoints hold the optimizer state of every parameter (optimizer_->full_state()): a resume
  // loads it and each rank keeps its part, so a checkpoint resumes on any number of ranks, and
  // before a save rank 0 gathers it. Under ZeRO its buffers exist only while a resume or a save
  // needs them.
  optimizer_ = MakeShardedOptimizer(optimizer_config_, table(), *data_parallel_);
  optimizer_->CountSharedTensorMetrics(parallelism_.ep_rank == 0);
  if (optimizer_config_.optimizer->hessian_interval() > 0)
    sampled_targets_.resize(training_.shape.micro_batch * training_.shape.seq_len);
  // A tensor-parallel run's checkpoints hold the whole model's tensors and optimizer state, so
  // that they resume at any degree: the parts are put together on rank 0 for a save and taken
  // apart on every rank after a resume (its buffers exist only then).
  if (table().partial()) {
    whole_state_ =
        std::make_unique<OptimizerShard>(optimizer_config_, whole_table_, 0, whole_table_.total());
    for (const ShardState& state : whole_state_->State()) FreeBuffer(state.values);
  }
  checkpointing_ =
      std::make_unique<Checkpointing>(config_, run_dir_, *model_spec_, whole_table_,
                                      whole_state_ ? whole_state_.get() : &optimizer_->full_state(),
                                      training_.batches, rank_, world_);
  detectors_ = std::make_unique<Detectors>(config_, table(), update_begin_, update_end_);
  expert_loads_ = std::make_unique<ExpertLoadMeter>(
      config_.Bool("debug.detectors") ? config_.Int("debug.dead_expert_steps") : 0, leader());
  for (const ParamInfo& p : table().params()) {
    if (p.kind != ParamKind::kBalanceBias) continue;
    const size_t b = std::max(update_begin_, p.offset),
                 e = std::min(update_end_, p.offset + p.numel);
    if (b < e) balance_ranges_.emplace_back(b, e);
  }
  divergence_ = std::make_unique<DivergenceGuard>(
      table(), comm(), [this](int64_t step) { return LastCheckpoint(step); });
  guard_ = std::make_unique<StepGuard>(training_.guards, leader(),
                                       [this](int64_t step) { return LastCheckpoint(step); });
}

void Trainer::CheckTensorParallelism() {
  const std::string keys =
      StrFormat("parallelism.tensor_parallel_degree = %d, tensor_parallel_chunks = %d",
                parallelism_.tp_degree, parallelism_.tp_chunks);
  if (std::string why = model_spec_->CheckParallelism(parallelism_); !why.empty())
    throw UsageError(why.rfind("parallelism.", 0) == 0 ? why : keys + ": " + why);
  if (parallelism_.ep_degree > 1 && config_.String("training.device") != "cpu")
    throw UsageError(
        StrFormat("parallelism.expert_parallel_degree = %d runs on training.device = "
                  "\"cpu\" only so far (set the degree to 1)",
                  parallelism_.ep_degree));
  const int64_t seq_len = config_.Int("training.seq_len");
  if (parallelism_.sequence_parallel && seq_len % parallelism_.tp_chunks != 0)
    throw UsageError(StrFormat(
        "parallelism.sequence_parallel = true: training.seq_len = %lld does not divide into the "
        "%d tensor-parallel chunks (%s): set a seq_len that is a multiple of %d, or turn "
        "sequence parallelism off",
        (long long)seq_len, parallelism_.tp_chunks, keys.c_str(), parallelism_.tp_chunks));
}

// What a run with its split dimensions in chunks does not support yet, each refused in one line.
void Trainer::CheckTensorParallelRun() {
  const std::string keys =
      StrFormat("parallelism.tensor_parallel_degree = %d, tensor_parallel_chunks = %d",
                parallelism_.tp_degree, parallelism_.tp_chunks);
  if (training_.backend.device != "cpu")
    throw UsageError(keys + ": tensor parallelism runs on training.device = \"cpu\" only so far");
  if (training_.backend.portable_exact)
    throw UsageError(keys +
                     ": debug.portable_exact has no portable tensor-parallel kernels yet (set "
                     "debug.portable_exact = false)");
  const Optimizer& optimizer = *optimizer_config_.optimizer;
  if (optimizer.shard_mode() != ShardMode::kElementwise || optimizer.hessian_interval() > 0)
    throw UsageError(keys + ": optimizer.name = " + optimizer_config_.name +
                     " needs whole matrices or the whole logits, which a tensor-parallel rank "
                     "does not hold; choose an elementwise optimizer (AdamW, SGD, Lion)");
}

std::string Trainer::LastCheckpoint(int64_t trouble_step) const {
  if (!leader()) return "kept by rank 0";  // only rank 0 saves
  if (!checkpointing_->enabled()) return "none (checkpoint.enable = false)";
  const int64_t last = checkpointing_->last_saved_step();
  if (last <= 0) return "none";
  const std::string path = JoinPath(checkpointing_->root(), CheckpointDirName(last));
  if (trouble_step != last + 1) return path;
  // The trouble began at the first step from that checkpoint's state (a resume replays it).
  const std::string before = NewestCheckpointBefore(checkpointing_->root(), last);
  return StrFormat("%s (not %s: the trouble began at step %lld, the first step from its state)",
                   before.empty() ? "none kept from before it" : before.c_str(), path.c_str(),
                   (long long)trouble_step);
}

// A checkpoint to resume, else the configured initial weights (a file, a Hugging Face folder,
// or the model's seeded init).
void Trainer::LoadOrInitWeights(const std::string& resume_mode) {
  // Loading a checkpoint or a model file fills a full buffer; under ZeRO-3 each rank then keeps
  // its shard (a fresh init writes the shard directly).
  const bool loads_full_model = checkpointing_->HasCheckpointToResume(resume_mode) ||
                                !training_.init_weights.empty() ||
                                !training_.initial_load_hf.empty();
  std::vector<float> full_load(sharded_ && loads_full_model ? data_parallel_->padded_size() : 0);
  float* load_target = sharded_ ? full_load.data() : weights_.data();
  // A checkpoint holds the whole model; a tensor-parallel rank keeps its parts of it.
  const bool parts = table().partial();
  std::vector<float> whole(parts && loads_full_model ? whole_table_.total() : 0);
  resume_ = checkpointing_->Resume(resume_mode, parts ? whole.data() : load_target);
  if (resume_.resumed && parts) {
    CopyWholeToParts(whole_table_, whole.data(), table(), load_target);
    std::vector<ShardState> mine = optimizer_->full_state().State();
    std::vector<ShardState> all = whole_state_->State();
    for (size_t i = 0; i < mine.size(); ++i) {
      mine[i].values.resize(LayOutFullState(mine[i].spec, table()).size);
      CopyStateParts(mine[i].spec, table(), mine[i].values.data(), whole_table_,
                     all[i].values.data(), /*to_whole=*/false);
      FreeBuffer(all[i].values);
    }
  }
  FreeBuffer(whole);
  if (resume_.resumed) optimizer_->ScatterFullState();  // this rank keeps its part
  if (resume_.resumed) guard_->Restore(resume_.progress.guards);
  ReleaseFullCopies();
  // After the resume check, so a config that cannot resume does not replace the run's record.
  if (leader()) AtomicWriteFile(JoinPath(run_dir_, "config.toml"), config_.ToToml());
  if (!resume_.resumed) InitWeights(load_target);
  if (sharded_ && !full_load.empty())
    std::copy(full_load.begin() + base_, full_load.begin() + base_ + weights_.size(),
              weights_.begin());
  fresh_model_ =
      !resume_.resumed && training_.init_weights.empty() && training_.initial_load_hf.empty();
  if (detectors_->bf16_storage())
    for (size_t i = sharded_ ? update_begin_ : 0; i < (sharded_ ? update_end_ : table().total());
         ++i)
      weights_[i - base_] = RoundToBfloat16(weights_[i - base_]);
}

void Trainer::InitWeights(float* load_target) {
  const std::string& init_path = training_.init_weights;
  const std::string& hf_path = training_.initial_load_hf;
  if (!init_path.empty() && !hf_path.empty())
    throw UsageError("model.init_weights and checkpoint.initial_load_hf are both set; choose one");
  // A file holds the whole model; a tensor-parallel rank keeps its parts of it.
  const bool parts = table().partial();
  std::vector<float> whole(parts && (!hf_path.empty() || !init_path.empty()) ? whole_table_.total()
                                                                             : 0);
  float* target = parts ? whole.data() : load_target;
  if (!hf_path.empty()) {
    ImportHfModel(hf_path, *model_spec_, whole_table_, target);
    if (parts) CopyWholeToParts(whole_table_, whole.data(), table(), load_target);
    if (leader()) PrintLine("phase=initial_load_hf from=" + hf_path);
  } else if (!init_path.empty()) {
    LoadModelWeights(init_path, whole_table_, target);
    if (parts) CopyWholeToParts(whole_table_, whole.data(), table(), load_target);
  } else if (sharded_) {  // a non-empty shard starts at update_begin == base
    model_spec_->InitWeights(table(), training_.seed, update_begin_, update_end_, weights_.data());
  } else {
    model_spec_->InitWeights(table(), training_.seed, 0, table().total(), load_target);
  }
}

// The phase=start line, with the peak the MFU is measured against.
void Trainer::Announce() {
  // Peak of the whole job: every rank measures its own share of the machine at the same time.
  const PeakFlops peak = ResolvePeakFlops(
      config_, comm(),
      ModelGemmShapes(table(), training_.shape.micro_batch * training_.shape.seq_len), *backend_);
  mfu_meter_ = std::make_unique<MfuMeter>(
      peak, model_spec_->TrainFlopsPerToken(table(), training_.shape.seq_len));
  if (!leader()) return;
  // A Hessian interval this run never reaches leaves the estimate at its start (0 for SophiaG).
  const int64_t interval = optimizer_config_.optimizer->hessian_interval();
  const int64_t first_step = resume_.progress.step + 1;
  if (interval > 0 && first_step <= training_.steps &&
      training_.steps / interval * interval < first_step)
    LogWarn(
        StrFormat("optimizer.name = %s estimates its Hessian every %lld steps, but steps %lld "
                  "to %lld (training.steps = %lld) hold no multiple of %lld: it is never "
                  "estimated in this run; lower the interval or raise training.steps",
                  optimizer_config_.name.c_str(), (long long)interval, (long long)first_step,
                  (long long)training_.steps, (long long)training_.steps, (long long)interval));
  const TrainingShape& s = training_.shape;
  PrintLine(StrFormat(
      "phase=start run_dir=%s params=%zu %s seq_len=%lld global_batch=%lld micro_batch=%lld "
      "accumulation=%lld ranks=%d zero_stage=%d %s threads=%d activations=%s peak_gflops=%.4g "
      "peak_source=%s data=%s%s%s",
      run_dir_.c_str(), table().total(), model_spec_->Summary().c_str(), (long long)s.seq_len,
      (long long)training_.global_batch, (long long)s.micro_batch, (long long)s.accumulation,
      world_, data_parallel_->zero_stage(), backend_->Summary().c_str(), omp_get_max_threads(),
      HumanBytes(static_cast<double>(model_->activation_bytes())).c_str(), peak.gflops,
      peak.source.c_str(), source_->Describe().c_str(), DescribeRamp(training_).c_str(),
      DescribeStages(training_.stages).c_str()));
  if (parallelism_.tp_chunks > 1)
    PrintLine(
        StrFormat("phase=tensor_parallel degree=%d chunks=%d data_parallel=%d "
                  "sequence_parallel=%s",
                  parallelism_.tp_degree, parallelism_.tp_chunks, dp_size_,
                  parallelism_.sequence_parallel ? "on" : "off"));
  if (parallelism_.ep_degree > 1)
    PrintLine(
        StrFormat("phase=expert_parallel degree=%d replicas=%d parameters_per_rank=%zu "
                  "parameters=%zu",
                  parallelism_.ep_degree, dp_size_, table().total(), whole_table_.total()));
}

// The launcher warns before the job (crucible launch --tp); this is the job's own check, for
// any launcher, from the host of every rank (`hosts`): a group's exchanges sit on the critical
// path of every layer, so a group over more than one host pays the network in every layer.
void Trainer::WarnOfTensorParallelGroupsAcrossHosts(const std::vector<std::string>& hosts) {
  if (!parallelism_.distributed()) return;
  for (const ConsecutiveGroup& group : ConsecutiveGroups(hosts, parallelism_.tp_degree)) {
    if (group.hosts.size() < 2) continue;
    LogWarn(StrFormat(
        "tensor_parallel group: job ranks %d-%d spans %zu hosts (%s): its exchanges run in every "
        "layer, on the critical path, over the network; keep each group on one host (ranks per "
        "host a multiple of parallelism.tensor_parallel_degree = %d, consecutive ranks on a host)",
        group.first, group.last, group.hosts.size(), JoinHosts(group.hosts, ", ").c_str(),
        parallelism_.tp_degree));
  }
}

// How the model reaches parameters and gradients, and the phase=memory line of what that costs.
void Trainer::ConnectModel() {
  const bool overlap = training_.shape.overlap;
  auto on_non_finite = [this](int /*unit*/, size_t begin, size_t end, const float* values) {
    if (non_finite_where_.empty())
      non_finite_where_ = detectors_->FindNonFinite(values, begin, end);
  };
  if (sharded_) {
    auto sharded = std::make_unique<ShardedAccess>(table(), *data_parallel_, weights_.data(),
                                                   overlap || world_ == 1, on_non_finite);
    sharded->EnableHashing(training_.check_consistency());
    access_ = std::move(sharded);
  } else {
    access_ =
        std::make_unique<ReplicatedAccess>(table(), *data_parallel_, *accumulator_, weights_.data(),
                                           grads_.data(), overlap, on_non_finite);
  }
  if (!leader()) return;
  // Memory per rank (the parameter-sized buffers, from their real sizes; formula in
  // docs/distributed.md): weights and gradients (the full padded buffers, or the shard under
  // ZeRO-3), the exact accumulator (16 bytes per element, the shard's sums under ZeRO-3), the
  // optimizer state of this rank's part, the gather/gradient/reduction buffers of ZeRO-3 or of
  // overlapped ZeRO-1 reductions, and those a whole-matrix optimizer moves pieces through.
  double state_floats = 0;
  for (const ShardState& state : optimizer_->LocalState()) state_floats += state.values.size();
  const double buffers =
      static_cast<double>(access_->buffer_bytes()) + static_cast<double>(optimizer_->BufferBytes());
  const double weight_bytes = 4.0 * weights_.size(), grad_bytes = 4.0 * grads_.size();
  const double accumulator_bytes = 16.0 * accumulator_->size();
  const double total = weight_bytes + grad_bytes + accumulator_bytes + 4 * state_floats + buffers;
  // Bytes sent per rank per step, beside an fp32 ring all-reduce's minimum (docs/distributed.md).
  const double communicated =
      static_cast<double>(data_parallel_->CommunicatedBytesPerStep(training_.shape.accumulation));
  const double fp32_ring = static_cast<double>(data_parallel_->Fp32RingBytesPerStep());
  // What sequence parallelism saves: this rank's activations against the same layout's without
  // it (the model's own plan, which equals what the model allocates).
  std::string sequence_parallel;
  if (parallelism_.sequence_parallel) {
    ModelParallelism without = parallelism_;
    without.sequence_parallel = false;
    const double mine = static_cast<double>(model_->activation_bytes());
    const double plain = model_spec_
                             ->PlannedBuffers(static_cast<double>(training_.shape.micro_batch),
                                              static_cast<double>(training_.shape.seq_len), without)
                             .activation_bytes;
    sequence_parallel = StrFormat(
        " sequence_parallel=on activation_bytes=%.0f activations_without_sequence_parallel=%s "
        "activations_saved=%s activations_saved_bytes=%.0f",
        mine, HumanBytes(plain).c_str(), HumanBytes(plain - mine).c_str(), plain - mine);
  }
  PrintLine(StrFormat(
      "phase=memory zero_stage=%d weights=%s grads=%s accumulator=%s optimizer_state=%s "
      "optimizer_state_bytes=%.0f comm_buffers=%s model_state_bytes=%.0f activations=%s "
      "communicated_per_step=%s fp32_ring_per_step=%s vs_fp32_ring=%.2f exact_reduction=%s "
      "overlap=%s%s",
      data_parallel_->zero_stage(), HumanBytes(weight_bytes).c_str(),
      HumanBytes(grad_bytes).c_str(), HumanBytes(accumulator_bytes).c_str(),
      HumanBytes(4 * state_floats).c_str(), 4 * state_floats, HumanBytes(buffers).c_str(), total,
      HumanBytes(static_cast<double>(model_->activation_bytes())).c_str(),
      HumanBytes(communicated).c_str(), HumanBytes(fp32_ring).c_str(),
      fp32_ring > 0 ? communicated / fp32_ring : 0.0, training_.shape.exact_grid.name(),
      overlap ? "on" : "off", sequence_parallel.c_str()));
}

// ---- full copies for saves and evaluation ----

const float* Trainer::FullWeights() {
  // This rank's whole table of parts: the buffer itself, or gathered from the data-parallel
  // shards under ZeRO-3 (on the group's rank 0).
  const float* mine = weights_.data();
  if (sharded_) {
    Communicator& dp = data_parallel_->comm();
    if (dp.rank() == 0) gathered_.resize(data_parallel_->padded_size());
    dp.GatherFloatToRoot(weights_.data(), gathered_.data(), data_parallel_->shard_size(),
                         "parameter gather");
    mine = dp.rank() == 0 ? gathered_.data() : nullptr;
  }
  if (!table().partial()) return leader() ? mine : nullptr;
  // Tensor or expert parallelism: every group of data-parallel rank 0 gathers its ranks' parts
  // on its rank 0 (rank 0 of the job's is the job's), which puts the whole tensors together.
  // The ranks' tables have the same size.
  Communicator& group = PartsGroup();
  std::vector<float> all(dp_rank_ == 0 && group.rank() == 0 ? table().total() * group.size() : 0);
  if (dp_rank_ == 0)
    group.GatherFloatToRoot(mine, all.data(), table().total(), "model-parallel parameter gather");
  if (!leader()) return nullptr;
  whole_.assign(whole_table_.total(), 0.0f);
  for (int r = 0; r < group.size(); ++r)
    CopyPartsToWhole(model_spec_->BuildTable(PartsLayout(r)), all.data() + table().total() * r,
                     whole_table_, whole_.data());
  return whole_.data();
}

void Trainer::GatherOptimizerState() {
  optimizer_->GatherFullState();  // on data-parallel rank 0
  if (!whole_state_) return;
  // Tensor or expert parallelism: each state's parts from the ranks of data-parallel rank 0's
  // groups, put together on rank 0 of the job, as FullWeights() does the weights.
  Communicator& group = PartsGroup();
  std::vector<ShardState> mine = optimizer_->full_state().State();
  std::vector<ShardState> all = whole_state_->State();
  for (size_t i = 0; i < mine.size(); ++i) {
    const size_t size = LayOutFullState(mine[i].spec, table()).size;
    std::vector<float> gathered(dp_rank_ == 0 && group.rank() == 0 ? size * group.size() : 0);
    if (dp_rank_ == 0)
      group.GatherFloatToRoot(mine[i].values.data(), gathered.data(), size,
                              "model-parallel optimizer-state gather");
    if (!leader()) continue;
    all[i].values.assign(LayOutFullState(all[i].spec, whole_table_).size, 0.0f);
    for (int r = 0; r < group.size(); ++r)
      CopyStateParts(mine[i].spec, model_spec_->BuildTable(PartsLayout(r)),
                     gathered.data() + size * r, whole_table_, all[i].values.data(),
                     /*to_whole=*/true);
  }
}

// The group whose ranks hold different parts of the model: tensor or expert parallelism's (the
// two are not combined yet).
Communicator& Trainer::PartsGroup() {
  return parallelism_.ep_degree > 1 ? mesh_->expert_parallel() : mesh_->tensor_parallel();
}

// The layout of rank r of PartsGroup().
ModelParallelism Trainer::PartsLayout(int r) const {
  if (parallelism_.ep_degree > 1) {
    ModelParallelism layout;
    layout.ep_degree = parallelism_.ep_degree;
    layout.ep_rank = r;
    return layout;
  }
  return ModelParallelism::Layout(parallelism_.tp_degree, r, parallelism_.tp_chunks);
}

void Trainer::ReleaseFullCopies() {
  optimizer_->ReleaseFullState();
  if (whole_state_)
    for (const ShardState& state : whole_state_->State()) FreeBuffer(state.values);
  FreeBuffer(gathered_);
  FreeBuffer(whole_);
}

const float* Trainer::WeightsOnEveryRank() {
  if (table().partial())
    throw UsageError(
        "parallelism.tensor_parallel_degree / expert_parallel_degree > 1: the whole weights are "
        "not gathered on every rank yet (set both to 1)");
  if (!sharded_) return weights_.data();  // every rank holds every parameter
  gathered_.resize(data_parallel_->padded_size());
  data_parallel_->comm().AllGatherFloat(weights_.data(), gathered_.data(),
                                        data_parallel_->shard_size(), "parameter all-gather");
  return gathered_.data();
}

void Trainer::KeepReferenceWeights() {
  KeepReference(weights_);
}

void Trainer::KeepReference(std::vector<float> weights) {
  reference_weights_ = std::move(weights);
  auto ignore = [](int, size_t, size_t, const float*) {};
  if (sharded_)
    reference_access_ = std::make_unique<ShardedAccess>(table(), *data_parallel_,
                                                        reference_weights_.data(), true, ignore);
  else  // Forward only: the accumulator and gradients are never touched by a scored forward.
    reference_access_ = std::make_unique<ReplicatedAccess>(table(), *data_parallel_, *accumulator_,
                                                           reference_weights_.data(), grads_.data(),
                                                           /*overlap=*/false, ignore);
}

uint64_t Trainer::KeepInitialWeightsAsReference() {
  if (table().partial())
    throw UsageError(
        "parallelism.tensor_parallel_degree / expert_parallel_degree > 1: the initial weights "
        "are not reloaded under them yet (set both to 1)");
  std::vector<float> whole(
      std::max({data_parallel_->padded_size(), whole_table_.total(), base_ + weights_.size()}),
      0.0f);
  if (!training_.initial_load_hf.empty())
    ImportHfModel(training_.initial_load_hf, *model_spec_, whole_table_, whole.data());
  else if (!training_.init_weights.empty())
    LoadModelWeights(training_.init_weights, whole_table_, whole.data());
  else
    model_spec_->InitWeights(table(), training_.seed, 0, table().total(), whole.data());
  if (detectors_->bf16_storage())
    for (size_t i = 0; i < table().total(); ++i) whole[i] = RoundToBfloat16(whole[i]);
  const uint64_t hash = Hash64(whole.data(), whole_table_.total() * sizeof(float));
  KeepReference(std::vector<float>(whole.begin() + base_, whole.begin() + base_ + weights_.size()));
  return hash;
}

void Trainer::ScoreTargets(const Batch& batch, float* logp, bool reference) {
  if (reference && !reference_access_)
    throw Error(kExitFailure, "internal: ScoreTargets(reference) before KeepReferenceWeights");
  TrainingAccess& access = reference ? *reference_access_ : *access_;
  const int64_t rows = training_.shape.micro_batch, positions = rows * batch.seq_len;
  if (batch.samples % rows != 0)
    throw Error(kExitFailure, "internal: ScoreTargets of a batch that is not whole micro-batches");
  const int64_t micro_batches = batch.samples / rows;
  if (sharded_) access.BeginStep();  // the gathered units of an earlier step are stale
  for (int64_t m = 0; m < micro_batches; ++m) {
    access.BeginMicroBatch(m + 1 == micro_batches, -1);
    ForwardOptions options = ForwardOptions::Scored();
    options.positions = batch.positions_at(m * rows);
    options.seq_len = batch.length_of(m);
    model_->Forward(access, batch.inputs_at(m * rows), batch.targets_at(m * rows), nullptr,
                    options);
    const float* losses = model_->losses();
    const int32_t* targets = batch.targets_at(m * rows);
    for (int64_t i = 0; i < positions; ++i)
      logp[m * positions + i] = targets[i] < 0 ? 0.0f : -losses[i];
  }
}

void Trainer::SetStepBatches(StepBatches* batches) {
  if (batches && batches->WeightsFromForward() && !training_.shape.whole_logits)
    throw Error(kExitFailure,
                "internal: a StepBatches that weighs from the forward on a Trainer built without "
                "whole_logits (its memory plan does not count the whole logits)");
  step_batches_ = batches;
}

bool Trainer::AnyRank(bool value, const char* what) {
  comm().AllReduceOr(&value, what);
  return value;
}

// ---- the loop ----

int Trainer::Run() {
  const Timer train_timer;
  auto stop = [this](int exit_code) {
    for (const std::unique_ptr<TrainerHook>& h : hooks_) h->End(true);
    mesh_->Finalize();
    return exit_code;
  };
  const int64_t first_step = resume_.progress.step + 1;
  // A run in stages passes the boundary it starts on (the start, or a resumed stage end), or
  // says which stage it resumes in.
  if (std::optional<int> exit_code = AtStageBoundary(first_step - 1)) return stop(*exit_code);
  if (const int k = StageOfStep(training_.stages, first_step);
      leader() && k >= 0 && training_.stages[k].first_step < first_step)
    AnnounceStage(training_.stages[k], first_step);
  for (int64_t step = first_step; step <= training_.steps; ++step) {
    const StepReport report = Step(step);
    for (const std::unique_ptr<TrainerHook>& hook : hooks_)
      if (std::optional<int> exit_code = hook->AfterStep(report)) return stop(*exit_code);
    if (std::optional<int> exit_code = AtStageBoundary(step)) return stop(*exit_code);
  }
  for (const std::unique_ptr<TrainerHook>& hook : hooks_) hook->End(false);
  return Finish(train_timer);
}

// The stage boundary at `step` (0: before the first stage; a stage's last step), if there is
// one: every hook's AtStageBoundary, then the next stage's phase=stage line. The stage
// boundary hook of the trainer: what runs between stages belongs in a hook's AtStageBoundary.
std::optional<int> Trainer::AtStageBoundary(int64_t step) {
  const std::vector<DataStage>& stages = training_.stages;
  if (stages.empty() || step > training_.steps) return std::nullopt;
  StageBoundary boundary;
  boundary.step = step;
  boundary.tokens_seen = tokens_seen_;
  if (step > 0) {
    const int finished = StageOfStep(stages, step);
    if (finished < 0 || stages[finished].last_step() != step) return std::nullopt;
    boundary.finished = finished + 1;
    boundary.finished_name = stages[finished].name;
  }
  if (boundary.finished < static_cast<int>(stages.size())) {
    boundary.next = boundary.finished + 1;
    boundary.next_name = stages[boundary.finished].name;
  }
  for (const std::unique_ptr<TrainerHook>& hook : hooks_)
    if (std::optional<int> exit_code = hook->AtStageBoundary(boundary)) return exit_code;
  if (leader() && boundary.next > 0) AnnounceStage(stages[boundary.next - 1], step + 1);
  return std::nullopt;
}

void Trainer::AnnounceStage(const DataStage& stage, int64_t from_step) {
  PrintLine(StrFormat(
      "phase=stage stage=%d name=%s first_step=%lld last_step=%lld lr_policy=%s "
      "anneal_steps=%lld list=%s%s",
      stage.index, stage.name.c_str(), (long long)stage.first_step, (long long)stage.last_step(),
      LrPolicyName(stage.lr_policy), (long long)stage.anneal_steps, stage.list.c_str(),
      from_step > stage.first_step ? StrFormat(" resumed_at=%lld", (long long)from_step).c_str()
                                   : ""));
}

StepReport Trainer::Step(int64_t step) {
  Timer step_timer;
  const double exchanged = ep_traffic_.seconds;
  mesh_->SetStep(step);
  // Replicas must agree before they are used. Checked before the step's forward pass, because
  // under ZeRO-1 the next parameter all-gather would overwrite a corrupted replica (after it had
  // already produced wrong gradients). (ZeRO-3 has no persistent replica: it compares what the
  // ranks gathered, after the step.)
  if (!sharded_ && training_.check_consistency() && step > 1 &&
      (step - 1) % training_.consistency_check_steps == 0)
    data_parallel_->CheckConsistency(weights_.data(), table().total(), step - 1);
  faults_->BeforeStep(step, *access_);
  const Batch& batch = step_batches_ ? step_batches_->Next(step) : NextBatch();
  expert_loads_->BeginStep();
  const bool finite = ForwardBackward(batch, step);
  if (step_batches_) step_batches_->AfterBackward(step);
  StepReport r;
  r.expert_loads = expert_loads_->FinishStep(data_parallel_->batch(), step);
  r.step = step;
  r.last = step == training_.steps;
  r.reduce_wait_seconds = ReduceGradients(step);
  if (step == dump_gradients_step_) DumpGradients(step);
  r.loss = faults_->LoggedLoss(data_parallel_->OrderedSum(micro_losses_) / normalizer_, step);
  if (model_spec_->has_aux_loss())
    r.aux_loss = data_parallel_->OrderedSum(micro_aux_) / normalizer_;
  if (leader() && fresh_model_ && step == 1 && !step_batches_)
    detectors_->CheckFirstLoss(r.loss, model_spec_->vocab_size());
  r.lr = learning_rate_(step);
  r.grad_norm = GradNorm(finite);
  r.skipped = guard_->SkipUpdate(step, r.loss, r.grad_norm);
  r.grad_norm_clipped = r.skipped ? std::nan("") : ClipAndStep(step, r.lr, r.grad_norm);
  r.skipped_total = guard_->skipped();
  for (double l : micro_losses_) r.local_loss_sum += l;  // before a Hessian pass reuses them
  r.local_valid_tokens = valid_local_;
  const int64_t hessian_interval = optimizer_config_.optimizer->hessian_interval();
  if (!r.skipped) {  // the update ran, on every rank
    ReportOptimizerMetrics(step, r);
    if (hessian_interval > 0 && step % hessian_interval == 0) HessianPass(batch, step, r.lr);
  }
  faults_->AfterUpdate(step, weights_.data(), table().total(), sharded_);
  r.global_batch = training_.batches.GlobalBatch(step);
  if (const int k = StageOfStep(training_.stages, step); k >= 0) {
    r.stage = k + 1;
    r.stage_name = training_.stages[k].name;
  }
  // A StepBatches makes each step's global batch itself (the DataLoader reads nothing): its
  // cursor is the samples of steps 1..step, what a checkpoint's resume check expects.
  r.consumed_samples =
      step_batches_ ? training_.batches.SamplesBefore(step + 1) : loader_->consumed_samples();
  if (step_batches_) r.source_metrics = step_batches_->Metrics(step);
  tokens_seen_ += training_.tokens_per_step(step);
  last_loss_ = r.loss;
  last_step_ran_ = true;
  ++steps_run_;
  if (std::isfinite(r.loss))
    non_finite_loss_since_ = 0;
  else if (non_finite_loss_since_ == 0)
    non_finite_loss_since_ = step;
  r.tokens_seen = tokens_seen_;
  r.step_seconds = step_timer.Seconds();
  if (parallelism_.ep_degree > 1) r.expert_exchange_seconds = ep_traffic_.seconds - exchanged;
  r.tokens_per_second = static_cast<double>(training_.tokens_per_step(step)) / r.step_seconds;
  r.mfu = leader() ? mfu_meter_->Percent(r.tokens_per_second, step) : 0.0;  // rank 0 logs it
  if (source_->pads()) {
    // The step's global batch, whichever rank read it: a pure function of the sample indices.
    const int64_t first = training_.batches.SamplesBefore(step);
    r.padding_tokens = 0;
    for (int64_t i = first; i < first + r.global_batch; ++i)
      r.padding_tokens += source_->SamplePadding(i);
    const double inputs = static_cast<double>(training_.tokens_per_step(step));
    r.padding_share = static_cast<double>(r.padding_tokens) / inputs;
    r.content_tokens_per_second = (inputs - static_cast<double>(r.padding_tokens)) / r.step_seconds;
  }
  return r;
}

bool Trainer::ForwardBackward(const Batch& batch, int64_t step, bool sampled_targets) {
  const int64_t accumulation = training_.accumulation(step), rows = training_.shape.micro_batch;
  // Every micro-batch's gradient is scaled by the same 1/normalizer: the loss is the weighted
  // mean over the whole global batch (the count of its targets, for pre-training). The weight
  // sums add up in global micro-batch order, so any rank layout gives the same bits.
  micro_weights_.assign(accumulation, 0.0);
  valid_local_ = 0;
  for (int64_t m = 0; m < accumulation; ++m) {
    const int32_t* targets = batch.targets_at(m * rows);
    const float* weights = batch.loss_weights_at(m * rows);
    for (int64_t i = 0; i < rows * batch.seq_len; ++i) {
      if (targets[i] < 0) continue;
      ++valid_local_;
      micro_weights_[m] += weights ? weights[i] : 1.0;
    }
  }
  normalizer_ =
      step_batches_ ? step_batches_->Normalizer(step) : data_parallel_->OrderedSum(micro_weights_);
  if (!(normalizer_ > 0))
    throw DataError(
        StrFormat("step %lld: the global batch has no valid target tokens (the loss "
                  "weights of its targets sum to %g, not a positive number)",
                  (long long)step, normalizer_));
  loss_scale_ = 1.0f / static_cast<float>(normalizer_);
  micro_losses_.assign(accumulation, 0.0);
  micro_aux_.assign(accumulation, 0.0);
  // One warning per step and rank: the first tensor and micro-batch, and how many were not finite.
  std::string first_non_finite;
  int64_t non_finite_micro_batches = 0;
  const bool weigh = step_batches_ && step_batches_->WeightsFromForward() && !sampled_targets;
  if (weigh) forward_logp_.resize(static_cast<size_t>(rows * batch.seq_len));
  access_->BeginStep();
  for (int64_t m = 0; m < accumulation; ++m) {
    access_->BeginMicroBatch(m + 1 == accumulation,
                             sampled_targets ? -1 : faults_->NanElement(step, m));
    // The fused head (its backward during Forward) unless the targets are resampled from the
    // whole logits or the loss weights are computed from them.
    ForwardOptions options =
        sampled_targets || weigh ? ForwardOptions::Logits() : ForwardOptions::Fused(loss_scale_);
    options.positions = batch.positions_at(m * rows);
    options.seq_len = batch.length_of(m);
    const int32_t* targets = batch.targets_at(m * rows);
    LossSum sum = model_->Forward(*access_, batch.inputs_at(m * rows), targets,
                                  batch.loss_weights_at(m * rows), options);
    if (weigh) {  // the StepBatches writes the micro-batch's weights from this forward
      const float* losses = model_->losses();
      for (int64_t i = 0; i < rows * batch.length_of(m); ++i)
        forward_logp_[i] = targets[i] < 0 ? 0.0f : -losses[i];
      step_batches_->WeighMicroBatch(step, m, forward_logp_.data(), model_->logits(),
                                     model_spec_->vocab_size());
      sum = model_->Reweight(batch.loss_weights_at(m * rows));
    }
    micro_losses_[m] = sum.loss;
    micro_aux_[m] = sum.aux;
    if (sampled_targets) {
      SampleTargets(model_->logits(), batch.targets_at(m * rows), rows, batch.length_of(m),
                    model_spec_->vocab_size(), training_.seed, step, batch.first_sample + m * rows,
                    sampled_targets_.data());
      micro_losses_[m] = model_->Retarget(sampled_targets_.data()).loss;
    }
    model_->Backward(*access_, loss_scale_);
    if (!sampled_targets) expert_loads_->Add(model_->ExpertLoads());
    if (!non_finite_where_.empty()) {
      if (non_finite_micro_batches++ == 0)
        first_non_finite = StrFormat("%s (micro-batch %lld)", non_finite_where_.c_str(),
                                     (long long)(rank_ * accumulation + m));
      non_finite_where_.clear();
    }
  }
  if (non_finite_micro_batches > 0)
    LogWarn(StrFormat(
        "step %lld: non-finite gradient in %s, in %lld of %lld micro-batches%s; the update will "
        "be skipped",
        (long long)step, first_non_finite.c_str(), (long long)non_finite_micro_batches,
        (long long)accumulation, world_ > 1 ? " of this rank" : ""));
  return !AnyRank(non_finite_micro_batches > 0, "non-finite flag all-reduce");
}

double Trainer::ReduceGradients(int64_t step) {
  // The gradient reductions still in flight (all of them without overlap): the time this rank
  // waits here is the communication the backward pass did not hide.
  Timer reduce_timer;
  access_->FinishStep(grads_.data());
  const double waited = reduce_timer.Seconds();
  if (training_.check_consistency() && step % training_.consistency_check_steps == 0)
    if (const std::optional<uint64_t> hash = access_->TakeGatheredHash())
      data_parallel_->CheckConsistentHash(*hash, step, "gathered parameters");
  return waited;
}

// debug.dump_gradients_step: the gradient as the optimizer would get it (reduced, before
// clipping), float32 little-endian in table order, for bench/exact_reduction_error.py.
void Trainer::DumpGradients(int64_t step) const {
  const std::string path =
      JoinPath(run_dir_, StrFormat("gradients-step-%lld.f32", (long long)step));
  AtomicWriteFile(path, grads_.data(), table().total() * sizeof(float));
  LogInfo("wrote " + path);
}

double Trainer::GradNorm(bool finite) {
  // The balance biases' slots hold loads, not gradients (ParamKind::kBalanceBias): zeros while
  // the norm is taken, then put back (clipping scales them by a positive factor, which the sign
  // rule does not see).
  balance_held_.clear();
  for (const auto& [b, e] : balance_ranges_) {
    balance_held_.insert(balance_held_.end(), grads_.data() + (b - base_),
                         grads_.data() + (e - base_));
    std::fill(grads_.data() + (b - base_), grads_.data() + (e - base_), 0.0f);
  }
  const double norm = GradNormOfGradients(finite);
  size_t held = 0;
  for (const auto& [b, e] : balance_ranges_) {
    std::copy_n(balance_held_.data() + held, e - b, grads_.data() + (b - base_));
    held += e - b;
  }
  return norm;
}

double Trainer::GradNormOfGradients(bool finite) {
  double squares = 0;
  if (parallelism_.tp_chunks == 1 && !table().has_experts()) {
    squares = data_parallel_->GradNormSquared(grads_.data(), base_);
  } else {
    // Each element once, over every group that holds a part (docs/parallelism.md): this rank's
    // update range (ZeRO 0: every data-parallel rank holds all of it, data-parallel rank 0
    // counts it) of its parts, and of the tensors every tensor-parallel rank holds whole,
    // tensor-parallel rank 0's. A mixture of experts' too, at every expert-parallel degree (1
    // included, for the same bits): its experts on every rank of an expert group, the other
    // tensors on the group's rank 0.
    std::vector<std::pair<size_t, size_t>> ranges;
    const bool replicated = data_parallel_->zero_stage() == 0 && dp_rank_ != 0;
    for (const ParamInfo& p : table().params()) {
      if (replicated || (!p.sliced() && parallelism_.tp_rank != 0) ||
          (p.expert < 0 && parallelism_.ep_rank != 0))
        continue;
      const size_t b = std::max(update_begin_, p.offset),
                   e = std::min(update_end_, p.offset + p.numel);
      if (b < e) ranges.emplace_back(b, e);
    }
    squares = LayoutFreeSumOfSquares(grads_.data(), base_, ranges, comm());
  }
  const double grad_norm = std::sqrt(squares);
  return finite ? grad_norm : std::nan("");
}

double Trainer::ClipGradients(double grad_norm) {
  const float clip = ClipScale(grad_norm, training_.max_norm);
  if (clip < 1.0f) {
#pragma omp parallel for schedule(static)
    for (int64_t i = static_cast<int64_t>(update_begin_); i < static_cast<int64_t>(update_end_);
         ++i)
      grads_[i - base_] *= clip;
  }
  return clip < 1.0f ? grad_norm * clip : grad_norm;
}

double Trainer::ClipAndStep(int64_t step, double lr, double grad_norm) {
  const double clipped = ClipGradients(grad_norm);
  detectors_->BeforeUpdate(weights_.data(), base_);
  optimizer_->Step(weights_.data(), grads_.data(), lr, step, base_);
  detectors_->AfterUpdate(weights_.data(), step, base_);
  divergence_->CheckWeights(weights_.data(), base_, update_begin_, update_end_, step);
  data_parallel_->GatherParams(weights_.data());
  return clipped;
}

// As the official SophiaG script: the same batch (its data order stays a function of the step),
// the updated weights, the loss scaled as the step's (the mean over the global batch's targets),
// the gradient clipped to training.max_norm as the step's. The weights do not change, so nothing
// is gathered after it.
void Trainer::HessianPass(const Batch& batch, int64_t step, double lr) {
  const bool finite = ForwardBackward(batch, step, /*sampled_targets=*/true);
  ReduceGradients(step);
  const double grad_norm = GradNorm(finite);
  if (!std::isfinite(grad_norm)) {
    if (leader())
      LogWarn(StrFormat(
          "step %lld: non-finite gradient norm in the Hessian pass; skipping the Hessian update",
          (long long)step));
    return;
  }
  ClipGradients(grad_norm);
  optimizer_->UpdateHessian(weights_.data(), grads_.data(), lr, step, base_);
}

void Trainer::ReportOptimizerMetrics(int64_t step, StepReport& report) {
  const std::vector<double> values = optimizer_->ReduceMetrics();
  if (values.empty()) return;
  const std::vector<OptimizerMetric> specs = optimizer_config_.optimizer->metrics();
  metric_warned_.resize(specs.size(), false);
  for (size_t j = 0; j < specs.size(); ++j) {
    report.optimizer_metrics.emplace_back(specs[j].name, values[j]);
    // Once when a metric crosses its threshold, again only after it has come back below.
    const bool above = step >= specs[j].warn_from_step && values[j] > specs[j].warn_above;
    const bool warn = above && !metric_warned_[j];
    metric_warned_[j] = above;
    if (leader() && warn)
      LogWarn(StrFormat("step %lld: %s = %.4f (above %g): %s", (long long)step,
                        specs[j].name.c_str(), values[j], specs[j].warn_above,
                        specs[j].warning.c_str()));
  }
}

// After the last step: the final weights (checked, hashed, saved), the peak memory, the profile.
int Trainer::Finish(const Timer& train_timer) {
  // Whatever the guards let through, a run never ends with exit 0 on a loss that is not finite
  // (every rank has the same loss, so every rank stops here).
  // A run that took no step (steps = 0, or resumed at its last step with no loss recorded) has no
  // loss to judge: its weights are checked below like any other.
  const bool has_loss = last_step_ran_ || (resume_.resumed && resume_.progress.step > 0);
  if (has_loss && !std::isfinite(last_loss_))
    throw Error(
        kExitDiverged,
        StrFormat(
            "the final loss (step %lld) is not finite (%s)%s: training diverged; "
            "model.safetensors was not written; roll back to the last checkpoint: %s",
            (long long)training_.steps, FormatValue(last_loss_).c_str(),
            non_finite_loss_since_ > 0 && non_finite_loss_since_ < training_.steps
                ? StrFormat(", nor any since step %lld", (long long)non_finite_loss_since_).c_str()
                : "",
            LastCheckpoint(non_finite_loss_since_).c_str()));
  const size_t n_params = whole_table_.total();
  const float* final_weights = FullWeights();
  const uint64_t weights_hash = leader() ? Hash64(final_weights, n_params * sizeof(float)) : 0;
  if (leader()) divergence_->CheckFinalWeights(final_weights, whole_table_);
  if (leader() && training_.checkpoint_enable) {
    PrintLine("phase=save path=" + JoinPath(run_dir_, "model.safetensors"));
    SaveModelWeights(JoinPath(run_dir_, "model.safetensors"), whole_table_, *model_spec_,
                     final_weights);
  }
  const double train_seconds = train_timer.Seconds();
  // Peak resident memory of every rank (VmHWM), to hold the memory report against reality.
  double peak_rss = PeakResidentBytes();
  std::vector<double> peaks(world_);
  comm().AllGatherDouble(&peak_rss, peaks.data(), 1, "peak-memory all-gather");
  if (leader()) {
    std::string list;
    for (double p : peaks) {
      if (!list.empty()) list += ',';
      list += StrFormat("%.0f", p);
    }
    PrintLine("phase=memory_peak rss_bytes_per_rank=" + list);
    // What this rank's tensor- and expert-parallel exchanges moved and waited, per step of this
    // process.
    auto traffic = [&](const char* phase, const ExchangeTraffic& t) {
      PrintLine(StrFormat(
          "phase=%s exchanges_per_step=%.1f bytes_received_per_step=%.0f exchange_s_per_step=%.6f",
          phase, static_cast<double>(t.exchanges) / steps_run_, t.bytes_received / steps_run_,
          t.seconds / steps_run_));
    };
    if (parallelism_.distributed() && steps_run_ > 0)
      traffic("tensor_parallel_traffic", tp_traffic_);
    if (parallelism_.ep_degree > 1 && steps_run_ > 0)
      traffic("expert_parallel_traffic", ep_traffic_);
    // Reductions whose block sums did not fit the narrow format and travelled as 16 bytes.
    PrintLine(StrFormat("phase=exact_reduction format=%s wide_reductions=%lld",
                        training_.shape.exact_grid.name(),
                        (long long)data_parallel_->exact().wide_reductions()));
  }
  if (leader() && KernelProfileEnabled()) {
    PrintKernelProfile(mfu_meter_->peak_gflops() / world_);
    mfu_meter_->CheckProfiledKernels(world_);
  }
  comm().Barrier("end of training");
  mesh_->Finalize();
  if (leader())
    PrintLine(
        StrFormat("done steps=%lld tokens=%lld wall_s=%.2f train_s=%.2f final_loss=%.6f "
                  "tok/s=%.1f skipped=%lld weights_xxh3=%s",
                  (long long)training_.steps, (long long)tokens_seen_, wall_.Seconds(),
                  train_seconds, last_loss_, train_seconds > 0 ? tokens_seen_ / train_seconds : 0.0,
                  (long long)guard_->skipped(), HexU64(weights_hash).c_str()));
  return kExitOk;
}

int RunTraining(Config config, const std::string& resume_mode) {
  Trainer trainer(std::move(config), resume_mode);
  return trainer.Run();
}

}  // namespace crucible
