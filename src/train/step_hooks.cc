#include "train/step_hooks.h"

#include <cmath>
#include <vector>

#include "common/error.h"
#include "common/files.h"
#include "common/log.h"
#include "common/strings.h"
#include "train/stop_signals.h"
#include "train/trainer.h"
#include "train/validation.h"

namespace crucible {
namespace {

class ValidationHook : public TrainerHook {
 public:
  ValidationHook(Trainer& trainer, std::shared_ptr<const ModelSpec> model,
                 TensorBoardWriter* tensorboard)
      : trainer_(trainer) {
    if (trainer.leader()) {
      validation_ = std::make_unique<Validation>(
          trainer.config(), std::move(model), trainer.run_dir(), trainer.training().shape.seq_len);
      validation_->set_tensorboard(tensorboard);
    }
    enabled_ = trainer.AnyRank(trainer.leader() && validation_->enabled(), "validation flag");
  }

  std::optional<int> AfterStep(const StepReport& report) override {
    if (!enabled_ || (report.step % trainer_.training().validation_freq != 0 && !report.last))
      return std::nullopt;
    bool keep_going = true;
    const float* weights = trainer_.FullWeights();
    if (trainer_.leader())
      keep_going = validation_->Run(report.step, weights, trainer_.whole_table().total());
    trainer_.ReleaseFullCopies();
    trainer_.comm().Barrier("validation");
    if (trainer_.AnyRank(!keep_going, "eval gate flag"))
      throw UsageError(
          StrFormat("stopped by the eval gate at step %lld (validation.gate_action = stop); the "
                    "last checkpoint is kept",
                    (long long)report.step));
    return std::nullopt;
  }

 private:
  Trainer& trainer_;
  std::unique_ptr<Validation> validation_;  // rank 0
  bool enabled_ = false;
};

class CheckpointHook : public TrainerHook {
 public:
  explicit CheckpointHook(Trainer& trainer) : trainer_(trainer) {}

  std::optional<int> AfterStep(const StepReport& report) override {
    Checkpointing& checkpointing = trainer_.checkpointing();
    const bool leader = trainer_.leader();
    const int64_t step = report.step;
    checkpointing.NoteStepTime(report.step_seconds);
    checkpointing.Poll();
    TrainingProgress progress{step,      report.consumed_samples, report.tokens_seen, report.loss,
                              report.lr, trainer_.GuardState(),   nlohmann::json()};
    const int signal_number = AgreedSignal();
    // The leader decides (the "auto" interval depends on its measured save stalls).
    bool due =
        held_ || trainer_.AnyRank(leader && checkpointing.Due(step, trainer_.training().steps),
                                  "checkpoint flag");
    // A skipped update (train/step_guard.h) leaves the weights of the step before it: an interval
    // save waits for the next step whose update runs, so a streak of skips never writes (nor
    // rotates out, checkpoint.keep_latest_k) checkpoints past the last one from before it, which a
    // stopped run names to roll back to. The last step saves whatever happened.
    held_ = due && report.skipped && !report.last;
    // A run whose last loss is not finite stops as diverged (Trainer::Finish, exit 3): nothing of
    // that state is saved.
    if (report.last && !std::isfinite(report.loss)) due = false;
    if (held_) {
      due = false;
      if (leader)
        PrintLine(
            StrFormat("step %lld: the interval checkpoint waits for the next step whose "
                      "update is not skipped",
                      (long long)step));
    }
    const bool save_now =
        due ||
        (signal_number != 0 && checkpointing.enabled() &&
         trainer_.AnyRank(leader && checkpointing.last_saved_step() != step, "checkpoint flag"));
    const float* weights = nullptr;
    if (save_now && leader) progress.step_batches = trainer_.StepBatchesState(step);
    if (save_now) {
      trainer_.GatherOptimizerState();
      weights = trainer_.FullWeights();
    }
    if (leader && due)
      checkpointing.Save(progress, weights, false, report.last ? "final" : "interval");
    if (signal_number != 0) return Stop(progress, weights, signal_number);
    if (save_now) trainer_.ReleaseFullCopies();  // rank 0's full copies exist only for a save
    return std::nullopt;
  }

  void End(bool stopped) override {
    if (!stopped && trainer_.leader()) trainer_.checkpointing().Finish();
  }

 private:
  // Every rank must agree to stop at the same step, or the others would wait in a collective,
  // and name the same signal: the one the lowest rank that got one received.
  int AgreedSignal() {
    int signal_number = StopSignals::Requested();
    if (!trainer_.AnyRank(signal_number != 0, "stop-signal flag")) return 0;
    const uint64_t mine = static_cast<uint64_t>(signal_number);
    std::vector<uint64_t> received(trainer_.comm().size());
    trainer_.comm().AllGatherU64(&mine, received.data(), 1, "stop-signal all-gather");
    for (auto it = received.rbegin(); it != received.rend(); ++it)
      if (*it != 0) signal_number = static_cast<int>(*it);
    return signal_number;
  }

  // 143 only with a complete checkpoint of this step; without one, 75.
  int Stop(const TrainingProgress& progress, const float* weights, int signal_number) {
    Checkpointing& checkpointing = trainer_.checkpointing();
    const bool leader = trainer_.leader();
    std::string saved = "none";
    int exit_code = kExitStoppedNoCheckpoint;
    if (checkpointing.enabled()) {
      if (leader && checkpointing.last_saved_step() != progress.step)
        checkpointing.Save(progress, weights, true, SignalName(signal_number));
      if (leader) checkpointing.Finish();
      saved = JoinPath(checkpointing.root(), "step-" + std::to_string(progress.step));
      exit_code = kExitSignalled;
    } else if (leader) {
      LogWarn("stopped without a checkpoint (checkpoint.enable = false): exit 75");
    }
    // Printed before the barrier, so no rank can exit (and make srun or mpirun end the job)
    // before the line is out; the save is complete by now.
    if (leader)
      PrintLine(StrFormat("stopped step=%lld signal=%s checkpoint=%s exit=%d",
                          (long long)progress.step, SignalName(signal_number), saved.c_str(),
                          exit_code));
    trainer_.ReleaseFullCopies();
    trainer_.comm().Barrier("stop");
    return exit_code;
  }

  Trainer& trainer_;
  bool held_ = false;  // an interval save is due at the next step whose update runs
};

}  // namespace

std::unique_ptr<TrainerHook> MakeValidationHook(Trainer& trainer,
                                                std::shared_ptr<const ModelSpec> model,
                                                TensorBoardWriter* tensorboard) {
  return std::make_unique<ValidationHook>(trainer, std::move(model), tensorboard);
}

std::unique_ptr<TrainerHook> MakeCheckpointHook(Trainer& trainer) {
  return std::make_unique<CheckpointHook>(trainer);
}

}  // namespace crucible
