// A process environment as a map, so detection and the rank wrapper take it as an argument
// (tests pass a faked one).
#pragma once

#include <map>
#include <string>

namespace crucible {

using Environment = std::map<std::string, std::string>;
Environment CurrentEnvironment();

}  // namespace crucible
