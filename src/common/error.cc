#include "common/error.h"

#include <cerrno>
#include <cstring>

namespace crucible {

void ThrowErrno(const std::string& what) {
  int saved = errno;
  throw IoError(what + ": " + std::strerror(saved));
}

}  // namespace crucible
