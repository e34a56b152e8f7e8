#include "stage/archive.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <sys/stat.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/strings.h"

namespace crucible {
namespace {

constexpr char kRebuild[] = "rebuild the archive with relative paths inside one folder";
// The most symlinks one resolution follows before calling it a loop (Linux's MAXSYMLINKS).
constexpr int kMaxSymlinkHops = 40;

using Components = std::vector<std::string>;

std::string JoinComponents(const Components& components) {
  std::string joined;
  for (const std::string& c : components) {
    if (!joined.empty()) joined += '/';
    joined += c;
  }
  return joined;
}

enum class PathShape { kRelative, kAbsolute, kDotDot };

// Splits a member name (or a link target) into components, dropping empty ones and ".".
PathShape SplitPath(const std::string& name, Components* components) {
  components->clear();
  if (!name.empty() && name[0] == '/') return PathShape::kAbsolute;
  for (std::string& c : Split(name, '/')) {
    if (c.empty() || c == ".") continue;
    if (c == "..") return PathShape::kDotDot;
    components->push_back(std::move(c));
  }
  return PathShape::kRelative;
}

const char* SpecialKind(mode_t type) {
  switch (type) {
    case AE_IFCHR:
      return "a character device";
    case AE_IFBLK:
      return "a block device";
    case AE_IFIFO:
      return "a FIFO";
    case AE_IFSOCK:
      return "a socket";
    default:
      return "a special file";
  }
}

// The archive being read, with the filters and the format yeet accepts.
class ArchiveReader {
 public:
  explicit ArchiveReader(const std::string& path) : path_(path), archive_(archive_read_new()) {
    if (archive_ == nullptr) throw Error(kExitFailure, "yeet: " + path + ": out of memory");
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      const int error = errno;
      archive_read_free(archive_);
      throw UsageError("yeet: " + path + ": " + std::strerror(error));
    }
    if (!S_ISREG(st.st_mode)) {
      archive_read_free(archive_);
      throw UsageError("yeet: " + path + ": not a regular file; name a .tar, .tar.gz or .tar.zst");
    }
    archive_read_support_format_tar(archive_);  // ustar, pax and GNU tar
    archive_read_support_filter_gzip(archive_);
    archive_read_support_filter_zstd(archive_);
    if (archive_read_open_filename(archive_, path.c_str(), size_t{1} << 16) != ARCHIVE_OK)
      Corrupt();
  }
  ~ArchiveReader() { archive_read_free(archive_); }
  ArchiveReader(const ArchiveReader&) = delete;
  ArchiveReader& operator=(const ArchiveReader&) = delete;

  // The next member, or nullptr at the end.
  archive_entry* Next() {
    archive_entry* entry = nullptr;
    const int status = archive_read_next_header(archive_, &entry);
    if (status == ARCHIVE_EOF) return nullptr;
    if (status < ARCHIVE_WARN) Corrupt();
    return entry;
  }
  void SkipData() {
    if (archive_read_data_skip(archive_) < ARCHIVE_WARN) Corrupt();
  }
  [[noreturn]] void Corrupt() const {
    const char* message = archive_error_string(archive_);
    throw DataError("yeet: " + path_ +
                    ": cannot read the archive: " + (message ? message : "unknown error") +
                    " (is it a complete .tar, .tar.gz or .tar.zst? copy it again)");
  }
  archive* get() const { return archive_; }

 private:
  std::string path_;
  archive* archive_;
};

// One member, as it will be written.
struct Member {
  enum Kind { kTopFolder, kFile, kDirectory, kSymlink, kHardLink } kind = kFile;
  std::string path;             // relative to the destination, normalised ("" for kTopFolder)
  std::string hardlink_target;  // normalised, for kHardLink
};

// The checks of archive.h, fed the members in order. Check() refuses a member on what is known
// so far; Finish() resolves every symlink again against all the archive's symlinks.
class MemberChecker {
 public:
  explicit MemberChecker(std::string archive) : archive_(std::move(archive)) {}

  Member Check(archive_entry* entry) {
    const char* raw = archive_entry_pathname(entry);
    if (raw == nullptr) raw = archive_entry_pathname_utf8(entry);
    if (raw == nullptr) Refuse("?", "a name that cannot be read in this locale");
    const std::string name = raw;
    Member member;
    Components components;
    switch (SplitPath(name, &components)) {
      case PathShape::kAbsolute:
        Refuse(name, std::string("an absolute path; ") + kRebuild);
      case PathShape::kDotDot:
        Refuse(name, std::string("a path with '..' (tar-slip); ") + kRebuild);
      case PathShape::kRelative:
        break;
    }
    member.path = JoinComponents(components);

    const mode_t type = archive_entry_filetype(entry);
    const char* hardlink = archive_entry_hardlink(entry);
    if (hardlink != nullptr) {
      member.kind = Member::kHardLink;
    } else if (type == AE_IFREG) {
      member.kind = Member::kFile;
    } else if (type == AE_IFDIR) {
      member.kind = Member::kDirectory;
    } else if (type == AE_IFLNK) {
      member.kind = Member::kSymlink;
    } else {
      Refuse(name, std::string(SpecialKind(type)) +
                       "; yeet unpacks regular files, directories and links only: leave it out "
                       "of the archive");
    }
    if (components.empty()) {
      if (member.kind != Member::kDirectory)
        Refuse(name, "an empty name; " + std::string(kRebuild));
      member.kind = Member::kTopFolder;
      return member;
    }

    // Nothing is written through (or in place of) a symlink of the archive.
    for (size_t n = 1; n <= components.size(); ++n) {
      const std::string prefix =
          JoinComponents(Components(components.begin(), components.begin() + n));
      if (symlinks_.count(prefix) == 0) continue;
      if (n < components.size())
        Refuse(name, "it would be written through the symlink \"" + prefix +
                         "\" earlier in the archive; " + kRebuild + ", without the symlink");
      Refuse(name, "it would replace the symlink \"" + prefix +
                       "\" earlier in the archive; leave one of the two out");
    }

    if (member.kind == Member::kSymlink) {
      if (folders_.count(member.path) != 0)
        Refuse(name, "a symlink in place of the folder that earlier members are in; " +
                         std::string(kRebuild));
      const char* target = archive_entry_symlink(entry);
      if (target == nullptr || *target == '\0') Refuse(name, "a symlink with an empty target");
      if (target[0] == '/')
        Refuse(name,
               "a symlink to the absolute path \"" + std::string(target) +
                   "\"; make the link relative (ln -sr) or put the file itself in the archive");
      CheckSymlinkTarget(name, components, target);
      symlinks_[member.path] = target;
      symlink_order_.emplace_back(name, member.path);
    }
    if (member.kind == Member::kHardLink) {
      Components target;
      const std::string why_outside = "a hard link to \"" + std::string(hardlink) + "\", ";
      if (SplitPath(hardlink, &target) != PathShape::kRelative)
        Refuse(name, why_outside + "outside the destination; " + kRebuild);
      member.hardlink_target = JoinComponents(target);
      if (regular_files_.count(member.hardlink_target) == 0)
        Refuse(name,
               why_outside + "which is not a regular file earlier in the archive; " + kRebuild);
    }

    // Record what now stands at this path, and the folders above it.
    for (size_t n = 1; n < components.size(); ++n)
      folders_.insert(JoinComponents(Components(components.begin(), components.begin() + n)));
    if (member.kind == Member::kDirectory) folders_.insert(member.path);
    if (member.kind == Member::kFile || member.kind == Member::kHardLink)
      regular_files_.insert(member.path);
    else
      regular_files_.erase(member.path);

    switch (member.kind) {
      case Member::kFile:
        ++contents_.files;
        contents_.bytes += archive_entry_size(entry);
        break;
      case Member::kDirectory:
        ++contents_.directories;
        break;
      default:
        ++contents_.links;
        if (member.kind == Member::kHardLink) contents_.bytes += archive_entry_size(entry);
        break;
    }
    return member;
  }

  // Every symlink resolved against all of the archive's symlinks (a later one can make an
  // earlier target leave the destination).
  void Finish() {
    for (const auto& [name, path] : symlink_order_) {
      Components components;
      SplitPath(path, &components);
      CheckSymlinkTarget(name, components, symlinks_.at(path));
    }
  }

  const ArchiveContents& contents() const { return contents_; }

 private:
  [[noreturn]] void Refuse(const std::string& name, const std::string& why) const {
    throw DataError("yeet: " + archive_ + ": refused member \"" + name + "\": " + why);
  }

  // Resolves `target` from the folder of the link at `link`, the way the kernel would, following
  // the symlinks of the archive seen so far; refuses it when it leaves the destination or loops.
  void CheckSymlinkTarget(const std::string& name, const Components& link,
                          const std::string& target) const {
    Components resolved(link.begin(), link.end() - 1);
    std::deque<std::string> pending;
    for (std::string& c : Split(target, '/')) pending.push_back(std::move(c));
    int hops = 0;
    while (!pending.empty()) {
      const std::string c = std::move(pending.front());
      pending.pop_front();
      if (c.empty() || c == ".") continue;
      if (c == "..") {
        if (resolved.empty())
          Refuse(name, "a symlink to \"" + target +
                           "\", which leaves the destination; point it at a file inside the "
                           "archive's folder");
        resolved.pop_back();
        continue;
      }
      resolved.push_back(c);
      const auto symlink = symlinks_.find(JoinComponents(resolved));
      if (symlink == symlinks_.end()) continue;
      if (++hops > kMaxSymlinkHops) Refuse(name, "a symlink loop through \"" + target + "\"");
      resolved.pop_back();  // the link's folder, then the link's target in its place
      Components next;
      for (std::string& t : Split(symlink->second, '/')) next.push_back(std::move(t));
      pending.insert(pending.begin(), next.begin(), next.end());
    }
  }

  std::string archive_;
  ArchiveContents contents_;
  std::map<std::string, std::string> symlinks_;                     // path -> target
  std::vector<std::pair<std::string, std::string>> symlink_order_;  // (name, path)
  std::set<std::string> folders_;        // every folder written or implied so far
  std::set<std::string> regular_files_;  // paths that hold a regular file now
};

// `destination` as a canonical absolute path, after checking it is an empty directory.
std::string CanonicalEmptyDirectory(const std::string& destination) {
  char resolved[PATH_MAX];
  if (::realpath(destination.c_str(), resolved) == nullptr)
    throw UsageError("yeet: " + destination + ": " + std::strerror(errno) +
                     "; the destination must be an existing, empty directory");
  struct stat st;
  if (::stat(resolved, &st) != 0 || !S_ISDIR(st.st_mode))
    throw UsageError("yeet: " + destination +
                     ": not a directory; the destination must be an existing, empty directory");
  DIR* dir = ::opendir(resolved);
  if (dir == nullptr) ThrowErrno("yeet: cannot read the destination " + destination);
  bool empty = true;
  while (const dirent* item = ::readdir(dir)) {
    if (std::strcmp(item->d_name, ".") != 0 && std::strcmp(item->d_name, "..") != 0) {
      empty = false;
      break;
    }
  }
  ::closedir(dir);
  if (!empty)
    throw UsageError("yeet: " + destination +
                     ": not empty; the destination must be an existing, empty directory");
  return resolved;
}

}  // namespace

bool IsArchive(const std::string& path) {
  std::string lower = path;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* suffix : {".tar", ".tar.gz", ".tgz", ".tar.zst"})
    if (EndsWith(lower, suffix)) return true;
  return false;
}

ArchiveContents CheckArchive(const std::string& archive) {
  ArchiveReader reader(archive);
  MemberChecker checker(archive);
  while (archive_entry* entry = reader.Next()) {
    checker.Check(entry);
    reader.SkipData();
  }
  checker.Finish();
  return checker.contents();
}

ArchiveContents UnpackArchive(const std::string& archive, const std::string& destination) {
  const std::string root = CanonicalEmptyDirectory(destination);
  CheckArchive(archive);

  ArchiveReader reader(archive);
  MemberChecker checker(archive);  // again, in case the file changed since the check
  struct DiskWriter {
    struct archive* disk = archive_write_disk_new();
    ~DiskWriter() { archive_write_free(disk); }
  } writer;
  struct archive* disk = writer.disk;
  if (disk == nullptr) throw Error(kExitFailure, "yeet: out of memory");
  // PERM: the mode bits as given, without the umask (setuid/setgid/sticky are cleared below);
  // no OWNER, ACL, XATTR or FFLAGS.
  archive_write_disk_set_options(disk, ARCHIVE_EXTRACT_PERM | ARCHIVE_EXTRACT_TIME |
                                           ARCHIVE_EXTRACT_SECURE_SYMLINKS |
                                           ARCHIVE_EXTRACT_SECURE_NODOTDOT);
  const auto write_failed = [&](const std::string& name) {
    const char* message = archive_error_string(disk);
    return IoError("yeet: " + archive + ": cannot write member \"" + name + "\" under " +
                   destination + ": " + (message ? message : "unknown error"));
  };

  while (archive_entry* entry = reader.Next()) {
    const std::string name = archive_entry_pathname(entry) ? archive_entry_pathname(entry) : "?";
    const Member member = checker.Check(entry);
    if (member.kind == Member::kTopFolder) {  // the destination itself: keep its mode and owner
      reader.SkipData();
      continue;
    }
    archive_entry_set_pathname(entry, (root + "/" + member.path).c_str());
    if (member.kind == Member::kHardLink)
      archive_entry_set_hardlink(entry, (root + "/" + member.hardlink_target).c_str());
    archive_entry_set_perm(entry, archive_entry_perm(entry) & 0777);

    if (archive_write_header(disk, entry) < ARCHIVE_OK) throw write_failed(name);
    if (member.kind == Member::kFile || member.kind == Member::kHardLink) {
      const void* block;
      size_t size;
      la_int64_t offset;
      for (;;) {
        const int status = archive_read_data_block(reader.get(), &block, &size, &offset);
        if (status == ARCHIVE_EOF) break;
        if (status < ARCHIVE_WARN) reader.Corrupt();
        if (archive_write_data_block(disk, block, size, offset) < ARCHIVE_OK)
          throw write_failed(name);
      }
    }
    if (archive_write_finish_entry(disk) < ARCHIVE_OK) throw write_failed(name);
  }
  checker.Finish();
  // Applies the folders' modes and mtimes, deferred until their contents are written.
  if (archive_write_close(disk) != ARCHIVE_OK) {
    const char* message = archive_error_string(disk);
    throw IoError("yeet: " + archive + ": cannot set the folders' modes and times under " +
                  destination + ": " + (message ? message : "unknown error"));
  }
  return checker.contents();
}

}  // namespace crucible
