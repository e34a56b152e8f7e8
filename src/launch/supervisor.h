// Runs one attempt of a launch command and watches it: starts it in a session of its own (dying
// with the launcher: PR_SET_PDEATHSIG), passes its output through line by line (rank-labelled),
// copies every line to the attempt log, and — the hang watchdog — when no complete line has
// appeared on stdout or stderr for `timeout_seconds`, kills the whole job: SIGTERM (and SIGCONT,
// so stopped ranks can act on it) to every process of the job, a grace period, then SIGKILL to
// whatever is left, including ranks that left the process group or the session (found by the
// launch marker in their environment), until none is alive. A stop signal to the launcher asks
// the job to stop and waits for it (launch/stop.h); a second SIGTERM, SIGINT or SIGHUP kills the
// job at once.
#pragma once

#include <functional>
#include <string>

#include "launch/attempt_log.h"
#include "launch/command.h"

namespace crucible {

// SIGTERM / SIGINT / SIGHUP / SIGUSR1 to the launcher are caught and queued here, so the
// supervisor can stop the job and the launcher can stop between attempts.
void InstallLaunchSignalHandlers();
int PendingLaunchSignal();  // the first signal received, 0 if none
// Sleeps up to `seconds`; returns false early when a signal arrives.
bool SleepUnlessSignalled(double seconds);

struct SupervisorOptions {
  double timeout_seconds = 0;         // the watchdog; 0 disables it
  double kill_grace_seconds = 1;      // between SIGTERM and SIGKILL; the least a stop waits
  std::string marker;                 // "CRUCIBLE_LAUNCH_ID=<id>", set in the job's environment
  std::string log_path;               // attempt log (appended); empty: none
  bool pass_through = true;           // copy lines to this process's stdout/stderr
  std::function<void()> before_kill;  // e.g. cancel the Slurm step; called before SIGKILL
};

struct AttemptRun {
  int exit_code = 0;  // the launcher command's exit code (128+N for signal N), 124 on timeout
  bool timed_out = false;
  int signal_received = 0;        // the first stop signal the launcher received, 0 if none
  bool stop_requested = false;    // it reached the job (which was still running)
  double stop_grace_seconds = 0;  // how long the stop could take before the job was killed
  double stop_seconds = -1;       // from the stop request to the end of the job; -1: none
  std::string stop_end;           // "" when the job ended by itself, else how it was ended
  double seconds = 0;
  double first_line_seconds = -1;
};

AttemptRun RunSupervised(const LaunchCommand& command, const SupervisorOptions& options,
                         AttemptLog* log);

}  // namespace crucible
