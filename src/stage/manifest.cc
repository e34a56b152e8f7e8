#include "stage/manifest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"
#include "stage/node_paths.h"

namespace crucible {
namespace fs = std::filesystem;
namespace {

void CheckName(const std::string& path) {
  if (path.find('\n') != std::string::npos)
    throw UsageError("cannot stage " + path + ": its name holds a newline");
}

// Every regular file under `folder`, relative to it, into `out` with `prefix` prepended.
void Walk(const std::string& folder, const std::string& prefix, bool follow, Manifest* out) {
  std::error_code error;
  auto options =
      follow ? fs::directory_options::follow_directory_symlink : fs::directory_options::none;
  for (fs::recursive_directory_iterator it(folder, options, error), end; it != end;
       it.increment(error)) {
    if (error) break;
    const std::string path = it->path().string();
    struct stat info;
    if ((follow ? stat(path.c_str(), &info) : lstat(path.c_str(), &info)) != 0)
      ThrowErrno("cannot stat " + path);
    if (S_ISDIR(info.st_mode)) continue;
    if (!S_ISREG(info.st_mode)) {
      if (!follow) continue;  // a node's own tree: only files yeet wrote count
      throw UsageError("cannot stage " + path +
                       ": not a regular file or folder (sockets, FIFOs and devices are refused)");
    }
    CheckName(path);
    ManifestEntry entry;
    entry.path = prefix + fs::relative(it->path(), folder).string();
    entry.size = static_cast<uint64_t>(info.st_size);
    entry.mode = info.st_mode & 07777;
    entry.source = path;
    entry.inode = static_cast<uint64_t>(info.st_ino);
    out->push_back(entry);
  }
  if (error) throw IoError("cannot list " + folder + ": " + error.message());
}

std::string BootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

void HashAll(Manifest* manifest, uint64_t* bytes_read, HashCache* cache) {
  for (ManifestEntry& entry : *manifest)
    entry.hash = cache ? cache->Hash(entry.source, bytes_read) : HashFile(entry.source, bytes_read);
  std::sort(manifest->begin(), manifest->end(),
            [](const ManifestEntry& a, const ManifestEntry& b) { return a.path < b.path; });
}

}  // namespace

uint64_t HashFile(const std::string& path, uint64_t* bytes_read) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) ThrowErrno("cannot open " + path);
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(),
                                                                 XXH3_freeState);
  XXH3_64bits_reset(state.get());
  std::vector<char> buffer(size_t{1} << 20);
  while (true) {
    const ssize_t n = read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int saved = errno;
      close(fd);
      errno = saved;
      ThrowErrno("cannot read " + path);
    }
    if (n == 0) break;
    XXH3_64bits_update(state.get(), buffer.data(), static_cast<size_t>(n));
    if (bytes_read) *bytes_read += static_cast<uint64_t>(n);
  }
  close(fd);
  return XXH3_64bits_digest(state.get());
}

HashCache::HashCache(std::string path, Kind kind) : path_(std::move(path)), kind_(kind) {
  if (kind_ == kNodeTree) boot_id_ = BootId();
  if (path_.empty()) return;
  std::ifstream in(path_);
  std::string line;
  // Line 1: "crucible-hash-cache 1 <boot id or ->"; then "<hash hex> <identity> <path>".
  if (!std::getline(in, line) ||
      line != "crucible-hash-cache 1 " + (boot_id_.empty() ? "-" : boot_id_))
    return;
  while (std::getline(in, line)) {
    char hash[17] = {0}, identity[128] = {0};
    int consumed = 0;
    if (std::sscanf(line.c_str(), "%16[0-9a-f] %127s %n", hash, identity, &consumed) != 2 ||
        consumed == 0 || static_cast<size_t>(consumed) >= line.size())
      continue;
    loaded_[line.substr(static_cast<size_t>(consumed))] = {identity,
                                                           std::strtoull(hash, nullptr, 16)};
  }
}

uint64_t HashCache::Hash(const std::string& file, uint64_t* bytes_read) {
  struct stat info;
  if (stat(file.c_str(), &info) != 0) ThrowErrno("cannot stat " + file);
  std::string identity = StrFormat(
      "%" PRIu64 ":%" PRIu64 ":%" PRIu64 ":%lld.%09ld", static_cast<uint64_t>(info.st_dev),
      static_cast<uint64_t>(info.st_ino), static_cast<uint64_t>(info.st_size),
      static_cast<long long>(info.st_mtim.tv_sec), info.st_mtim.tv_nsec);
  if (kind_ == kSources)
    identity +=
        StrFormat(":%lld.%09ld", static_cast<long long>(info.st_ctim.tv_sec), info.st_ctim.tv_nsec);
  auto it = loaded_.find(file);
  if (it != loaded_.end() && it->second.identity == identity) {
    ++hits_;
    used_[file] = it->second;
    return it->second.hash;
  }
  const uint64_t hash = HashFile(file, bytes_read);
  // A file changed within the timestamps' granularity may change again unseen: keep it out of
  // the cache, as git does with "racily clean" entries.
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  const time_t last_change = kind_ == kSources ? info.st_ctim.tv_sec : info.st_mtim.tv_sec;
  if (now.tv_sec > last_change + 1) used_[file] = {identity, hash};
  changed_ = true;
  return hash;
}

void HashCache::Save() const {
  if (path_.empty() || (!changed_ && used_.size() == loaded_.size())) return;
  std::string text = "crucible-hash-cache 1 " + (boot_id_.empty() ? "-" : boot_id_) + "\n";
  for (const auto& [file, entry] : used_)
    if (file.find('\n') == std::string::npos)
      text += StrFormat("%016" PRIx64 " %s ", entry.hash, entry.identity.c_str()) + file + "\n";
  const std::string parent = ParentDirectory(path_);
  if (!parent.empty()) MakeDirectories(parent);
  AtomicWriteFile(path_, text);
}

Manifest ScanSources(const std::vector<std::string>& sources, uint64_t* bytes_read,
                     HashCache* cache) {
  Manifest manifest;
  std::map<std::string, std::string> names;  // staged name -> source
  for (const std::string& source : sources) {
    const std::string name = StagedName(source);
    if (name.empty() || name == "." || name == "..")
      throw UsageError("cannot stage " + source + ": name the folder itself, e.g. ../data");
    auto [it, fresh] = names.emplace(name, source);
    if (!fresh)
      throw UsageError("sources " + it->second + " and " + source + " would both be staged as " +
                       name + "; rename one or stage its parent folder");
    struct stat info;
    if (stat(source.c_str(), &info) != 0) ThrowErrno("cannot stage " + source);
    if (S_ISDIR(info.st_mode)) {
      Walk(source, name + "/", true, &manifest);
    } else if (S_ISREG(info.st_mode)) {
      CheckName(source);
      manifest.push_back(
          {name, static_cast<uint64_t>(info.st_size), info.st_mode & 07777u, 0, source});
    } else {
      throw UsageError("cannot stage " + source + ": not a regular file or folder");
    }
  }
  HashAll(&manifest, bytes_read, cache);
  return manifest;
}

Manifest ScanTree(const std::string& root, uint64_t* bytes_read, HashCache* cache) {
  Manifest manifest;
  struct stat info;
  if (lstat(root.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) return manifest;
  Walk(root, "", false, &manifest);
  HashAll(&manifest, bytes_read, cache);
  return manifest;
}

std::string SerializeManifest(const Manifest& manifest) {
  std::string text;
  for (const ManifestEntry& e : manifest)
    text += StrFormat("%016" PRIx64 " %" PRIu64 " %o ", e.hash, e.size, e.mode) + e.path + "\n";
  return text;
}

Manifest ParseManifest(const std::string& text) {
  Manifest manifest;
  int number = 0;
  for (const std::string& line : Split(text, '\n')) {
    ++number;
    if (line.empty()) continue;
    ManifestEntry e;
    char hash[17] = {0};
    unsigned mode = 0;
    int consumed = 0;
    if (std::sscanf(line.c_str(), "%16[0-9a-f] %" SCNu64 " %o %n", hash, &e.size, &mode,
                    &consumed) != 3 ||
        consumed == 0 || static_cast<size_t>(consumed) >= line.size())
      throw DataError(
          StrFormat("manifest line %d: expected '<hash> <size> <mode> <path>', got '%s'", number,
                    line.c_str()));
    e.hash = std::strtoull(hash, nullptr, 16);
    e.mode = mode & 07777;
    e.path = line.substr(static_cast<size_t>(consumed));
    manifest.push_back(e);
  }
  return manifest;
}

std::string ManifestHash(const Manifest& manifest) {
  const std::string text = SerializeManifest(manifest);
  return StrFormat("%016" PRIx64, static_cast<uint64_t>(XXH3_64bits(text.data(), text.size())));
}

std::vector<size_t> MissingEntries(const Manifest& wanted, const Manifest& held) {
  std::map<std::string, const ManifestEntry*> by_path;
  for (const ManifestEntry& e : held) by_path[e.path] = &e;
  std::vector<size_t> missing;
  for (size_t i = 0; i < wanted.size(); ++i) {
    auto it = by_path.find(wanted[i].path);
    if (it == by_path.end() || it->second->size != wanted[i].size ||
        it->second->hash != wanted[i].hash)
      missing.push_back(i);
  }
  return missing;
}

}  // namespace crucible
