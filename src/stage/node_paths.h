// The path arithmetic of staging: a destination that names its node (%N), the folder an
// archive unpacks into, and a launch command whose paths into a source are pointed at the
// staged copy. Pure functions, unit-tested in tests/unit/stage/.
#pragma once

#include <string>
#include <vector>

#include "launch/rank_environment.h"  // ExpandNodeName: %N in a destination

namespace crucible {

// An archive's name without its extension ("tok.tar.gz" -> "tok"; see IsArchive in
// stage/archive.h): the folder it unpacks into.
std::string ArchiveStem(const std::string& name);

// The name a source gets in the staged tree: its base name ("data/shards/" -> "shards").
std::string StagedName(const std::string& source);

// Where the sbcast transport lands its one file on every node: beside the destination (in its
// parent folder, node-local like it) when that folder names no node (%), else in /tmp; the name
// holds the job's id, so concurrent jobs, and the nodes of a test cluster that share one
// filesystem, never meet another job's file.
std::string SbcastStagingPath(const std::string& destination, const std::string& yeet_id);

// Points `arguments` at the staged copy: an argument equal to a source, or starting with
// "<source>/", becomes DIR/<staged name>[/rest]; the same after the first '=' of a
// key=value argument. A source is matched as given and as an absolute path.
std::vector<std::string> RewriteArguments(const std::vector<std::string>& arguments,
                                          const std::vector<std::string>& sources,
                                          const std::string& destination);

}  // namespace crucible
