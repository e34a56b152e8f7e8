#include "common/hash.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <vector>

#include "common/error.h"
#include "common/strings.h"

namespace crucible {

uint64_t Hash64(const void* data, size_t size, uint64_t seed) {
  return XXH3_64bits_withSeed(data, size, seed);
}

StreamHasher::StreamHasher() : state_(XXH3_createState()) {
  XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_));
}
StreamHasher::~StreamHasher() {
  XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}

void StreamHasher::Update(const void* data, size_t size) {
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), data, size);
}

std::string StreamHasher::HexDigest128() const {
  XXH128_hash_t h = XXH3_128bits_digest(static_cast<XXH3_state_t*>(state_));
  return HexU64(h.high64) + HexU64(h.low64);
}

uint64_t StreamHasher::Digest64() const {
  return XXH3_128bits_digest(static_cast<XXH3_state_t*>(state_)).low64;
}

std::string HashFileHex(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) ThrowErrno("cannot open " + path);
  StreamHasher hasher;
  std::vector<char> buffer(1 << 20);
  while (true) {
    ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0) {
      ::close(fd);
      ThrowErrno("cannot read " + path);
    }
    if (n == 0) break;
    hasher.Update(buffer.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  return hasher.HexDigest128();
}

}  // namespace crucible
