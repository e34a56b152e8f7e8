#include "common/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>

#include "common/error.h"

namespace crucible {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (!FileExists(path)) throw UsageError(path + ": no such file");
    ThrowErrno("cannot read " + path);
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
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

void AtomicWriteFile(const std::string& path, const void* data, size_t size) {
  std::string temporary = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) ThrowErrno("cannot create " + temporary);
  const char* bytes = static_cast<const char*>(data);
  size_t written = 0;
  while (written < size) {
    ssize_t n = ::write(fd, bytes + written, size - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      int saved = errno;
      ::close(fd);
      ::unlink(temporary.c_str());
      errno = saved;
      ThrowErrno("cannot write " + path);
    }
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int saved = errno;
    ::unlink(temporary.c_str());
    errno = saved;
    ThrowErrno("cannot write " + path);
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    int saved = errno;
    ::unlink(temporary.c_str());
    errno = saved;
    ThrowErrno("cannot rename " + temporary + " to " + path);
  }
  FsyncDirectory(ParentDirectory(path));
}

void AtomicWriteFile(const std::string& path, std::string_view contents) {
  AtomicWriteFile(path, contents.data(), contents.size());
}

}  // namespace crucible
