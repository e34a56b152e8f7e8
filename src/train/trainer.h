// The training loop. A Trainer is built once per run (Setup: the config checked, the run
// directory locked, the model and its buffers allocated, a checkpoint or initial weights
// loaded) and then runs its steps; each step reads as what it does:
//
//   NextBatch        this rank's slice of the global batch (data/loader.h, prefetched)
//   ForwardBackward  every micro-batch through the model, gradients into the exact accumulator
//                    (or, under ZeRO-3, reduce-scattered as the backward pass goes)
//   ReduceGradients  what is still in flight, into fp32 gradients of this rank's part
//   GradNorm         the global gradient norm (NaN when a gradient was not finite)
//   guards           whether to skip the update (non-finite, spike; train/step_guard.h)
//   ClipAndStep      the clip, the optimizer update, the gather
//   HessianPass      only for an optimizer with a Hessian estimate, every hessian_interval()
//                    steps (optim/optimizer.h): one more ForwardBackward over the same batch
//                    against targets sampled from the model's logits, reduced and clipped as
//                    the step's gradients, into the optimizer's UpdateHessian
//   hooks            metrics, validation, checkpoints and stop signals (train/hooks.h)
//
// A run in stages ([[data.stages]], train/stages.h) reads each stage's blend for its steps and
// follows its LR policy; at each stage boundary (the start, and after a stage's last step and its
// hooks) the trainer calls every hook's AtStageBoundary (Trainer::AtStageBoundary): the hook for
// what runs between stages.
//
// It prints the progress-line contract (phase=start, phase=memory, step=..., done ...), writes
// the run directory (config.toml, metrics.jsonl, model.safetensors) and checkpoints
// (train/checkpointing.h). Test-only faults come from one FaultInjector (train/fault_injector.h).
// Everything that communicates does so on every rank in the same order, so a step is the same
// sequence of collectives everywhere.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/timer.h"
#include "data/loader.h"
#include "data/token_source.h"
#include "distributed/data_parallel.h"
#include "distributed/exact_sum.h"
#include "distributed/mesh.h"
#include "distributed/param_access.h"
#include "distributed/sharded_optimizer.h"
#include "model/model.h"
#include "optim/lr_schedule.h"
#include "train/checkpointing.h"
#include "train/detectors.h"
#include "train/divergence.h"
#include "train/expert_load.h"
#include "train/fault_injector.h"
#include "train/hooks.h"
#include "train/mfu.h"
#include "train/run_lock.h"
#include "train/step_guard.h"
#include "train/stop_signals.h"
#include "train/training_config.h"

namespace crucible {

// Another source of each step's batch than the DataLoader (RL: rollouts made at the current
// weights, rl/grpo_trainer.h). Set on a Trainer before Run(); pre-training never sets one.
// Every call is collective: made on every rank in the same order, inside Trainer::Step, after
// the step's consistency check and before its forward pass, so it may itself call the
// Trainer's collective methods (WeightsOnEveryRank, ScoreTargets).
class StepBatches {
 public:
  virtual ~StepBatches() = default;
  // This rank's slice of step `step`'s global batch: training.global_batch_size / the
  // data-parallel ranks rows of training.seq_len positions, with loss_weights (any finite value;
  // 0 where a target does not count). Valid until the next call.
  virtual const Batch& Next(int64_t step) = 0;
  // The step's loss normaliser N: the gradient is Σ w·dCE/dθ / N over the global batch (the
  // DataLoader's: Σ w). An objective whose weights already carry its aggregation says 1.
  virtual double Normalizer(int64_t step) = 0;
  // Metrics of the step, by name, for metrics.jsonl and the progress line (after the update).
  virtual std::vector<std::pair<std::string, double>> Metrics(int64_t /*step*/) { return {}; }
  // Loss weights that are a function of the step's own forward pass (a policy-gradient objective:
  // its weights depend on the current log-probabilities). true: ForwardBackward runs each
  // micro-batch's forward with the whole logits, calls WeighMicroBatch, and back-propagates with
  // the weights it wrote; the forward is not run a second time to score the batch. false (the
  // default): Next's loss_weights are used as they are.
  virtual bool WeightsFromForward() const { return false; }
  // Micro-batch `micro_batch` of this rank's slice (its rows from micro_batch x
  // training.local_batch_size on): `logp` (rows x seq_len) each target's log-probability under
  // the current weights (0 where the target is -1), `logits` (rows x seq_len, vocab) the whole
  // logits. Writes the micro-batch's loss weights into the Batch that Next returned. Called on
  // every rank for each of its micro-batches in order, between the forward and the backward;
  // not collective.
  virtual void WeighMicroBatch(int64_t /*step*/, int64_t /*micro_batch*/, const float* /*logp*/,
                               const float* /*logits*/, int64_t /*vocab*/) {}
  // After the step's last backward, before the update, on every rank: where a StepBatches
  // reduces across ranks what WeighMicroBatch computed (collective).
  virtual void AfterBackward(int64_t /*step*/) {}
  // What a checkpoint after step `step` must hold for Next(step + 1) to resume exactly, recorded
  // in its state.json (Trainer::resume_point().progress.step_batches on resume); null: nothing.
  // Called on rank 0 only, after Metrics(step): not collective.
  virtual nlohmann::json CheckpointState(int64_t /*step*/) { return nullptr; }
};

class Trainer {
 public:
  // Sets the run up: everything up to the first step. `resume_mode`: "auto" (the newest
  // checkpoint that verifies, if the run directory has any), "none", or a checkpoint folder.
  // `source`: where the samples come from (nullptr: the config's [training] dataset).
  // `whole_logits`: the StepBatches the caller will set computes its loss weights from the
  // forward (StepBatches::WeightsFromForward), so every micro-batch keeps its whole logits: the
  // memory checks count them (TrainingShape::whole_logits). Throws crucible::Error with the
  // documented exit code.
  Trainer(Config config, const std::string& resume_mode,
          std::unique_ptr<TokenSource> source = nullptr, bool whole_logits = false);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains to training.steps, or until a hook stops the run; returns the process exit code (0,
  // or the stop's: 143 after a checkpoint of the step, 75 without one).
  int Run();

  // A hook sees every step after the built-in ones (metrics, validation, checkpoints).
  void AddHook(std::unique_ptr<TrainerHook> hook) { hooks_.push_back(std::move(hook)); }

  // The learning rate of optimizer step `step` (from 1). By default the config's schedule
  // (optim/lr_schedule.h); set before Run() to drive the steps by another rule (the LR finder's
  // sweep, train/lr_finder.h). It must give every rank the same value.
  using LearningRateFunction = std::function<double(int64_t step)>;
  void SetLearningRate(LearningRateFunction learning_rate) {
    learning_rate_ = std::move(learning_rate);
  }

  // Each step's batch from `batches` instead of the DataLoader (above; not owned, outlives Run).
  // An internal error for one that weighs from the forward when the Trainer was not built with
  // `whole_logits` (its memory was planned without them).
  void SetStepBatches(StepBatches* batches);

  // ---- for a StepBatches (collective, every rank in the same order) ----
  // The whole model's weights on every rank, in whole_table()'s layout (this rank's buffer
  // under ZeRO 0/1, all-gathered under ZeRO-3, kept until ReleaseFullCopies()). UsageError
  // under tensor or expert parallelism (their parts are not gathered on every rank yet).
  const float* WeightsOnEveryRank();
  // Keeps a copy of this rank's weights as they are now: what ScoreTargets(reference = true)
  // reads (GRPO's frozen reference model).
  void KeepReferenceWeights();
  // Keeps the run's initial weights instead (model.init_weights, checkpoint.initial_load_hf or
  // the seeded init, loaded again, rounded as the run's were): the reference of a resumed run.
  // Returns the xxh3 of the whole model's initial weights (whole_table().total() floats).
  uint64_t KeepInitialWeightsAsReference();
  // The log-probability of each target of `batch` (this rank's rows, training.local_batch_size
  // at a time) under the current weights, or under the kept reference weights: forward only,
  // through the training model and its ParameterAccess (so any ZeRO stage), written to logp in
  // the batch's own layout (row r of micro-batch m at m x rows x seq_len + r x
  // batch.length_of(m)); 0 where the target is ignored (< 0). `batch.samples` must be a
  // multiple of the micro-batch. (The policy's own log-probabilities at the current weights
  // come from the training forward itself: StepBatches::WeighMicroBatch.)
  void ScoreTargets(const Batch& batch, float* logp, bool reference = false);

  // ---- for the hooks ----
  const Config& config() const { return config_; }
  const TrainingConfig& training() const { return training_; }
  const std::string& run_dir() const { return run_dir_; }
  bool leader() const { return rank_ == 0; }
  Communicator& comm() { return mesh_->world(); }
  DataParallel& data_parallel() { return *data_parallel_; }
  // This rank's parameters (under tensor parallelism, its parts of each tensor), and the whole
  // model's (what checkpoints, exports, validation and the weights hash see).
  const ParameterTable& table() const { return model_->table(); }
  const ParameterTable& whole_table() const { return whole_table_; }
  // Collective over every rank of the job: whether `value` is true on any.
  bool AnyRank(bool value, const char* what);
  // Collective. The full weights on rank 0 (nullptr on the others), in whole_table()'s layout:
  // the buffer itself, or under ZeRO-3 or tensor parallelism a gathered copy kept until
  // ReleaseFullCopies().
  const float* FullWeights();
  // Collective. Rank 0's checkpoint optimizer then holds the state of every parameter (a no-op
  // where this rank's optimizer already covers every parameter).
  void GatherOptimizerState();
  // Frees the full copies FullWeights() and GatherOptimizerState() made.
  void ReleaseFullCopies();
  Checkpointing& checkpointing() { return *checkpointing_; }
  // What a checkpoint records of the step guards.
  nlohmann::json GuardState() const { return guard_->State(); }
  // What a checkpoint records of the StepBatches (StepBatches::CheckpointState); null: none.
  nlohmann::json StepBatchesState(int64_t step) {
    return step_batches_ ? step_batches_->CheckpointState(step) : nlohmann::json();
  }
  // The checkpoint this run resumed from (resumed = false: it started at step 0).
  const ResumePoint& resume_point() const { return resume_; }

 private:
  // ---- setup ----
  void ResolveConfig(const std::string& resume_mode, bool whole_logits);
  void CheckTensorParallelism();
  Communicator& PartsGroup();
  ModelParallelism PartsLayout(int r) const;
  void CheckTensorParallelRun();
  void AllocateState();
  void LoadOrInitWeights(const std::string& resume_mode);
  void InitWeights(float* load_target);
  void ConnectModel();
  void Announce();
  void WarnOfTensorParallelGroupsAcrossHosts(const std::vector<std::string>& hosts);
  // ---- the step ----
  StepReport Step(int64_t step);
  const Batch& NextBatch() { return loader_->Next(); }
  // Returns whether every gradient came out finite on every rank. `sampled_targets`: against
  // targets drawn from the model's own logits (train/sampled_targets.h) instead of the batch's,
  // with no test faults (the Hessian pass).
  bool ForwardBackward(const Batch& batch, int64_t step, bool sampled_targets = false);
  double ReduceGradients(int64_t step);  // seconds waited for reductions in flight
  void DumpGradients(int64_t step) const;
  // The global gradient norm before clipping, the balance biases' slots left out
  // (ParamKind::kBalanceBias); NaN unless every gradient is `finite`.
  double GradNorm(bool finite);
  double GradNormOfGradients(bool finite);
  // Clips grads_ to training.max_norm (given their norm); returns the norm after clipping.
  double ClipGradients(double grad_norm);
  // Clips and updates; returns the norm after clipping.
  double ClipAndStep(int64_t step, double lr, double grad_norm);
  void HessianPass(const Batch& batch, int64_t step, double lr);
  // The optimizer's metrics of this step into `report`, with their warnings (rank 0: once when
  // a metric crosses its threshold).
  void ReportOptimizerMetrics(int64_t step, StepReport& report);
  // What a diverged or stopped run leaves to roll back to (for the messages): the last
  // checkpoint, or the newest before it when `trouble_step` (0: unknown) is the first step after
  // it, whose state the trouble then began from.
  std::string LastCheckpoint(int64_t trouble_step = 0) const;
  // ---- stages ----
  // The hooks' AtStageBoundary when `step` ends a stage (0: the start of the first); the exit
  // code of a hook that stops the run.
  std::optional<int> AtStageBoundary(int64_t step);
  void AnnounceStage(const DataStage& stage, int64_t from_step);  // the phase=stage line
  // ---- the end ----
  int Finish(const Timer& train_timer);
  // Keeps `weights` (this rank's, in weights_' layout) as the reference weights.
  void KeepReference(std::vector<float> weights);

  Timer wall_;
  StopSignals stop_signals_;
  Config config_;
  std::shared_ptr<const ModelSpec> model_spec_;
  OptimizerConfig optimizer_config_;
  LrScheduleConfig schedule_;
  std::vector<LrSegment> lr_segments_;  // with [[data.stages]]: their policies' (train/stages.h)
  LearningRateFunction learning_rate_;  // of each step: the schedule x the ramp rule, unless set
  std::unique_ptr<ProcessMesh> mesh_;
  int world_ = 1, rank_ = 0;       // the job
  int dp_size_ = 1, dp_rank_ = 0;  // this rank's data-parallel group (the replicas)
  // The ranks of different micro-batches (data-parallel x expert-parallel) and this one's place.
  int data_size_ = 1, data_rank_ = 0;
  ModelParallelism parallelism_;  // this rank's tensor-parallel group
  ExchangeTraffic tp_traffic_;    // what its exchanges moved (phase=tensor_parallel_traffic)
  ExchangeTraffic ep_traffic_;    // the experts' all-to-alls (phase=expert_parallel_traffic)
  int64_t steps_run_ = 0;         // steps run by this process
  ParameterTable whole_table_;
  TrainingConfig training_;
  std::unique_ptr<TokenSource> source_;
  std::string run_dir_;
  int64_t dump_gradients_step_ = 0;  // debug.dump_gradients_step
  // The run directory's and the checkpoint folder's, held until everything that writes in them
  // is gone.
  std::vector<std::unique_ptr<RunLock>> run_locks_;

  // ---- model state ----
  std::shared_ptr<ComputeBackend> backend_;  // what model_ computes on (training.device)
  std::unique_ptr<Model> model_;
  std::unique_ptr<DataParallel> data_parallel_;
  bool sharded_ = false;  // ZeRO-3: weights_ and grads_ are this rank's shard
  size_t base_ = 0;       // weights_[i - base_] holds flat parameter i
  size_t update_begin_ = 0, update_end_ = 0;
  std::vector<float> weights_, grads_, gathered_, whole_;
  std::unique_ptr<ExactAccumulator> accumulator_;
  // This rank's optimizer state and how its update is spread over the ranks; it also holds the
  // state of every parameter while a resume or a save needs it.
  std::unique_ptr<ShardedOptimizer> optimizer_;
  // Tensor parallelism: the whole model's optimizer state, what checkpoints hold (its buffers
  // only while a save or a resume needs them).
  std::unique_ptr<OptimizerShard> whole_state_;
  std::unique_ptr<Checkpointing> checkpointing_;
  ResumePoint resume_;
  bool fresh_model_ = false;
  // This rank's update range of the balance biases, and their slots while the norm is taken.
  std::vector<std::pair<size_t, size_t>> balance_ranges_;
  std::vector<float> balance_held_;
  std::unique_ptr<Detectors> detectors_;
  std::unique_ptr<ExpertLoadMeter> expert_loads_;
  std::unique_ptr<DivergenceGuard> divergence_;
  std::unique_ptr<StepGuard> guard_;
  std::unique_ptr<MfuMeter> mfu_meter_;

  // ---- how the model reaches parameters and gradients ----
  std::unique_ptr<TrainingAccess> access_;  // ZeRO 0/1: ReplicatedAccess; 3: ShardedAccess
  std::string non_finite_where_;  // first tensor with a non-finite gradient in a micro-batch

  // ---- the loop ----
  std::unique_ptr<FaultInjector> faults_;
  std::unique_ptr<DataLoader> loader_;
  std::vector<double> micro_losses_, micro_weights_, micro_aux_;
  std::vector<int32_t> sampled_targets_;  // one micro-batch's, for the Hessian pass
  std::vector<float> forward_logp_;       // one micro-batch's, for WeighMicroBatch
  std::vector<bool> metric_warned_;       // per optimizer metric: above its threshold last step
  int64_t valid_local_ = 0;
  float loss_scale_ = 0;
  double normalizer_ = 0;
  int64_t tokens_seen_ = 0;
  double last_loss_ = 0;
  bool last_step_ran_ = false;         // a step ran in this process, so last_loss_ is its loss
  int64_t non_finite_loss_since_ = 0;  // the first step of the last losses that are not finite
  std::vector<std::unique_ptr<TrainerHook>> hooks_;
  StepBatches* step_batches_ = nullptr;  // not owned; nullptr: the DataLoader
  // KeepReferenceWeights(): this rank's weights then, and the access that reads them.
  std::vector<float> reference_weights_;
  std::unique_ptr<TrainingAccess> reference_access_;
};

// Runs `crucible train` to completion: Trainer(config, resume_mode).Run().
int RunTraining(Config config, const std::string& resume_mode = "auto");

// The run directory of a config: [job] dump_folder, or runs/<job.name>.
std::string RunDirectory(const Config& config);

}  // namespace crucible
