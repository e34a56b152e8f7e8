#include "launch/stop.h"

#include <algorithm>
#include <filesystem>

#include "ckpt/checkpoint.h"
#include "common/error.h"
#include "common/strings.h"

namespace crucible {
namespace {

constexpr double kAssumedSaveSeconds = 60;  // before the trainer has reported any save
constexpr double kGraceFactor = 3;
constexpr double kGraceMarginSeconds = 10;

}  // namespace

double StopGraceSeconds(const AttemptLog& log, double kill_grace_seconds) {
  const double step = log.longest_step_seconds().value_or(0.0);
  const double save = log.longest_save_seconds().value_or(kAssumedSaveSeconds);
  return std::max(kill_grace_seconds, kGraceFactor * (step + save) + kGraceMarginSeconds);
}

StopJudgement JudgeStop(const AttemptLog& log, const StopFacts& facts) {
  StopJudgement judgement;
  const int code = facts.job_exit_code;
  if (facts.stop_requested) {
    judgement.applies = code != kExitOk || !facts.how_it_ended.empty();
  } else {
    judgement.applies =
        !facts.timed_out && (code == kExitSignalled || code == kExitStoppedNoCheckpoint);
  }
  if (!judgement.applies) return judgement;
  judgement.exit_code = kExitStoppedNoCheckpoint;
  const std::string ended =
      facts.how_it_ended.empty() ? StrFormat("exited %d", code) : facts.how_it_ended;
  const std::optional<StoppedLine>& stopped = log.stopped();
  if (!stopped) {
    judgement.problem = "the job " + ended + " without a 'stopped step=...' line";
    return judgement;
  }
  if (stopped->checkpoint == "none") {
    judgement.problem = StrFormat(
        "the trainer stopped at step %lld without a checkpoint (checkpoint=none); the "
        "job %s",
        (long long)stopped->step, ended.c_str());
    return judgement;
  }
  judgement.checkpoint = stopped->checkpoint;
  const std::string folder = CheckpointDirName(stopped->step);
  if (std::filesystem::path(stopped->checkpoint).filename() != folder) {
    judgement.problem = StrFormat(
        "checkpoint %s named by the trainer is not the one of step %lld (%s); the job %s",
        stopped->checkpoint.c_str(), (long long)stopped->step, folder.c_str(), ended.c_str());
    return judgement;
  }
  const std::string why = VerifyCheckpoint(stopped->checkpoint, VerifyDepth::kSizes);
  if (!why.empty()) {
    judgement.problem = "checkpoint " + stopped->checkpoint +
                        " named by the trainer is not complete: " + why + "; the job " + ended;
    return judgement;
  }
  judgement.exit_code = kExitSignalled;
  return judgement;
}

}  // namespace crucible
