#include "train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/files.h"
#include "common/log.h"
#include "common/strings.h"

namespace crucible {
namespace {

std::string ThisHost() {
  char name[256] = {0};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

std::string ReadRecord(int fd) {
  char buffer[4096];
  const ssize_t n = ::pread(fd, buffer, sizeof(buffer), 0);
  return n > 0 ? Trim(std::string(buffer, static_cast<size_t>(n))) : "";
}

// "host h, pid 123, started 2025-01-01T00:00:00Z" from a record.
std::string DescribeHolder(const std::string& record) {
  if (record.empty()) return "holder not recorded yet";
  const nlohmann::json holder = nlohmann::json::parse(record, nullptr, false);
  if (!holder.is_object() || !holder.contains("pid")) return "unreadable record: " + record;
  return StrFormat("host %s, pid %lld, started %s", holder.value("host", "?").c_str(),
                   (long long)holder.value("pid", int64_t{-1}),
                   holder.value("started", "?").c_str());
}

}  // namespace

RunLock::RunLock(const std::string& folder, const std::string& key)
    : path_(JoinPath(folder, "train.lock")) {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) ThrowErrno("cannot open the run-directory lock " + path_);
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    const std::string holder = DescribeHolder(ReadRecord(fd_));
    ::close(fd_);
    fd_ = -1;
    if (error == EWOULDBLOCK)
      throw UsageError(folder + " is in use by another crucible train (" + holder + "; lock " +
                       path_ + "): wait for it to end or stop it, or give this run another " + key);
    LogWarn("cannot lock " + path_ + " (" + std::strerror(error) +
            "): this filesystem has no flock, so nothing stops a second run on " + folder);
    return;
  }
  const std::string previous = ReadRecord(fd_);
  if (!previous.empty())
    LogWarn("taking over " + path_ + " from a run that is no longer running (" +
            DescribeHolder(previous) + "): it ended without releasing " + folder);
  const nlohmann::json record = {{"host", ThisHost()},
                                 {"pid", static_cast<int64_t>(::getpid())},
                                 {"started", UtcNow()},
                                 {"command", "crucible train"}};
  const std::string text = record.dump() + "\n";
  if (::ftruncate(fd_, 0) != 0 ||
      ::pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    const int error = errno;
    ::close(fd_);  // releases the lock: no destructor runs after a throw
    errno = error;
    ThrowErrno("cannot write the run-directory lock " + path_);
  }
}

RunLock::~RunLock() {
  if (fd_ < 0) return;
  // An empty record is a released lock; closing the file releases the flock.
  if (::ftruncate(fd_, 0) != 0) LogWarn("cannot clear " + path_ + ": " + std::strerror(errno));
  ::close(fd_);
}

}  // namespace crucible
