#include "launch/environment.h"

#include <cstring>

extern char** environ;

namespace crucible {

Environment CurrentEnvironment() {
  Environment env;
  for (char** entry = environ; *entry; ++entry) {
    const char* equals = std::strchr(*entry, '=');
    if (equals) env[std::string(*entry, equals - *entry)] = equals + 1;
  }
  return env;
}

}  // namespace crucible
