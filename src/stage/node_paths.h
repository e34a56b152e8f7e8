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

// Points `arguments` at the staged copy: an argument equal to a source, or starting with
// "<source>/", becomes DIR/<staged name>[/rest]; the same after the first '=' of a
// key=value argument. A source is matched as given and as an absolute path.
std::vector<std::string> RewriteArguments(const std::vector<std::string>& arguments,
                                          const std::vector<std::string>& sources,
                                          const std::string& destination);

}  // namespace crucible
