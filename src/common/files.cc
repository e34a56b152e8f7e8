#include "common/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "common/strings.h"

namespace crucible {
namespace {

const char* KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

std::string DescribeStatError(int error) {
  if (error == ENOENT) return "no such file";
  if (error == ELOOP) return "a symlink loop (ELOOP)";
  return std::strerror(error);
}

// Reads a regular file whole, at most `max_bytes` (SIZE_MAX: no cap).
std::string ReadRegularFile(const std::string& path, size_t max_bytes) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int error = errno;
    if (error == ENOENT || error == ELOOP || error == ENOTDIR)
      throw UsageError(path + ": " + DescribeStatError(error));
    errno = error;
    ThrowErrno("cannot read " + path);
  }
  const auto not_regular = [&]() {
    return UsageError(path + ": " + KindOf(st.st_mode) +
                      ", not a regular file: name a file (a FIFO or a device may never end)");
  };
  if (!S_ISREG(st.st_mode)) throw not_regular();  // refused unopened
  // O_NONBLOCK: a FIFO swapped in after the stat must not block the open.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) ThrowErrno("cannot read " + path);
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw not_regular();
  }
  const auto too_large = [&]() {
    ::close(fd);
    return UsageError(
        StrFormat("%s: larger than %zu MiB, the most a config-like input may hold "
                  "(is it the right file?)",
                  path.c_str(), max_bytes >> 20));
  };
  if (static_cast<uint64_t>(st.st_size) > max_bytes) throw too_large();
  std::string contents;
  contents.reserve(static_cast<size_t>(st.st_size));
  char buffer[1 << 16];
  for (;;) {  // to the end, not to st_size: /proc files report size 0
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      ::close(fd);
      errno = error;
      ThrowErrno("cannot read " + path);
    }
    if (contents.size() + static_cast<size_t>(n) > max_bytes) throw too_large();
    contents.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return contents;
}

}  // namespace

std::string ReadFile(const std::string& path) {
  return ReadRegularFile(path, SIZE_MAX);
}

std::string ReadConfigFile(const std::string& path) {
  return ReadRegularFile(path, kConfigFileMaxBytes);
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string StatFailure(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? "" : DescribeStatError(errno);
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void MakeDirectories(const std::string& path) {
  if (path.empty() || IsDirectory(path)) return;
  MakeDirectories(ParentDirectory(path));
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) ThrowErrno("cannot create " + path);
}

std::string ParentDirectory(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return "";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty() || (!b.empty() && b[0] == '/')) return b;
  return a.back() == '/' ? a + b : a + "/" + b;
}

void FsyncDirectory(const std::string& path) {
  int fd = ::open(path.empty() ? "." : path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) ThrowErrno("cannot open directory " + path);
  ::fsync(fd);
  ::close(fd);
}

OutputFile::OutputFile(const std::string& path) : path_(path), target_(path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {  // written through, never replaced
      fd_ = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);
      if (fd_ < 0) ThrowErrno("cannot open " + path);
      return;
    }
    if (!S_ISREG(st.st_mode))
      throw UsageError(path + ": " + KindOf(st.st_mode) +
                       ", not a file: name a file to write (a special file is never replaced)");
    struct stat link;
    if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
      if (char* real = ::realpath(path.c_str(), nullptr)) {
        target_ = real;
        std::free(real);
      }
    }
  } else if (errno == ELOOP) {
    throw UsageError(path + ": " + DescribeStatError(ELOOP));
  }
  temporary_ = target_ + ".tmp." + std::to_string(::getpid());
  fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) ThrowErrno("cannot create " + temporary_);
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temporary_.empty()) ::unlink(temporary_.c_str());
}

void OutputFile::Write(const void* data, size_t size) {
  if (fd_ < 0) throw Error(kExitFailure, path_ + ": written after Commit()");
  const char* bytes = static_cast<const char*>(data);
  size_t written = 0;
  while (written < size) {
    const ssize_t n = ::write(fd_, bytes + written, size - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      ThrowErrno("cannot write " + path_);
    }
    written += static_cast<size_t>(n);
  }
}

void OutputFile::Commit() {
  if (fd_ < 0) throw Error(kExitFailure, path_ + ": committed twice");
  const int fd = fd_;
  fd_ = -1;
  if (writes_through()) {
    if (::close(fd) != 0) ThrowErrno("cannot write " + path_);
    committed_ = true;
    return;
  }
  if (::fsync(fd) != 0) {
    const int error = errno;
    ::close(fd);
    errno = error;
    ThrowErrno("cannot write " + path_);
  }
  if (::close(fd) != 0) ThrowErrno("cannot write " + path_);
  if (::rename(temporary_.c_str(), target_.c_str()) != 0)
    ThrowErrno("cannot rename " + temporary_ + " to " + target_);
  committed_ = true;
  FsyncDirectory(ParentDirectory(target_));
}

void AtomicWriteFile(const std::string& path, const void* data, size_t size) {
  OutputFile out(path);
  out.Write(data, size);
  out.Commit();
}

void AtomicWriteFile(const std::string& path, std::string_view contents) {
  AtomicWriteFile(path, contents.data(), contents.size());
}

}  // namespace crucible
