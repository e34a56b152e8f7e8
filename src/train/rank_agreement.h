// Every rank of a job must train with the same resolved config and the same crucible binary:
// ranks that differ (an MPMD `mpirun -np 1 A : -np 1 B` with other --set values, a node with an
// older build) would compute different things and train silently wrong, or hang in a collective
// of mismatched sizes. Checked at start, before anything is allocated or written.
#pragma once

#include <string>
#include <vector>

#include "common/config.h"
#include "distributed/communicator.h"

namespace crucible {

// Collective. On a mismatch every rank throws UsageError; rank 0's message names the two
// binaries, or the first differing config key with both values (or the two --resume modes).
void CheckRanksAgree(const Config& config, const std::string& resume_mode, Communicator& comm);

// `text` (a resolved config as TOML) with this node's folder of staged files written as the
// pattern it came from: under `crucible launch --yeet SRC --to DIR`, where DIR holds %N (the
// node's name, e.g. distinct folders of nodes that share a filesystem), every path under
// CRUCIBLE_NODE_LOCAL_DIR (DIR expanded on this node) becomes CRUCIBLE_NODE_LOCAL (DIR itself),
// so ranks whose configs differ only by their node's folder agree. Unchanged otherwise.
std::string NodeLocalPathsAsPattern(const std::string& text);

// What rank 0 says about the first rank whose config differs from its own (`mine` and `theirs`
// are resolved configs as TOML); "" when they agree.
std::string DescribeConfigDifference(const std::string& mine, const std::string& theirs,
                                     int their_rank);

}  // namespace crucible
