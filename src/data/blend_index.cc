#include "data/blend_index.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <queue>

#include "common/error.h"
#include "common/files.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/timer.h"

namespace crucible {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

// Minimum of (key, index) over a fixed set of slots; Set is O(log n). A node is the 128-bit
// integer (bits of the key, index): keys are positive doubles (or +inf), whose bit patterns
// order like their values, so one integer comparison orders by key then index, without
// unpredictable branches. Siblings are adjacent, and an update stops where a node's value does
// not change.
class TournamentTree {
 public:
  explicit TournamentTree(int n) {
    leaves_ = 1;
    while (leaves_ < n) leaves_ *= 2;
    node_.resize(2 * leaves_);
    for (int i = 0; i < leaves_; ++i) node_[leaves_ + i] = Pack(kNever, i);
    for (int p = leaves_ - 1; p >= 1; --p) node_[p] = std::min(node_[2 * p], node_[2 * p + 1]);
  }
  void Set(int i, double key) {
    int p = leaves_ + i;
    node_[p] = Pack(key, i);
    for (; p > 1; p >>= 1) {
      const Node winner = std::min(node_[p & ~1], node_[p | 1]);
      if (node_[p >> 1] == winner) break;
      node_[p >> 1] = winner;
    }
  }
  int top() const { return static_cast<int>(static_cast<uint32_t>(node_[1])); }
  double top_key() const {
    const uint64_t bits = static_cast<uint64_t>(node_[1] >> 32);
    double key;
    std::memcpy(&key, &bits, 8);
    return key;
  }

 private:
  using Node = unsigned __int128;
  static Node Pack(double key, int index) {
    uint64_t bits;
    std::memcpy(&bits, &key, 8);
    return (static_cast<Node>(bits) << 32) | static_cast<uint32_t>(index);
  }
  int leaves_;
  std::vector<Node> node_;
};

int64_t ReleaseSlot(double release) {
  return release >= 4e18 ? static_cast<int64_t>(4e18) : static_cast<int64_t>(std::floor(release));
}

constexpr char kCacheMagic[8] = {'C', 'R', 'B', 'L', 'E', 'N', 'D', '1'};

size_t Pad8(size_t n) {
  return (n + 7) & ~size_t{7};
}

// Parses a cache file; returns false (with the reason) when it is not a complete, matching one.
bool ParseCache(const std::string& bytes, const std::string& key_text, int64_t n, BlendIndex* index,
                std::string* reason) {
  if (bytes.size() < 32 || std::memcmp(bytes.data(), kCacheMagic, 8) != 0) {
    *reason = "not a blend index";
    return false;
  }
  uint64_t stored_hash;
  std::memcpy(&stored_hash, bytes.data() + bytes.size() - 8, 8);
  if (Hash64(bytes.data(), bytes.size() - 8) != stored_hash) {
    *reason = "checksum mismatch (partial or corrupted)";
    return false;
  }
  uint64_t key_length;
  std::memcpy(&key_length, bytes.data() + 8, 8);
  if (key_length > bytes.size() || bytes.compare(16, key_length, key_text) != 0) {
    *reason = "built for a different key";
    return false;
  }
  size_t offset = Pad8(16 + key_length);
  uint64_t count;
  std::memcpy(&count, bytes.data() + offset, 8);
  offset += 8;
  const size_t need = offset + Pad8(count * 2) + count * 8 + 8;
  if (count > bytes.size() || need != bytes.size()) {
    *reason = "inconsistent size";
    return false;
  }
  if (static_cast<int64_t>(count) < n) {
    *reason = StrFormat("holds %llu samples, %lld needed", (unsigned long long)count, (long long)n);
    return false;
  }
  index->dataset_index.resize(n);
  index->dataset_sample.resize(n);
  std::memcpy(index->dataset_index.data(), bytes.data() + offset, n * 2);
  offset += Pad8(count * 2);
  std::memcpy(index->dataset_sample.data(), bytes.data() + offset, n * 8);
  return true;
}

std::string SerializeCache(const std::string& key_text, const BlendIndex& index) {
  const uint64_t count = index.dataset_index.size();
  std::string out;
  out.reserve(Pad8(16 + key_text.size()) + 8 + Pad8(count * 2) + count * 8 + 8);
  out.append(kCacheMagic, 8);
  const uint64_t key_length = key_text.size();
  out.append(reinterpret_cast<const char*>(&key_length), 8);
  out += key_text;
  out.resize(Pad8(out.size()), '\0');
  out.append(reinterpret_cast<const char*>(&count), 8);
  out.append(reinterpret_cast<const char*>(index.dataset_index.data()), count * 2);
  out.resize(Pad8(out.size()), '\0');
  out.append(reinterpret_cast<const char*>(index.dataset_sample.data()), count * 8);
  const uint64_t hash = Hash64(out.data(), out.size());
  out.append(reinterpret_cast<const char*>(&hash), 8);
  return out;
}

// Holds an exclusive flock on a lock file for the lifetime of the object. The flock, not the
// file, is the lock: the kernel drops it when its process ends, however it ends (a crash or
// SIGKILL included), so a lock file left on disk never blocks anyone. The holder writes
// "host=<h> pid=<p>" into the file, which waiters name in their heartbeats.
class FileLock {
 public:
  FileLock(const std::string& path, bool progress) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) ThrowErrno("cannot open lock file " + path);
    Timer waited, since_heartbeat;
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR) {
        ::close(fd_);
        ThrowErrno("cannot lock " + path);
      }
      if (progress && since_heartbeat.Seconds() >= 2.0) {
        char holder[128] = {};
        const ssize_t n = ::pread(fd_, holder, sizeof(holder) - 1, 0);
        PrintLine(StrFormat("phase=index_wait lock=%s holder=\"%s\" waited_s=%.0f", path.c_str(),
                            n > 0 ? Trim(std::string_view(holder, n)).c_str() : "unknown",
                            waited.Seconds()));
        since_heartbeat.Reset();
      }
      ::usleep(50 * 1000);
    }
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    const std::string record = StrFormat("host=%s pid=%d\n", host, static_cast<int>(::getpid()));
    const bool recorded =
        ::ftruncate(fd_, 0) == 0 &&
        ::pwrite(fd_, record.data(), record.size(), 0) == static_cast<ssize_t>(record.size());
    (void)recorded;  // only the waiters' heartbeats read it: not worth failing the build for
  }
  ~FileLock() {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }

 private:
  int fd_ = -1;
};

constexpr int64_t kIndexBytesPerSample = 2 + 8;  // dataset (uint16) and its sample (int64)

std::string Asked(int64_t n, const std::string& asked) {
  return asked.empty() ? StrFormat("%lld samples", (long long)n) : asked;
}

// The most memory this process can use, and what sets it.
std::pair<long double, std::string> MemoryLimit() {
  struct sysinfo info;
  long double limit = std::numeric_limits<long double>::infinity();
  std::string source;
  if (::sysinfo(&info) == 0) {
    limit = (static_cast<long double>(info.totalram) + info.totalswap) * info.mem_unit;
    source = info.totalswap > 0 ? "memory and swap this machine has" : "memory this machine has";
  }
  for (const auto& [resource, name] :
       {std::pair{RLIMIT_AS, "ulimit -v"}, {RLIMIT_DATA, "ulimit -d"}}) {
    struct rlimit rl;
    if (::getrlimit(resource, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        static_cast<long double>(rl.rlim_cur) < limit) {
      limit = static_cast<long double>(rl.rlim_cur);
      source = std::string("memory this process may use (") + name + ")";
    }
  }
  std::string cgroup_max;
  try {
    if (FileExists("/sys/fs/cgroup/memory.max"))
      cgroup_max = Trim(ReadFile("/sys/fs/cgroup/memory.max"));
  } catch (const Error&) {
  }
  if (!cgroup_max.empty() && cgroup_max.find_first_not_of("0123456789") == std::string::npos) {
    const long double cgroup = std::stold(cgroup_max);
    if (cgroup < limit) {
      limit = cgroup;
      source = "memory this cgroup may use (/sys/fs/cgroup/memory.max)";
    }
  }
  return {limit, source};
}

// Refuses to build when the cache folder's filesystem has no room for the file.
void CheckDiskRoom(const std::string& cache_dir, const std::string& key_text, int64_t n,
                   const std::string& asked) {
  struct statvfs fs;
  if (::statvfs(cache_dir.c_str(), &fs) != 0) return;  // the write itself will say why
  const long double need =
      static_cast<long double>(n) * kIndexBytesPerSample + key_text.size() + 64;
  const long double room = static_cast<long double>(fs.f_bavail) * fs.f_frsize;
  if (need > room)
    throw IoError(StrFormat(
        "%s: the blend index for %s needs %s on disk but only %s is free; "
        "free space or put the cache elsewhere (--cache-dir, [training] "
        "data_cache_dir)",
        cache_dir.c_str(), Asked(n, asked).c_str(), HumanBytes(static_cast<double>(need)).c_str(),
        HumanBytes(static_cast<double>(room)).c_str()));
}

}  // namespace

void CheckBlendIndexFits(int64_t n, const std::string& asked) {
  if (n < 0) throw UsageError(Asked(n, asked) + ": the number of samples must not be negative");
  const long double bytes = static_cast<long double>(n) * kIndexBytesPerSample;
  const auto [limit, source] = MemoryLimit();
  if (2 * bytes <= limit) return;
  throw UsageError(StrFormat(
      "%s needs %s of blend index (%lld bytes a sample, %s while it is built or read), more than "
      "the %s of %s; ask for fewer samples",
      Asked(n, asked).c_str(), HumanBytes(static_cast<double>(bytes)).c_str(),
      (long long)kIndexBytesPerSample, HumanBytes(static_cast<double>(2 * bytes)).c_str(),
      HumanBytes(static_cast<double>(limit)).c_str(), source.c_str()));
}

std::vector<double> BlendShares(const std::vector<double>& weights,
                                const std::vector<std::string>& where) {
  auto name = [&](size_t d) {
    return d < where.size() ? where[d] : "blend: weight " + std::to_string(d);
  };
  if (weights.empty() || weights.size() > 65535)
    throw DataError(StrFormat("blend: %zu datasets; a blend needs 1 to 65535", weights.size()));
  double total = 0, largest = 0;
  for (size_t d = 0; d < weights.size(); ++d) {
    if (!(weights[d] > 0) || !std::isfinite(weights[d]))
      throw DataError(name(d) + ": weight " + FormatDouble(weights[d]) +
                      " must be a positive finite number");
    total += weights[d];
    largest = std::max(largest, weights[d]);
  }
  std::vector<double> scaled = weights;
  if (!std::isfinite(total)) {
    // Scale by 2^-k (exact) so that the largest weight is below 1 and the sum below 65535.
    int exponent = 0;
    std::frexp(largest, &exponent);
    total = 0;
    for (double& w : scaled) {
      w = std::ldexp(w, -exponent);
      total += w;
    }
  }
  std::vector<double> shares(weights.size());
  for (size_t d = 0; d < weights.size(); ++d) {
    shares[d] = scaled[d] / total;
    if (!(shares[d] >= std::numeric_limits<double>::min()))
      throw DataError(StrFormat(
          "%s: weight %s is too small next to the largest, %s: its share of the blend cannot be "
          "represented as a double (below %.3g); raise the weight or drop the line",
          name(d).c_str(), FormatDouble(weights[d]).c_str(), FormatDouble(largest).c_str(),
          std::numeric_limits<double>::min()));
  }
  return shares;
}

void BuildBlendIndex(const std::vector<double>& weights, int64_t n, uint16_t* dataset_index,
                     int64_t* dataset_sample, const std::function<void(int64_t)>& heartbeat) {
  const std::vector<double> share = BlendShares(weights);
  const int datasets = static_cast<int>(share.size());
  double longest_gap = 1;
  for (int d = 0; d < datasets; ++d) longest_gap = std::max(longest_gap, 1.0 / share[d]);
  // Calendar ring for releases up to `ring` slots ahead; later ones wait in a heap.
  int64_t ring = 2;
  while (ring < static_cast<int64_t>(std::min(longest_gap + 2, 1048576.0))) ring *= 2;
  const int64_t mask = ring - 1;
  std::vector<int> head(ring, -1), next(datasets, -1);
  using Pending = std::pair<int64_t, int>;
  std::priority_queue<Pending, std::vector<Pending>, std::greater<Pending>> far;
  std::vector<int64_t> taken(datasets, 0);
  TournamentTree ready(datasets);
  for (int d = 0; d < datasets; ++d) ready.Set(d, 1.0 / share[d]);

  auto release = [&](int d) { ready.Set(d, static_cast<double>(taken[d] + 1) / share[d]); };
  auto drain = [&](int64_t slot) {
    int64_t bucket = slot & mask;
    for (int d = head[bucket]; d >= 0;) {
      int following = next[d];
      release(d);
      d = following;
    }
    head[bucket] = -1;
  };
  for (int64_t step = 0; step < n; ++step) {
    while (!far.empty() && far.top().first < step + ring) {
      auto [slot, d] = far.top();
      far.pop();
      if (slot <= step) {
        release(d);
      } else {
        next[d] = head[slot & mask];
        head[slot & mask] = d;
      }
    }
    drain(step);
    if (ready.top_key() == kNever) {
      // Only reachable through rounding when the weights' shares sum to slightly under one:
      // release the earliest pending dataset(s) early. Deterministic like everything else.
      int64_t slot = step + 1;
      while (slot < step + ring && head[slot & mask] < 0) ++slot;
      if (slot < step + ring) {
        drain(slot);
      } else {
        // Every dataset waits somewhere: the ring is empty here, so the heap is not (a guard
        // against a broken invariant, not a path valid shares take).
        if (far.empty()) throw Error(kExitFailure, "blend: internal error: no dataset is due");
        int64_t first = far.top().first;
        while (!far.empty() && far.top().first == first) {
          release(far.top().second);
          far.pop();
        }
      }
    }
    const int d = ready.top();
    const double due = ready.top_key();  // (taken + 1) / share, computed when d was released
    dataset_index[step] = static_cast<uint16_t>(d);
    dataset_sample[step] = taken[d]++;
    // Dataset d may take its next sample at the first step s with taken < (s + 1) share, and
    // taken / share is now exactly the due time it was just picked at.
    const int64_t slot = ReleaseSlot(due);
    if (slot <= step + 1) {
      release(d);
    } else {
      ready.Set(d, kNever);
      if (slot < step + 1 + ring) {
        next[d] = head[slot & mask];
        head[slot & mask] = d;
      } else {
        far.push({slot, d});
      }
    }
    if (heartbeat && (step & ((1 << 22) - 1)) == (1 << 22) - 1) heartbeat(step + 1);
  }
}

std::string BlendIndexPath(const std::string& cache_dir, const std::string& key_text) {
  return JoinPath(cache_dir,
                  "blend-" + HexU64(Hash64(key_text.data(), key_text.size())) + ".index");
}

BlendIndex LoadOrBuildBlendIndex(const std::string& cache_dir, const std::string& key_text,
                                 const std::vector<double>& weights, int64_t n, bool progress,
                                 const std::string& asked) {
  return LoadOrBuildIndex(
      cache_dir, key_text, weights.size(), n, progress, asked,
      [&weights](int64_t count, uint16_t* dataset_index, int64_t* dataset_sample,
                 const std::function<void(int64_t)>& heartbeat) {
        BuildBlendIndex(weights, count, dataset_index, dataset_sample, heartbeat);
      });
}

BlendIndex LoadOrBuildIndex(const std::string& cache_dir, const std::string& key_text,
                            size_t datasets, int64_t n, bool progress, const std::string& asked,
                            const BlendIndexBuilder& build) {
  CheckBlendIndexFits(n, asked);
  const std::string path = BlendIndexPath(cache_dir, key_text);
  BlendIndex index;
  std::string reason = "absent";
  auto try_read = [&]() {
    if (!FileExists(path)) {
      reason = "absent";
      return false;
    }
    return ParseCache(ReadFile(path), key_text, n, &index, &reason);
  };
  if (try_read()) {
    if (progress)
      PrintLine(
          StrFormat("phase=index status=cached samples=%lld path=%s", (long long)n, path.c_str()));
    return index;
  }
  MakeDirectories(cache_dir);
  FileLock lock(path + ".lock", progress);
  if (try_read()) {  // another process built it while we waited
    if (progress)
      PrintLine(
          StrFormat("phase=index status=cached samples=%lld path=%s", (long long)n, path.c_str()));
    return index;
  }
  // A builder that died while writing left <index>.tmp.<pid> (AtomicWriteFile's temporary): only
  // the lock holder writes one, so under the lock every such file is a dead builder's.
  const std::string leftover_prefix = path.substr(path.find_last_of('/') + 1) + ".tmp.";
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(cache_dir, error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(leftover_prefix, 0) != 0) continue;
    std::error_code size_error;
    const uintmax_t bytes = entry.file_size(size_error);
    if (std::filesystem::remove(entry.path(), size_error))
      LogInfo(
          StrFormat("removed %s (%s): left by a blend index build that stopped before it "
                    "finished",
                    entry.path().c_str(), HumanBytes(static_cast<double>(bytes)).c_str()));
  }
  CheckDiskRoom(cache_dir, key_text, n, asked);
  if (progress)
    PrintLine(
        StrFormat("phase=index status=building samples=%lld datasets=%zu reason=\"%s\" path=%s",
                  (long long)n, datasets, reason.c_str(), path.c_str()));
  Timer timer;
  index.dataset_index.resize(n);
  index.dataset_sample.resize(n);
  build(n, index.dataset_index.data(), index.dataset_sample.data(), [&](int64_t done) {
    if (progress)
      PrintLine(StrFormat("phase=index status=building done=%lld of=%lld", (long long)done,
                          (long long)n));
  });
  AtomicWriteFile(path, SerializeCache(key_text, index));
  if (progress)
    PrintLine(StrFormat("phase=index status=built samples=%lld seconds=%.3f", (long long)n,
                        timer.Seconds()));
  return index;
}

}  // namespace crucible
