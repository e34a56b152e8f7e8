// The rank wrapper, `crucible launch-rank -- COMMAND...`: the first thing every rank runs. It
// reads the rank's identity from whichever launcher started it (Open MPI, MPICH/Hydra, Cray
// PALS, srun), exports it under one set of names, announces itself on stderr, and execs the
// command in place (same pid, so signals and exit codes pass straight through). The rank dies
// with its parent (PR_SET_PDEATHSIG, SIGKILL): when mpirun, its daemon, Hydra's proxy,
// slurmstepd or the launcher itself is gone, no rank is left running.
//
// Names every rank gets: CRUCIBLE_RANK, CRUCIBLE_LOCAL_RANK, CRUCIBLE_WORLD_SIZE,
// CRUCIBLE_LOCAL_WORLD_SIZE, CRUCIBLE_NODE, and the same numbers as RANK, LOCAL_RANK,
// WORLD_SIZE, LOCAL_WORLD_SIZE. The launcher adds CRUCIBLE_RUN_DIR, CRUCIBLE_ATTEMPT,
// CRUCIBLE_NODELIST, CRUCIBLE_ACCELERATOR and CRUCIBLE_LAUNCH_ID.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "launch/environment.h"

namespace crucible {

struct RankIdentity {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  std::string node;
  int pid = 0;  // the rank's process (after exec), from the announcement; 0 if unknown
};

// From the launcher's variables; `hostname` is the node name when no scheduler names it.
RankIdentity RankIdentityFromEnvironment(const Environment& env, const std::string& hostname);

// The line the wrapper writes to stderr before exec; the supervisor reads it back to map
// ranks to nodes. "crucible-rank: rank=1 local_rank=0 world=3 node=n2 pid=4242"
std::string RankAnnouncement(const RankIdentity& identity, int pid);
bool ParseRankAnnouncement(std::string_view line, RankIdentity* identity);

// `pattern` with every "%N" replaced by `node` ("%%" is a literal '%'): the node-local paths of
// `crucible yeet --to` and of a command launched with `crucible launch --yeet`.
std::string ExpandNodeName(const std::string& pattern, const std::string& node);

// Sets the variables, announces, and execs `command`; returns only on failure (127 when the
// program is not found, 126 when it cannot be run), after printing why. With
// CRUCIBLE_EXPAND_NODE_NAME=1 (set by `crucible launch --yeet`) every %N in the command's
// arguments becomes this rank's node name first, and CRUCIBLE_NODE_LOCAL_DIR is set to
// CRUCIBLE_NODE_LOCAL (--to DIR) expanded the same way.
int ExecRank(const std::vector<std::string>& command);

}  // namespace crucible
