// Content hashing (xxHash XXH3): of buffers, of files, and a streaming hasher.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace crucible {

uint64_t Hash64(const void* data, size_t size, uint64_t seed = 0);
// 128-bit XXH3 of a whole file as 32 hex digits; throws IoError when it cannot be read.
std::string HashFileHex(const std::string& path);

class StreamHasher {
 public:
  StreamHasher();
  ~StreamHasher();
  StreamHasher(const StreamHasher&) = delete;
  StreamHasher& operator=(const StreamHasher&) = delete;
  void Update(const void* data, size_t size);
  std::string HexDigest128() const;
  uint64_t Digest64() const;

 private:
  void* state_;  // XXH3_state_t
};

}  // namespace crucible
