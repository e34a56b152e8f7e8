// Child processes for the launcher: short helper commands whose output is captured
// (scontrol, sbatch, mpirun --version), PATH look-up, and the process-tree view the watchdog
// kills from (descendants by parent pid, plus every process carrying the launch's marker in
// its environment, so ranks that left the process group or the session are found too).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "launch/detect.h"

namespace crucible {

struct CaptureResult {
  int exit_code = -1;  // 128+N when killed by signal N; 127 when the program is missing
  std::string output;  // stdout and stderr, interleaved
  bool timed_out = false;
};
// Runs argv (no shell) with stdin from /dev/null; kills it after timeout_s seconds.
CaptureResult RunCapture(const std::vector<std::string>& argv, double timeout_s);

// The first executable `name` on PATH (or `name` itself when it has a '/'); "" if none.
std::string FindExecutable(const std::string& name, const Environment& env);

// Exit status from waitpid: the code, or 128 + signal number.
int ExitCodeFromStatus(int status);

// Marks this process as the reaper of its orphaned descendants (PR_SET_CHILD_SUBREAPER), so a
// rank whose parent died is re-parented here and stays visible to the tree walk.
void BecomeSubreaper();

// Whether process `pid` is alive here and carries `marker` ("KEY=value") in its environment.
bool ProcessCarries(pid_t pid, const std::string& marker);

// Every live descendant of this process (with BecomeSubreaper, orphaned ones too), found
// through /proc/<pid>/stat, plus every process whose environment holds `marker` ("KEY=value")
// when marker is non-empty. This process itself is never included.
std::vector<pid_t> JobProcesses(const std::string& marker);

}  // namespace crucible
