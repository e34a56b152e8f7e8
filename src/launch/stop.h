// Stopping a job on request (docs/launch.md, "Stopping a job"). A stop signal to the launcher
// becomes SIGUSR1 to the launch command (mpirun, mpiexec and srun forward it to every rank, remote
// ones included, and let the job end by itself) and to the job's local ranks directly; SIGTERM
// is never forwarded, because mpirun kills the ranks about a second after it. The launcher then
// waits for the job for StopGraceSeconds, and afterwards judges the exit: 143 only when the
// trainer's `stopped` line names a checkpoint that is complete, else 75 with the reason.
#pragma once

#include <string>

#include "launch/attempt_log.h"

namespace crucible {

// How long a stop may take before the job is killed: finishing the step and a synchronous save,
// three times over, plus 10 s — from the longest gap between step= lines and the longest save the
// trainer reported (60 s assumed before its first save) — and never less than `kill_grace`.
double StopGraceSeconds(const AttemptLog& log, double kill_grace_seconds);

struct StopJudgement {
  bool applies = false;    // false: the attempt was no stop, its exit code stands
  int exit_code = 0;       // 143 or 75 when it applies
  std::string checkpoint;  // the path the stopped line named; "" without one (or "none")
  std::string problem;     // why 75, one line; "" for 143
};

struct StopFacts {
  int job_exit_code = 0;        // the launch command's own exit code
  bool stop_requested = false;  // the launcher delivered a stop
  bool timed_out = false;       // the hang watchdog killed the job
  std::string how_it_ended;     // e.g. "killed after the stop grace of 40 s"; "" if it exited
};

// A stop the launcher requested (and that did not end in exit 0), or a job that exited 143 or 75
// by itself (the ranks were signalled directly, e.g. by the scheduler): 143 when the stopped line
// names the checkpoint of its step (a folder "step-<n>") whose COMPLETE marker is present and
// whose MANIFEST matches its files
// (VerifyCheckpoint, sizes only: no tensor data is read); else 75. A relative path is taken from
// the launcher's working folder, which the ranks share.
StopJudgement JudgeStop(const AttemptLog& log, const StopFacts& facts);

}  // namespace crucible
