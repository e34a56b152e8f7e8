#include "ckpt/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>

#include "ckpt/model_weights.h"
#include "ckpt/safetensors.h"
#include "common/error.h"
#include "common/files.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/timer.h"

namespace crucible {
namespace {

constexpr const char* kManifestHeader = "# crucible checkpoint manifest v1: xxh3-128 bytes file";

// A file written once, front to back, hashed on the way out; fsynced and closed by Finish().
class ChecksummedFile {
 public:
  ChecksummedFile(const std::string& dir, const std::string& name, const ProgressFn& progress)
      : path_(JoinPath(dir, name)), name_(name), progress_(progress) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0) ThrowErrno("cannot create " + path_);
  }
  ~ChecksummedFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  ChecksummedFile(const ChecksummedFile&) = delete;
  ChecksummedFile& operator=(const ChecksummedFile&) = delete;

  void Write(const void* data, size_t size) {
    const char* bytes = static_cast<const char*>(data);
    constexpr size_t kChunk = size_t{64} << 20;
    while (size > 0) {
      size_t chunk = std::min(size, kChunk);
      hasher_.Update(bytes, chunk);
      size_t written = 0;
      while (written < chunk) {
        ssize_t n = ::write(fd_, bytes + written, chunk - written);
        if (n < 0) {
          if (errno == EINTR) continue;
          ThrowErrno("cannot write " + path_);
        }
        written += static_cast<size_t>(n);
      }
      bytes_ += chunk;
      bytes += chunk;
      size -= chunk;
      if (progress_ && heartbeat_.Seconds() > 2.0) {
        progress_(StrFormat("phase=checkpoint status=writing file=%s bytes=%s", name_.c_str(),
                            HumanBytes(static_cast<double>(bytes_)).c_str()));
        heartbeat_.Reset();
      }
    }
  }
  void Write(const std::string& text) { Write(text.data(), text.size()); }

  CheckpointFileInfo Finish() {
    if (::fsync(fd_) != 0) ThrowErrno("cannot write " + path_ + " (fsync)");
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) ThrowErrno("cannot write " + path_ + " (close)");
    return {name_, hasher_.HexDigest128(), bytes_};
  }

 private:
  std::string path_, name_;
  ProgressFn progress_;
  int fd_ = -1;
  StreamHasher hasher_;
  uint64_t bytes_ = 0;
  Timer heartbeat_;
};

CheckpointFileInfo WriteTensorsFile(const std::string& dir, const std::string& name,
                                    const std::vector<TensorView>& views,
                                    const std::map<std::string, std::string>& metadata,
                                    const ProgressFn& progress) {
  ChecksummedFile file(dir, name, progress);
  file.Write(EncodeSafetensorsHeader(views, metadata));
  for (const auto& v : views) {
    size_t numel = 1;
    for (int64_t s : v.shape) numel *= static_cast<size_t>(s);
    file.Write(v.data, numel * sizeof(float));
  }
  return file.Finish();
}

CheckpointFileInfo WriteTextFile(const std::string& dir, const std::string& name,
                                 const std::string& text) {
  ChecksummedFile file(dir, name, nullptr);
  file.Write(text);
  return file.Finish();
}

void RenameOrThrow(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) ThrowErrno("cannot rename " + from + " to " + to);
}

// Optimizer tensor names: "<state>.<parameter name>" when the optimizer covers the whole
// parameter buffer; a flat "<state>" tensor otherwise (a shard).
bool CoversWholeTable(const ParameterTable& table, size_t begin, size_t size) {
  return begin == 0 && size == table.total();
}

bool Carries(const std::vector<bool>& carried, size_t tensor) {
  return carried.empty() || carried[tensor];
}

// Where each carrying tensor's floats of an optimizer state start in its buffer: the carrying
// tensors concatenated in table order (kNone for the others). Checks the buffer's size.
constexpr size_t kNone = static_cast<size_t>(-1);
std::vector<size_t> StateOffsets(const ParameterTable& table, const std::string& name,
                                 size_t per_tensor, const std::vector<bool>& carried, size_t size) {
  if (!carried.empty() && carried.size() != table.params().size())
    throw Error(kExitFailure, StrFormat("internal: optimizer state %s marks %zu of %zu tensors",
                                        name.c_str(), carried.size(), table.params().size()));
  std::vector<size_t> offsets;
  size_t at = 0;
  for (size_t t = 0; t < table.params().size(); ++t) {
    offsets.push_back(Carries(carried, t) ? at : kNone);
    if (Carries(carried, t)) at += per_tensor > 0 ? per_tensor : table.params()[t].numel;
  }
  if (size != at)
    throw Error(kExitFailure,
                StrFormat("internal: optimizer state %s has %zu floats, not the %zu of the "
                          "tensors that carry it",
                          name.c_str(), size, at));
  return offsets;
}

std::vector<int64_t> StateShape(const ParamInfo& param, size_t per_tensor) {
  return per_tensor > 0 ? std::vector<int64_t>{static_cast<int64_t>(per_tensor)} : param.shape;
}

// A tensor that does not carry state `name` may have an entry from a checkpoint written when
// every tensor held every state: it must be all zeros (what that code kept there).
void CheckUncarriedEntryIsZero(const SafetensorsReader& file, const std::string& entry,
                               const std::vector<int64_t>& shape) {
  if (!file.Find(entry)) return;
  size_t count = 1;
  for (int64_t d : shape) count *= static_cast<size_t>(d);
  std::vector<float> values(count);
  file.ReadFloat32(entry, shape, values.data());
  for (size_t k = 0; k < count; ++k)
    if (values[k] != 0.0f || std::signbit(values[k]))
      throw DataError(StrFormat(
          "%s: optimizer state %s has a non-zero value (%g at element %zu), but this optimizer "
          "keeps no such state for that tensor; the checkpoint was not written by this "
          "optimizer's configuration",
          file.source().c_str(), entry.c_str(), static_cast<double>(values[k]), k));
}

// DataError when values[0, count), tensor `entry` of `file` in checkpoint `dir` of step `step`,
// hold a NaN or an infinity (training from them would only give non-finite updates), naming the
// newest checkpoint from before it to roll back to.
void RequireFinite(const std::string& dir, int64_t step, const std::string& file,
                   const std::string& entry, const float* values, size_t count) {
  size_t bad = 0;
  for (size_t i = 0; i < count; ++i) bad += !std::isfinite(values[i]);
  if (bad == 0) return;
  const std::string before = NewestCheckpointBefore(ParentDirectory(dir), step);
  throw DataError(StrFormat(
      "%s/%s: tensor '%s' holds %zu non-finite value%s (NaN or infinity) of %zu: training from "
      "this checkpoint would only give non-finite updates; %s",
      dir.c_str(), file.c_str(), entry.c_str(), bad, bad == 1 ? "" : "s", count,
      before.empty() ? "no checkpoint from before it is kept: start over with --resume none"
                     : ("roll back to " + before + " (--resume " + before + ")").c_str()));
}

std::string ReadSmallFile(const std::string& path) {
  try {
    return ReadConfigFile(path);
  } catch (const Error&) {
    return "";
  }
}

constexpr const char* kWriterRecord = "WRITER";

// What the pid numbers of a WRITER record are relative to: the host, its boot, the pid namespace.
struct HostIdentity {
  std::string host, boot_id, pid_namespace;
};

const HostIdentity& ThisHost() {
  static const HostIdentity identity = [] {
    HostIdentity id;
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    id.host = host;
    id.boot_id = Trim(ReadSmallFile("/proc/sys/kernel/random/boot_id"));
    char ns[128] = {};
    const ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
    if (n > 0) id.pid_namespace.assign(ns, n);
    return id;
  }();
  return identity;
}

// Field 22 of /proc/<pid>/stat (clock ticks after boot), or "" when unreadable.
std::string ProcessStartTime(int pid) {
  const std::string stat = ReadSmallFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t comm_end = stat.rfind(')');
  if (comm_end == std::string::npos) return "";
  std::vector<std::string> fields = Split(Trim(stat.substr(comm_end + 1)), ' ');
  return fields.size() > 19 ? fields[19] : "";  // the fields after the comm start at field 3
}

// Why the writer of a temporary folder is known to be gone, or "" (with *kept saying why not).
std::string WhyWriterIsGone(const std::string& record, std::string* kept) {
  std::map<std::string, std::string> fields;
  for (const std::string& line : Split(record, '\n')) {
    const size_t equals = line.find('=');
    if (equals != std::string::npos) fields[line.substr(0, equals)] = line.substr(equals + 1);
  }
  for (const char* key : {"host", "boot_id", "pid_namespace", "pid", "start_time"}) {
    if (fields[key].empty()) {
      *kept = std::string("its WRITER record has no ") + key;
      return "";
    }
  }
  const HostIdentity& here = ThisHost();
  if (fields["host"] != here.host) {
    *kept = "written on host " + fields["host"] + ", which cannot be checked from here";
    return "";
  }
  if (fields["boot_id"] != here.boot_id) {
    *kept = "written on a host named " + fields["host"] + " in another boot (or another machine)";
    return "";
  }
  if (fields["pid_namespace"] != here.pid_namespace) {
    *kept = "written in another pid namespace (" + fields["pid_namespace"] + ")";
    return "";
  }
  const int pid = std::atoi(fields["pid"].c_str());
  if (pid <= 0 || pid == ::getpid()) {
    *kept = pid <= 0 ? "its WRITER record has a bad pid" : "written by this process";
    return "";
  }
  const std::string writer = StrFormat("pid %d (start time %s)", pid, fields["start_time"].c_str());
  if (::kill(pid, 0) != 0 && errno == ESRCH) return "its writer, " + writer + ", is not running";
  const std::string now = ProcessStartTime(pid);
  if (now.empty()) {
    *kept = "its writer, " + writer + ", may be running (its start time cannot be read)";
    return "";
  }
  if (now != fields["start_time"])
    return "its writer, " + writer + ", is gone: pid " + fields["pid"] +
           " now runs a process started at " + now;
  *kept = "its writer, " + writer + ", is running";
  return "";
}

uint64_t TreeBytes(const std::string& path) {
  uint64_t bytes = 0;
  std::error_code error;
  for (auto it = std::filesystem::recursive_directory_iterator(path, error);
       !error && it != std::filesystem::recursive_directory_iterator(); it.increment(error)) {
    std::error_code size_error;
    if (it->is_regular_file(size_error)) bytes += it->file_size(size_error);
  }
  return bytes;
}

}  // namespace

std::string CheckpointDirName(int64_t step) {
  return "step-" + std::to_string(step);
}

std::string CheckpointWriterRecord(int pid) {
  const std::string start_time = ProcessStartTime(pid);
  if (start_time.empty()) return "";
  const HostIdentity& here = ThisHost();
  return StrFormat("host=%s\nboot_id=%s\npid_namespace=%s\npid=%d\nstart_time=%s\n",
                   here.host.c_str(), here.boot_id.c_str(), here.pid_namespace.c_str(), pid,
                   start_time.c_str());
}

std::vector<std::string> RemoveStaleCheckpointTemporaries(const std::string& root) {
  static std::mutex reported_mutex;
  static std::set<std::string> reported;  // folders kept, already said so
  std::vector<std::string> removed;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(root, error)) {
    const std::string name = entry.path().filename().string();
    std::error_code type_error;
    if (name.rfind(".tmp-step-", 0) != 0 || !entry.is_directory(type_error)) continue;
    const std::string dir = entry.path().string();
    const std::string record_path = JoinPath(dir, kWriterRecord);
    std::string kept = "it has no WRITER record (a save from an older crucible, or one just begun)";
    const std::string gone =
        FileExists(record_path) ? WhyWriterIsGone(ReadSmallFile(record_path), &kept) : "";
    if (gone.empty()) {
      std::lock_guard<std::mutex> lock(reported_mutex);
      if (reported.insert(dir).second)
        LogInfo("kept temporary checkpoint folder " + dir + ": " + kept);
      continue;
    }
    const uint64_t bytes = TreeBytes(dir);
    RemoveTree(dir);
    if (FileExists(dir)) continue;
    LogInfo(StrFormat("removed stale temporary checkpoint folder %s (%s): %s", dir.c_str(),
                      HumanBytes(static_cast<double>(bytes)).c_str(), gone.c_str()));
    removed.push_back(dir);
  }
  return removed;
}

void RemoveTree(const std::string& path) {
  std::error_code error;
  std::filesystem::remove_all(path, error);
}

SaveStats WriteCheckpoint(const std::string& root, const CheckpointSnapshot& snapshot,
                          const ParameterTable& table, const ModelSpec& model,
                          const ProgressFn& progress) {
  Timer timer;
  MakeDirectories(root);
  const std::string name = CheckpointDirName(snapshot.step);
  const std::string temporary = JoinPath(root, ".tmp-" + name + "." + std::to_string(::getpid()));
  const std::string final_dir = JoinPath(root, name);
  RemoveTree(temporary);  // a leftover of this very process: never a published checkpoint
  RemoveStaleCheckpointTemporaries(root);
  if (::mkdir(temporary.c_str(), 0755) != 0) ThrowErrno("cannot create " + temporary);
  SaveStats stats;
  try {
    AtomicWriteFile(JoinPath(temporary, kWriterRecord), CheckpointWriterRecord(::getpid()));
    if (snapshot.weights.size() != table.total())
      throw Error(kExitFailure, "internal: checkpoint snapshot has the wrong number of weights");
    std::vector<CheckpointFileInfo> files;

    std::vector<TensorView> views;
    for (const auto& p : table.params())
      views.push_back({p.name, p.shape, snapshot.weights.data() + p.offset});
    files.push_back(WriteTensorsFile(temporary, "model.safetensors", views,
                                     ModelWeightsMetadata(model), progress));

    views.clear();
    std::map<std::string, std::string> optimizer_metadata = {
        {"format", "pt"}, {"crucible.optimizer_begin", std::to_string(snapshot.optimizer_begin)}};
    for (const auto& [state_name, buffer, per_tensor, carried] : snapshot.optimizer_state) {
      if (per_tensor == 0 && carried.empty() &&
          !CoversWholeTable(table, snapshot.optimizer_begin, buffer.size())) {
        views.push_back({state_name, {static_cast<int64_t>(buffer.size())}, buffer.data()});
        continue;
      }
      const std::vector<size_t> offsets =
          StateOffsets(table, state_name, per_tensor, carried, buffer.size());
      for (size_t t = 0; t < table.params().size(); ++t)
        if (offsets[t] != kNone)
          views.push_back({state_name + "." + table.params()[t].name,
                           StateShape(table.params()[t], per_tensor), buffer.data() + offsets[t]});
    }
    files.push_back(
        WriteTensorsFile(temporary, "optimizer.safetensors", views, optimizer_metadata, progress));
    files.push_back(WriteTextFile(temporary, "state.json", snapshot.state.dump(2) + "\n"));
    files.push_back(WriteTextFile(temporary, "config.toml", snapshot.config_toml));

    std::string manifest = std::string(kManifestHeader) + "\n";
    for (const auto& f : files) {
      manifest +=
          StrFormat("%s %llu %s\n", f.xxh3.c_str(), (unsigned long long)f.bytes, f.name.c_str());
      stats.bytes += f.bytes;
    }
    CheckpointFileInfo manifest_info = WriteTextFile(temporary, "MANIFEST", manifest);
    WriteTextFile(temporary, "COMPLETE",
                  StrFormat("step=%lld\nmanifest_xxh3=%s\n", (long long)snapshot.step,
                            manifest_info.xxh3.c_str()));
    // The record only marks an unfinished save; the published folder holds the checkpoint alone.
    if (::unlink(JoinPath(temporary, kWriterRecord).c_str()) != 0)
      ThrowErrno("cannot remove " + JoinPath(temporary, kWriterRecord));
    FsyncDirectory(temporary);

    if (FileExists(final_dir)) {  // left by an earlier attempt: keep it as evidence
      std::string aside;
      for (int k = 1;; ++k) {
        aside = final_dir + ".replaced-" + std::to_string(k);
        if (!FileExists(aside)) break;
      }
      RenameOrThrow(final_dir, aside);
    }
    RenameOrThrow(temporary, final_dir);
    FsyncDirectory(root);
  } catch (...) {
    RemoveTree(temporary);
    throw;
  }
  AtomicWriteFile(JoinPath(root, "latest"), name + "\n");
  stats.path = final_dir;
  stats.seconds = timer.Seconds();
  return stats;
}

std::vector<std::pair<int64_t, std::string>> ListCheckpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code error;
  if (!IsDirectory(root)) return found;
  for (const auto& entry : std::filesystem::directory_iterator(root, error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) != 0 || name.size() == 5 || name.size() > 24) continue;
    if (!std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    if (!entry.is_directory(error)) continue;
    found.push_back({std::stoll(name.substr(5)), entry.path().string()});
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  return found;
}

std::string NewestCheckpointBefore(const std::string& root, int64_t step) {
  for (const auto& [found, dir] : ListCheckpoints(root))
    if (found < step && VerifyCheckpoint(dir, VerifyDepth::kSizes).empty()) return dir;
  return "";
}

std::string VerifyCheckpoint(const std::string& dir, VerifyDepth depth) {
  if (!IsDirectory(dir)) return dir + ": not a folder";
  const std::string complete_path = JoinPath(dir, "COMPLETE");
  if (!FileExists(complete_path)) return "COMPLETE is missing (the save never finished)";
  std::string expected_manifest_hash;
  for (const auto& line : Split(ReadSmallFile(complete_path), '\n')) {
    if (line.rfind("manifest_xxh3=", 0) == 0) expected_manifest_hash = Trim(line.substr(14));
  }
  if (expected_manifest_hash.empty()) return "COMPLETE: no manifest_xxh3= line (corrupt)";
  const std::string manifest_path = JoinPath(dir, "MANIFEST");
  if (!FileExists(manifest_path)) return "MANIFEST is missing";
  std::string manifest_hash = HashFileHex(manifest_path);
  if (manifest_hash != expected_manifest_hash)
    return "MANIFEST: checksum " + manifest_hash + " does not match " + expected_manifest_hash +
           " recorded in COMPLETE (corrupt)";
  int listed = 0;
  bool has_model = false, has_state = false;
  for (const auto& line : Split(ReadSmallFile(manifest_path), '\n')) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> fields = Split(line, ' ');
    if (fields.size() != 3) return "MANIFEST: malformed line '" + line + "'";
    const std::string& file = fields[2];
    if (file.find('/') != std::string::npos || file == ".." || file == ".")
      return "MANIFEST: bad file name '" + file + "'";
    const std::string path = JoinPath(dir, file);
    if (!FileExists(path)) return file + ": missing (listed in MANIFEST)";
    std::error_code error;
    uint64_t bytes = std::filesystem::file_size(path, error);
    if (error) return file + ": cannot stat (" + error.message() + ")";
    if (std::to_string(bytes) != fields[1])
      return file + ": " + std::to_string(bytes) + " bytes, MANIFEST says " + fields[1] +
             " (truncated or overwritten)";
    has_model = has_model || file == "model.safetensors";
    has_state = has_state || file == "state.json";
    ++listed;
    if (depth == VerifyDepth::kSizes) continue;
    std::string hash;
    try {
      hash = HashFileHex(path);
    } catch (const Error& e) {
      return file + ": " + e.what();
    }
    if (hash != fields[0])
      return file + ": checksum " + hash + " does not match MANIFEST " + fields[0] + " (corrupt)";
  }
  if (!has_model || !has_state) return "MANIFEST: does not list model.safetensors and state.json";
  (void)listed;
  return "";
}

namespace {

// The newest step folder under `root` that verifies (nullopt when none does); `latest` is read as
// a hint (its problems go to `report`), and each folder that fails goes to `unusable` (folder,
// reason), newest first. *folders is the number of step folders.
std::optional<std::string> FindNewestVerifiedCheckpoint(
    const std::string& root, const std::function<void(const std::string&)>& report,
    const std::function<void(const std::string&, const std::string&)>& unusable, size_t* folders) {
  auto checkpoints = ListCheckpoints(root);
  *folders = checkpoints.size();
  const std::string latest_path = JoinPath(root, "latest");
  std::string latest;
  if (FileExists(latest_path)) latest = Trim(ReadSmallFile(latest_path));
  if (checkpoints.empty()) {
    if (!latest.empty())
      report(latest_path + " names " + latest + " but " + root + " holds no step folder");
    return std::nullopt;
  }
  if (latest.empty()) {
    report(latest_path + " is missing; choosing the newest checkpoint that verifies by scanning " +
           root);
  } else if (!IsDirectory(JoinPath(root, latest))) {
    report(latest_path + " names " + latest + ", which does not exist; scanning " + root);
  } else if (JoinPath(root, latest) != checkpoints.front().second) {
    report(latest_path + " names " + latest + " but " + checkpoints.front().second +
           " is newer (a save that stopped before updating latest?); verifying newest first");
  }
  for (const auto& [step, dir] : checkpoints) {
    std::string failure = VerifyCheckpoint(dir);
    if (failure.empty()) return dir;
    unusable(dir, failure);
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> FindResumeCheckpoint(
    const std::string& root, const std::function<void(const std::string&)>& report) {
  std::vector<std::string> failures;
  size_t folders = 0;
  std::optional<std::string> found = FindNewestVerifiedCheckpoint(
      root, report,
      [&](const std::string& dir, const std::string& failure) {
        report("checkpoint " + dir + " is unusable: " + failure +
               "; falling back to the one before");
        failures.push_back(dir + ": " + failure);
      },
      &folders);
  if (found || folders == 0) return found;
  throw DataError(
      StrFormat("%s: none of the %zu checkpoints verifies (newest: %s); nothing was "
                "deleted. Pass --resume none to start over or --resume PATH",
                root.c_str(), folders, failures.front().c_str()));
}

RunWeights FindRunWeights(const std::string& run_dir, const std::string& verb,
                          const std::function<void(const std::string&)>& report) {
  const std::string config_path = JoinPath(run_dir, "config.toml");
  const Config config = Config::Parse(ReadConfigFile(config_path), config_path);
  const std::string root = JoinPath(run_dir, config.String("checkpoint.folder"));
  std::vector<std::pair<std::string, std::string>> skipped;  // (folder, reason)
  size_t folders = 0;
  std::optional<std::string> checkpoint = FindNewestVerifiedCheckpoint(
      root, report,
      [&](const std::string& dir, const std::string& failure) {
        report("checkpoint " + dir + " is unusable: " + failure + "; skipped");
        skipped.emplace_back(dir, failure);
      },
      &folders);
  if (checkpoint)
    return {JoinPath(*checkpoint, "model.safetensors"), JoinPath(*checkpoint, "config.toml")};
  const std::string final_model = JoinPath(run_dir, "model.safetensors");
  if (FileExists(final_model)) {
    if (!skipped.empty()) {
      std::string names;
      for (const auto& [dir, failure] : skipped)
        names += (names.empty() ? "" : ", ") + dir.substr(dir.find_last_of('/') + 1);
      report(
          StrFormat("%s: none of the %zu checkpoints under %s verifies (skipped: %s); using "
                    "the run's final model %s",
                    run_dir.c_str(), folders, root.c_str(), names.c_str(), final_model.c_str()));
    }
    return {final_model, config_path};
  }
  if (skipped.empty())
    throw UsageError(run_dir + ": has no checkpoint and no final model.safetensors");
  throw DataError(StrFormat(
      "%s: nothing to %s: none of the %zu checkpoints under %s verifies (newest: %s: %s) and the "
      "run has no final model.safetensors; nothing was deleted. Name a checkpoint folder or a "
      "Hugging Face folder instead",
      run_dir.c_str(), verb.c_str(), folders, root.c_str(), skipped.front().first.c_str(),
      skipped.front().second.c_str()));
}

nlohmann::json LoadCheckpoint(const std::string& dir, const ParameterTable& table, float* weights,
                              const std::vector<OptimizerStateTarget>& optimizer_state,
                              size_t optimizer_begin) {
  const std::string state_path = JoinPath(dir, "state.json");
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(ReadConfigFile(state_path));
  } catch (const nlohmann::json::exception& e) {
    throw DataError(state_path + ": not valid JSON (" + e.what() + ")");
  }
  if (!state.is_object() || !state.contains("step") || !state["step"].is_number_integer())
    throw DataError(state_path + ": no integer 'step'");

  const int64_t step = state["step"].get<int64_t>();
  // Every value is scanned as a model file's are: a checkpoint verifies by its checksums even
  // when the state it holds is not finite.
  SafetensorsReader model(JoinPath(dir, "model.safetensors"));
  for (const auto& p : table.params()) {
    model.ReadFloat32(p.name, p.shape, weights + p.offset);
    RequireFinite(dir, step, "model.safetensors", p.name, weights + p.offset, p.numel);
  }
  if (state.contains("weights_xxh3")) {
    std::string hash = HexU64(Hash64(weights, table.total() * sizeof(float)));
    if (hash != state["weights_xxh3"].get<std::string>())
      throw DataError(dir + "/model.safetensors: weights hash " + hash + " differs from " +
                      state["weights_xxh3"].get<std::string>() + " in state.json");
  }

  SafetensorsReader optimizer(JoinPath(dir, "optimizer.safetensors"));
  for (const auto& [state_name, buffer, per_tensor, carried] : optimizer_state) {
    if (per_tensor == 0 && carried.empty() &&
        (!CoversWholeTable(table, optimizer_begin, buffer->size()) || optimizer.Find(state_name))) {
      optimizer.ReadFloat32(state_name, {static_cast<int64_t>(buffer->size())}, buffer->data());
      RequireFinite(dir, step, "optimizer.safetensors", state_name, buffer->data(), buffer->size());
      continue;
    }
    const std::vector<size_t> offsets =
        StateOffsets(table, state_name, per_tensor, carried, buffer->size());
    for (size_t t = 0; t < table.params().size(); ++t) {
      const ParamInfo& p = table.params()[t];
      const std::string entry = state_name + "." + p.name;
      if (offsets[t] == kNone) {
        CheckUncarriedEntryIsZero(optimizer, entry, StateShape(p, per_tensor));
        continue;
      }
      optimizer.ReadFloat32(entry, StateShape(p, per_tensor), buffer->data() + offsets[t]);
      RequireFinite(dir, step, "optimizer.safetensors", entry, buffer->data() + offsets[t],
                    per_tensor > 0 ? per_tensor : p.numel);
    }
  }
  return state;
}

std::vector<std::string> PruneCheckpoints(const std::string& root, int64_t keep_latest_k,
                                          int64_t keep_every_n) {
  std::vector<std::string> removed;
  if (keep_latest_k <= 0) return removed;
  int64_t complete_seen = 0;
  for (const auto& [step, dir] : ListCheckpoints(root)) {
    if (!FileExists(JoinPath(dir, "COMPLETE"))) continue;  // evidence of a failed save: keep
    ++complete_seen;
    if (complete_seen <= keep_latest_k) continue;
    if (keep_every_n > 0 && step % keep_every_n == 0) continue;
    RemoveTree(dir);
    removed.push_back(dir);
  }
  return removed;
}

ConfigChanges CompareResumeConfigs(const Config& saved, const Config& current) {
  ConfigChanges changes;
  for (const std::string& key : saved.Diff(current)) {
    const ConfigKeySpec* spec = Config::FindSpec(key);
    std::string line = FormatConfigChange(key, saved.Value(key), current.Value(key));
    (spec && spec->resume_sensitive ? changes.breaking : changes.harmless).push_back(line);
  }
  return changes;
}

}  // namespace crucible
