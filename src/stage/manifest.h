// What a staged tree holds: one entry per regular file (path relative to the tree, size,
// permission bits, XXH3-64 of the content), sorted by path. `crucible yeet` compares the
// sources' manifest with each node's to send only the files some node lacks (content
// addressing), and verifies every staged file against it before the tree is made visible.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace crucible {

struct ManifestEntry {
  std::string path;  // relative, '/'-separated, no "." or ".." parts
  uint64_t size = 0;
  uint32_t mode = 0644;  // permission bits (07777)
  uint64_t hash = 0;     // XXH3-64 of the content
  std::string source;    // where it is read from (the sources' manifest only; not serialised)
  uint64_t inode = 0;    // of the file scanned (not serialised)
};

using Manifest = std::vector<ManifestEntry>;

// XXH3-64 of a file's content (`bytes_read` counts what was read). Throws IoError.
uint64_t HashFile(const std::string& path, uint64_t* bytes_read = nullptr);

// Content hashes remembered between runs in one file, keyed by path and by the file's identity,
// so a file whose identity is unchanged is not read again. kSources: device, inode, size, mtime
// and ctime in nanoseconds (ctime moves on every write and cannot be set back, as git's index
// relies on). kNodeTree, for the trees yeet itself writes: device, inode, size and mtime (yeet
// hard-links unchanged files into each new tree, which moves their ctime), valid only while the
// kernel that wrote the cache runs (its boot_id): node trees are written without fsync, so after
// a crash their files are hashed again. Files changed within the last 2 s are not remembered
// ("racily clean"). A missing or malformed cache file is an empty cache; Save writes atomically.
class HashCache {
 public:
  enum Kind { kSources, kNodeTree };
  explicit HashCache(std::string path = "", Kind kind = kSources);
  uint64_t Hash(const std::string& file, uint64_t* bytes_read);  // HashFile, remembered
  void Save() const;  // only the entries used since loading; no-op without a path or a change
  uint64_t hits() const { return hits_; }

 private:
  struct Entry {
    std::string identity;
    uint64_t hash = 0;
  };
  std::string path_, boot_id_;
  Kind kind_;
  std::map<std::string, Entry> loaded_, used_;
  uint64_t hits_ = 0;
  bool changed_ = false;
};

// The staged tree of `sources`: a file lands at <its base name>, a folder's files at
// <folder base name>/<path inside it>. Symlinks are followed; anything but regular files and
// folders is refused (UsageError naming it), as are two sources with one base name.
// `cache` (optional) spares reading unchanged files again.
Manifest ScanSources(const std::vector<std::string>& sources, uint64_t* bytes_read = nullptr,
                     HashCache* cache = nullptr);
// The regular files under `root` (empty when it does not exist); symlinks are not followed.
Manifest ScanTree(const std::string& root, uint64_t* bytes_read = nullptr,
                  HashCache* cache = nullptr);

// One line per entry: "<hash hex> <size> <mode octal> <path>". Parse throws DataError naming
// the line; paths with a newline are refused by the scans, so the format is unambiguous.
std::string SerializeManifest(const Manifest& manifest);
Manifest ParseManifest(const std::string& text);
// XXH3-64 of the serialised manifest, as 16 hex digits: one value names a whole tree.
std::string ManifestHash(const Manifest& manifest);

// The indices into `wanted` of the entries `held` lacks: missing, or a different size or hash.
std::vector<size_t> MissingEntries(const Manifest& wanted, const Manifest& held);

}  // namespace crucible
