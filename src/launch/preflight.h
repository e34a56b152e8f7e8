// --preflight: a short health check of nodes before they cost a training attempt. One launch
// puts one rank on every node to check (which proves the launcher reaches each node and the
// rank wrapper starts there); each rank checks that the command's program is found, that the
// run directory is writable (write, fsync, read back, remove), and runs the site's own check
// command when one is given. A node that does not report success is failed, with the reason.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "launch/command.h"

namespace crucible {

struct PreflightOptions {
  std::string crucible;  // binary with the rank wrapper
  std::string run_dir;
  std::vector<std::string> command;  // the job's command (its program must be found)
  double timeout_seconds = 60;
  std::string check_command;  // optional site check, run on each node
};

struct PreflightResult {
  std::map<std::string, std::string> failed;  // node -> reason
  double seconds = 0;
};

// Checks every node of `spec.nodes` (one rank each), logging to `log_path`.
PreflightResult RunPreflight(const LaunchSpec& spec, const PreflightOptions& options,
                             const std::string& log_path);

// The check on one node (crucible launch-rank --check RUN_DIR -- COMMAND...): prints
// "crucible-preflight: ok node=<node>" or "crucible-preflight: failed node=<node> reason=..."
// and returns 0 or 1.
int RunNodeCheck(const std::string& run_dir, const std::vector<std::string>& command,
                 const std::string& check_command);

}  // namespace crucible
