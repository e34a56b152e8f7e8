#include "stage/file_stream.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"

namespace crucible {
namespace {

void MakeParent(const std::string& path) {
  const std::string parent = ParentDirectory(path);
  if (!parent.empty()) MakeDirectories(parent);
}

}  // namespace

StreamWriter::StreamWriter(const Manifest& manifest, const std::vector<size_t>& needed,
                           const std::set<size_t>& mine, const std::string& root,
                           std::string* failure)
    : manifest_(manifest),
      needed_(needed),
      mine_(mine),
      root_(root),
      failure_(failure),
      state_(XXH3_createState(), XXH3_freeState) {}

void StreamWriter::Consume(const char* data, size_t size) {
  while (size > 0) {
    SkipEmpty();
    if (next_ >= needed_.size()) return;  // cannot happen: the stream's size is the sum
    const ManifestEntry& entry = manifest_[needed_[next_]];
    if (offset_ == 0) Open();
    const size_t take = static_cast<size_t>(std::min<uint64_t>(size, entry.size - offset_));
    if (fd_ >= 0 && failure_->empty()) {
      XXH3_64bits_update(state_.get(), data, take);
      WriteAll(data, take, entry);
    }
    data += take;
    size -= take;
    offset_ += take;
    if (offset_ == entry.size) {
      Check(entry);
      Close();
      offset_ = 0;
      ++next_;
    }
  }
}

void StreamWriter::Finish() {
  SkipEmpty();
  Close();
}

void StreamWriter::SkipEmpty() {  // empty files take no stream bytes: create them as they come up
  while (next_ < needed_.size() && offset_ == 0 && manifest_[needed_[next_]].size == 0) {
    Open();
    Check(manifest_[needed_[next_]]);
    Close();
    ++next_;
  }
}

void StreamWriter::Check(const ManifestEntry& entry) {
  if (fd_ < 0 || !failure_->empty()) return;
  const uint64_t hash = XXH3_64bits_digest(state_.get());
  if (hash != entry.hash)
    *failure_ = StrFormat(
        "%s: content differs from the manifest after the copy (hash %016llx, expected "
        "%016llx): the source changed while it was being staged; run yeet again",
        entry.path.c_str(), (unsigned long long)hash, (unsigned long long)entry.hash);
  verified_ += entry.size;
}

void StreamWriter::Open() {
  const size_t index = needed_[next_];
  if (!mine_.count(index) || !failure_->empty()) return;
  const std::string path = JoinPath(root_, manifest_[index].path);
  try {
    MakeParent(path);
    fd_ = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd_ < 0) ThrowErrno("cannot create " + path);
    XXH3_64bits_reset(state_.get());
  } catch (const Error& e) {
    *failure_ = e.what();
  }
}

void StreamWriter::WriteAll(const char* data, size_t size, const ManifestEntry& entry) {
  while (size > 0) {
    const ssize_t n = write(fd_, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *failure_ = StrFormat("cannot write %s under %s: %s", entry.path.c_str(), root_.c_str(),
                            std::strerror(errno));
      return;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void StreamWriter::Close() {
  if (fd_ >= 0 && close(fd_) != 0 && failure_->empty())
    *failure_ = "cannot close a file under " + root_ + ": " + std::strerror(errno);
  fd_ = -1;
}

StreamReader::~StreamReader() {
  if (fd_ >= 0) close(fd_);
}

void StreamReader::Produce(char* data, size_t size) {
  while (size > 0) {
    while (next_ < needed_.size() && manifest_[needed_[next_]].size == 0) ++next_;
    const ManifestEntry& entry = manifest_[needed_.at(next_)];
    if (fd_ < 0) {
      fd_ = open(entry.source.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd_ < 0) ThrowErrno("cannot open " + entry.source);
    }
    const size_t want = static_cast<size_t>(std::min<uint64_t>(size, entry.size - offset_));
    const ssize_t n = read(fd_, data, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) ThrowErrno("cannot read " + entry.source);
    if (n == 0) throw IoError(entry.source + " shrank while it was being staged; run yeet again");
    data += n;
    size -= static_cast<size_t>(n);
    offset_ += static_cast<uint64_t>(n);
    if (offset_ == entry.size) {
      close(fd_);
      fd_ = -1;
      offset_ = 0;
      ++next_;
    }
  }
}

void SbcastStream::Pack() {
  const std::string path = pack();
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) ThrowErrno("cannot create " + path);
  StreamReader reader(source, needed);
  std::vector<char> buffer(static_cast<size_t>(std::min<uint64_t>(chunk_bytes, total)));
  for (uint64_t done = 0; done < total;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buffer.size(), total - done));
    reader.Produce(buffer.data(), n);
    for (size_t written = 0; written < n;) {
      const ssize_t w = write(fd, buffer.data() + written, n - written);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        const int saved = errno;
        close(fd);
        errno = saved;
        ThrowErrno("cannot write " + path);
      }
      written += static_cast<size_t>(w);
    }
    done += n;
  }
  if (close(fd) != 0) ThrowErrno("cannot write " + path);
}

void SbcastStream::Broadcast() {
  const std::string from = pack();
  std::vector<std::string> argv = {"sbcast", "-f", "--compress=none", from, staged};
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, "sbcast", nullptr, nullptr, args.data(), environ);
  if (spawned != 0)
    throw UsageError(std::string("cannot run sbcast: ") + std::strerror(spawned) +
                     "; use --transport mpi where Slurm's sbcast is not installed");
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw IoError(StrFormat("sbcast %s %s failed (%s %d); its message is above", from.c_str(),
                            staged.c_str(), WIFEXITED(status) ? "exit" : "signal",
                            WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status)));
}

void SbcastStream::RemovePack() {
  unlink(pack().c_str());
}

void SbcastStream::Unpack(StreamWriter* writer) {
  const int fd = open(staged.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) ThrowErrno("cannot open the file sbcast staged, " + staged);
  std::vector<char> buffer(static_cast<size_t>(std::min<uint64_t>(chunk_bytes, total)));
  uint64_t done = 0;
  while (done < total) {
    const ssize_t n = read(fd, buffer.data(),
                           static_cast<size_t>(std::min<uint64_t>(buffer.size(), total - done)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      close(fd);
      throw IoError(StrFormat("%s: %s after %llu of %llu bytes", staged.c_str(),
                              n < 0 ? std::strerror(errno) : "ends", (unsigned long long)done,
                              (unsigned long long)total));
    }
    writer->Consume(buffer.data(), static_cast<size_t>(n));
    done += static_cast<uint64_t>(n);
  }
  close(fd);
}

}  // namespace crucible
