// Runs one attempt of a launch command and watches it: starts it in a session of its own,
// passes its output through line by line (rank-labelled), copies every line to the attempt
// log, and — the hang watchdog — when no complete line has appeared on stdout or stderr for
// `timeout_seconds`, kills the whole job: SIGTERM (and SIGCONT, so stopped ranks can act on
// it) to every process of the job, a grace period, then SIGKILL to whatever is left, including
// ranks that left the process group or the session (found by the launch marker in their
// environment), until none is alive.
#pragma once

#include <functional>
#include <string>

#include "launch/attempt_log.h"
#include "launch/command.h"

namespace crucible {

// SIGTERM / SIGINT / SIGHUP to the launcher are caught and queued here, so the supervisor can
// forward them to the job and the launcher can stop between attempts.
void InstallLaunchSignalHandlers();
int PendingLaunchSignal();  // the first signal received, 0 if none
// Sleeps up to `seconds`; returns false early when a signal arrives.
bool SleepUnlessSignalled(double seconds);

struct SupervisorOptions {
  double timeout_seconds = 0;         // the watchdog; 0 disables it
  double kill_grace_seconds = 1;      // between SIGTERM and SIGKILL
  std::string marker;                 // "CRUCIBLE_LAUNCH_ID=<id>", set in the job's environment
  std::string log_path;               // attempt log (appended); empty: none
  bool pass_through = true;           // copy lines to this process's stdout/stderr
  std::function<void()> before_kill;  // e.g. cancel the Slurm step; called before SIGKILL
};

struct AttemptRun {
  int exit_code = 0;  // the launcher command's exit code (128+N for signal N), 124 on timeout
  bool timed_out = false;
  int signal_received = 0;  // a signal the launcher received and forwarded, 0 if none
  double seconds = 0;
  double first_line_seconds = -1;
};

AttemptRun RunSupervised(const LaunchCommand& command, const SupervisorOptions& options,
                         AttemptLog* log);

}  // namespace crucible
