// What a staged tree holds: one entry per regular file (path relative to the tree, size,
// permission bits, XXH3-64 of the content), sorted by path. `crucible yeet` compares the
// sources' manifest with each node's to send only the files some node lacks (content
// addressing), and verifies every staged file against it before the tree is made visible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace crucible {

struct ManifestEntry {
  std::string path;  // relative, '/'-separated, no "." or ".." parts
  uint64_t size = 0;
  uint32_t mode = 0644;  // permission bits (07777)
  uint64_t hash = 0;     // XXH3-64 of the content
  std::string source;    // where it is read from (the sources' manifest only; not serialised)
};

using Manifest = std::vector<ManifestEntry>;

// XXH3-64 of a file's content (`bytes_read` counts what was read). Throws IoError.
uint64_t HashFile(const std::string& path, uint64_t* bytes_read = nullptr);

// The staged tree of `sources`: a file lands at <its base name>, a folder's files at
// <folder base name>/<path inside it>. Symlinks are followed; anything but regular files and
// folders is refused (UsageError naming it), as are two sources with one base name.
Manifest ScanSources(const std::vector<std::string>& sources, uint64_t* bytes_read = nullptr);
// The regular files under `root` (empty when it does not exist); symlinks are not followed.
Manifest ScanTree(const std::string& root, uint64_t* bytes_read = nullptr);

// One line per entry: "<hash hex> <size> <mode octal> <path>". Parse throws DataError naming
// the line; paths with a newline are refused by the scans, so the format is unambiguous.
std::string SerializeManifest(const Manifest& manifest);
Manifest ParseManifest(const std::string& text);
// XXH3-64 of the serialised manifest, as 16 hex digits: one value names a whole tree.
std::string ManifestHash(const Manifest& manifest);

// The indices into `wanted` of the entries `held` lacks: missing, or a different size or hash.
std::vector<size_t> MissingEntries(const Manifest& wanted, const Manifest& held);

}  // namespace crucible
