// crucible yeet-rank: one node's side of `crucible yeet` (stage/yeet.h).
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"
#include "common/timer.h"
#include "distributed/communicator.h"
#include "distributed/mesh.h"
#include "distributed/stream_broadcast.h"
#include "launch/hostlist.h"
#include "launch/rank_environment.h"
#include "stage/archive.h"
#include "stage/file_stream.h"
#include "stage/manifest.h"
#include "stage/node_paths.h"
#include "stage/yeet.h"

namespace crucible {
namespace fs = std::filesystem;
namespace {

struct Phase {
  std::string name;
  double seconds = 0;
  uint64_t bytes = 0;
};

void RemoveTree(const std::string& path) {
  std::error_code ignored;
  fs::remove_all(path, ignored);
}

void MakeParent(const std::string& path) {
  const std::string parent = ParentDirectory(path);
  if (!parent.empty()) MakeDirectories(parent);
}

// Copies `from` to `to` (when a hard link is impossible: another filesystem).
void CopyFile(const std::string& from, const std::string& to) {
  std::error_code error;
  fs::copy_file(from, to, fs::copy_options::overwrite_existing, error);
  if (error) throw IoError("cannot copy " + from + " to " + to + ": " + error.message());
}

// The name the driver knows this node by: our own name when it is in CRUCIBLE_NODELIST, else
// (a local run calls itself by its host name) the list's entry at our rank.
std::string ReportedNode(const std::string& node, int rank, int size) {
  const char* list = std::getenv("CRUCIBLE_NODELIST");
  if (!list || !*list) return node;
  const std::vector<std::string> nodes = Split(list, ',');
  if (FindHost(nodes, node) >= 0) return nodes[static_cast<size_t>(FindHost(nodes, node))];
  if (static_cast<int>(nodes.size()) == size) return nodes[static_cast<size_t>(rank)];
  return node;
}

// Swaps the complete tree at `partial` in for `dir`: one atomic exchange when `dir` exists
// (renameat2 RENAME_EXCHANGE), else one rename; the old tree is deleted afterwards.
void SwapIn(const std::string& partial, const std::string& dir, const std::string& id) {
  MakeParent(dir);
  struct stat info;
  if (lstat(dir.c_str(), &info) != 0) {
    if (rename(partial.c_str(), dir.c_str()) != 0) ThrowErrno("cannot rename " + partial);
    return;
  }
  if (renameat2(AT_FDCWD, partial.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    RemoveTree(partial);  // now the old tree
    return;
  }
  // No RENAME_EXCHANGE on this filesystem: move the old tree aside, then the new one in.
  const std::string old = dir + ".old-" + id;
  if (rename(dir.c_str(), old.c_str()) != 0) ThrowErrno("cannot move " + dir + " aside");
  if (rename(partial.c_str(), dir.c_str()) != 0) {
    const int saved = errno;
    rename(old.c_str(), dir.c_str());
    errno = saved;
    ThrowErrno("cannot rename " + partial + " to " + dir);
  }
  RemoveTree(old);
}

std::string Rate(uint64_t bytes, double seconds) {
  return StrFormat("%.1f", seconds > 0 ? bytes / 1e6 / seconds : 0.0);
}

}  // namespace

bool YeetFailureInjected(const std::string& spec, const std::string& node, int attempt) {
  for (const std::string& item : Split(spec, ',')) {
    if (Trim(item).empty()) continue;
    const size_t colon = item.rfind(':');
    const std::string name = Trim(item.substr(0, colon));
    const std::string count = colon == std::string::npos ? "" : Trim(item.substr(colon + 1));
    char* end = nullptr;
    const long tries = std::strtol(count.c_str(), &end, 10);
    if (name.empty() || (count != "always" && (count.empty() || *end != '\0' || tries < 1)))
      throw UsageError("CRUCIBLE_YEET_FAIL: '" + item +
                       "': expected NODE:TRIES or NODE:always, e.g. n2:1,n3:always");
    if (NormalizeHost(name) != NormalizeHost(node)) continue;
    if (count == "always" || attempt <= tries) return true;
  }
  return false;
}

int RunYeetRank(const YeetRankOptions& options) {
  auto mesh =
      ProcessMesh::Create(std::vector<MeshDimension>{{"world", -1}}, options.timeout_seconds);
  Communicator& world = mesh->world();
  const int rank = world.rank(), size = world.size();
  char hostname[256] = {0};
  gethostname(hostname, sizeof(hostname) - 1);
  // SLURMD_NODENAME under Slurm, else the short host name: what %N becomes.
  const std::string node = RankIdentityFromEnvironment(CurrentEnvironment(), hostname).node;
  const std::string reported = ReportedNode(node, rank, size);
  const std::string dir = ExpandNodeName(options.destination, node);
  const std::string partial = dir + ".partial-" + options.yeet_id;
  const char* fail_spec = std::getenv("CRUCIBLE_YEET_FAIL");
  const bool injected = fail_spec && YeetFailureInjected(fail_spec, reported, options.attempt);
  std::string failure;  // this node's, "" while it is fine
  std::vector<Phase> phases;
  uint64_t bytes_read = 0, bytes_sent = 0;
  auto say = [&](const Phase& phase, const std::string& extra) {
    phases.push_back(phase);
    if (rank != 0) return;
    std::fprintf(stderr,
                 "crucible yeet: phase=%s %sbytes=%llu seconds=%.3f MB/s=%s nodes_done=0/%d\n",
                 phase.name.c_str(), extra.c_str(), (unsigned long long)phase.bytes, phase.seconds,
                 Rate(phase.bytes, phase.seconds).c_str(), size);
    std::fflush(stderr);
  };

  // Launch: from the driver starting the job to every rank having joined MPI.
  if (options.started_at > 0) {
    world.Barrier("yeet started");
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    say({"launch", std::max(0.0, now.tv_sec + now.tv_nsec * 1e-9 - options.started_at), 0}, "");
  }

  // Scan: what this node holds; rank 0 also hashes the sources. Both remember their hashes in
  // the work dir's cache (stage/manifest.h, HashCache), so unchanged files are not read again.
  Timer scan_timer;
  uint64_t held_bytes = 0;
  Manifest held;
  const std::string cache_tag =
      StrFormat("%016llx", (unsigned long long)XXH3_64bits(dir.data(), dir.size()));
  HashCache held_cache(options.cache_dir.empty()
                           ? ""
                           : JoinPath(options.cache_dir, "node-" + reported + "-" + cache_tag),
                       HashCache::kNodeTree);
  try {
    held = ScanTree(dir, &held_bytes, &held_cache);
    held_cache.Save();
  } catch (const Error&) {
    held.clear();  // unreadable: everything is sent again
  }
  std::string plan;
  Manifest source;
  if (rank == 0) {
    try {
      std::string joined;
      for (const std::string& path : options.sources) joined += path + "\n";
      HashCache source_cache(
          options.cache_dir.empty()
              ? ""
              : JoinPath(options.cache_dir,
                         StrFormat("sources-%016llx",
                                   (unsigned long long)XXH3_64bits(joined.data(), joined.size()))),
          HashCache::kSources);
      source = ScanSources(options.sources, &bytes_read, &source_cache);
      source_cache.Save();
      plan = SerializeManifest(source);
    } catch (const Error& e) {
      plan = std::string("error ") + e.what();
    }
  }
  world.BroadcastString(&plan, 0, "yeet manifest");
  if (StartsWith(plan, "error ")) {
    if (rank == 0) throw UsageError(plan.substr(6));
    return kExitFailure;
  }
  if (rank != 0) source = ParseManifest(plan);  // rank 0 keeps its entries' source paths
  // The files some node lacks: each rank flags its own, the element-wise maximum is the union.
  const std::vector<size_t> missing = MissingEntries(source, held);
  std::vector<uint8_t> flags(source.size(), 0);
  for (size_t i : missing) flags[i] = 1;
  if (!flags.empty()) world.AllReduceMaxBytes(flags.data(), flags.size(), "yeet missing files");
  std::vector<size_t> needed;
  for (size_t i = 0; i < flags.size(); ++i)
    if (flags[i]) needed.push_back(i);
  say({"scan", scan_timer.Seconds(), bytes_read + held_bytes},
      StrFormat("files=%zu ", source.size()));

  // This node's new tree: unchanged files hard-linked from DIR, the rest from the stream.
  const std::set<size_t> mine(missing.begin(), missing.end());
  try {
    RemoveTree(partial);
    MakeDirectories(partial);
    for (size_t i = 0; i < source.size(); ++i) {
      if (mine.count(i)) continue;
      const std::string from = JoinPath(dir, source[i].path),
                        to = JoinPath(partial, source[i].path);
      MakeParent(to);
      if (link(from.c_str(), to.c_str()) != 0) CopyFile(from, to);
    }
  } catch (const Error& e) {
    failure = e.what();
  }

  Timer broadcast_timer;
  uint64_t total = 0;
  for (size_t i : needed) total += source[i].size;
  double read_seconds = 0;
  uint64_t writer_verified = 0;
  if (options.transport == "sbcast") {
    SbcastStream send{source, needed, total, options.chunk_bytes,
                      SbcastStagingPath(options.destination, options.yeet_id)};
    world.Barrier("yeet partial trees");  // every node's folder for the staged file exists
    std::string outcome;
    if (rank == 0) {
      Timer t;
      try {
        if (total > 0) send.Pack();
        read_seconds = t.Seconds();
        if (total > 0) send.Broadcast();
      } catch (const Error& e) {
        outcome = std::string("error ") + e.what();
      }
      send.RemovePack();
    }
    world.BroadcastString(&outcome, 0, "yeet sbcast");
    if (StartsWith(outcome, "error ")) {
      if (failure.empty()) failure = "sbcast transport: " + outcome.substr(6);
    } else if (total > 0) {
      StreamWriter writer(source, needed, mine, partial, &failure);
      try {
        send.Unpack(&writer);
      } catch (const Error& e) {
        if (failure.empty()) failure = e.what();
      }
      writer.Finish();
      writer_verified = writer.verified_bytes();
    }
    world.Barrier("yeet sbcast read");  // on a shared filesystem, every node reads one file
    unlink(send.staged.c_str());
  } else {
    StreamReader reader(source, needed);
    StreamWriter writer(source, needed, mine, partial, &failure);
    BroadcastStream(
        total, options.chunk_bytes,
        [&](char* data, size_t n) {
          Timer t;
          reader.Produce(data, n);
          read_seconds += t.Seconds();
        },
        [&](const char* data, size_t n) { writer.Consume(data, n); });
    writer.Finish();
    writer_verified = writer.verified_bytes();
  }
  if (rank == 0) bytes_read += total, bytes_sent = total;
  say({"read", read_seconds, rank == 0 ? total : 0}, "");
  say({"broadcast", broadcast_timer.Seconds(), total}, StrFormat("files=%zu ", needed.size()));

  // Verify every file of the new tree against the manifest. The received files were hashed as
  // they were written (StreamWriter); a hard-linked one is the very file (inode) the scan of DIR
  // hashed; only a copied one (DIR on another filesystem than its parent) is read back.
  Timer verify_timer;
  uint64_t verified = writer_verified, reread = 0;
  std::map<std::string, const ManifestEntry*> held_by_path;
  for (const ManifestEntry& e : held) held_by_path[e.path] = &e;
  for (size_t i = 0; i < source.size() && failure.empty(); ++i) {
    const std::string path = JoinPath(partial, source[i].path);
    try {
      if (!mine.count(i)) {
        struct stat info;
        if (lstat(path.c_str(), &info) != 0) ThrowErrno("cannot stat " + path);
        const ManifestEntry* was = held_by_path.at(source[i].path);
        if (static_cast<uint64_t>(info.st_ino) != was->inode) {
          uint64_t bytes = 0;
          const uint64_t hash = HashFile(path, &bytes);
          reread += bytes;
          if (hash != source[i].hash || bytes != source[i].size)
            failure = StrFormat(
                "%s: content differs from the source after the copy (%llu bytes, "
                "hash %016llx, expected %llu bytes, %016llx)",
                source[i].path.c_str(), (unsigned long long)bytes, (unsigned long long)hash,
                (unsigned long long)source[i].size, (unsigned long long)source[i].hash);
        } else if (static_cast<uint64_t>(info.st_size) != source[i].size) {
          failure = source[i].path + ": changed in " + dir + " while it was being staged";
        }
        verified += source[i].size;
      }
      if (failure.empty() && chmod(path.c_str(), source[i].mode) != 0)
        ThrowErrno("cannot chmod " + path);
    } catch (const Error& e) {
      failure = e.what();
    }
  }
  say({"verify", verify_timer.Seconds(), verified},
      StrFormat("reread=%llu ", (unsigned long long)reread));

  // Unpack the archives next to themselves: DIR/<name without extension>/.
  Timer unpack_timer;
  uint64_t unpacked = 0;
  for (size_t i = 0; i < source.size() && failure.empty(); ++i) {
    if (!IsArchive(source[i].path)) continue;
    try {
      const std::string folder = JoinPath(partial, ArchiveStem(source[i].path));
      MakeDirectories(folder);
      unpacked +=
          static_cast<uint64_t>(UnpackArchive(JoinPath(partial, source[i].path), folder).bytes);
    } catch (const Error& e) {
      failure = e.what();
    }
  }
  say({"unpack", unpack_timer.Seconds(), unpacked}, "");

  Timer rename_timer;
  if (failure.empty() && injected)
    failure =
        StrFormat("injected failure on try %d (CRUCIBLE_YEET_FAIL test switch)", options.attempt);
  if (failure.empty()) {
    try {
      SwapIn(partial, dir, options.yeet_id);
    } catch (const Error& e) {
      failure = e.what();
    }
  }
  if (!failure.empty()) RemoveTree(partial);
  const std::string hash = ManifestHash(source);
  std::string status = failure.empty() ? "done " + reported + " " + hash + " " + dir
                                       : "failed " + reported + " " + failure;
  std::replace(status.begin(), status.end(), '\n', ' ');
  AtomicWriteFile(JoinPath(options.status_dir, reported), status + "\n");
  if (!failure.empty())
    std::fprintf(stderr, "crucible yeet: node %s failed: %s\n", reported.c_str(), failure.c_str());
  world.Barrier("yeet done");
  if (rank == 0) {
    int done = 0;
    std::error_code error;
    for (const auto& item : fs::directory_iterator(options.status_dir, error)) {
      try {
        if (StartsWith(ReadFile(item.path().string()), "done ")) ++done;
      } catch (const Error&) {
      }
    }
    Phase phase{"rename", rename_timer.Seconds(), 0};
    phases.push_back(phase);
    std::fprintf(stderr, "crucible yeet: phase=rename seconds=%.3f nodes_done=%d/%d manifest=%s\n",
                 phase.seconds, done, size, hash.c_str());
    nlohmann::json stats = {{"bytes_read", bytes_read},
                            {"bytes_sent", bytes_sent},
                            {"files_sent", needed.size()},
                            {"manifest_hash", hash},
                            {"phases", nlohmann::json::array()}};
    for (const Phase& p : phases)
      stats["phases"].push_back({{"name", p.name}, {"seconds", p.seconds}, {"bytes", p.bytes}});
    if (!options.stats_path.empty()) AtomicWriteFile(options.stats_path, stats.dump() + "\n");
  }
  return failure.empty() ? kExitOk : kExitFailure;
}

}  // namespace crucible
