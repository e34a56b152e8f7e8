#include "ckpt/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <map>

#include "ckpt/model_weights.h"
#include "ckpt/safetensors.h"
#include "common/error.h"
#include "common/files.h"
#include "common/hash.h"
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

std::string ReadSmallFile(const std::string& path) {
  try {
    return ReadFile(path);
  } catch (const Error&) {
    return "";
  }
}

}  // namespace

std::string CheckpointDirName(int64_t step) {
  return "step-" + std::to_string(step);
}

void RemoveTree(const std::string& path) {
  std::error_code error;
  std::filesystem::remove_all(path, error);
}

SaveStats WriteCheckpoint(const std::string& root, const CheckpointSnapshot& snapshot,
                          const ParameterTable& table, const LlamaConfig& model,
                          const ProgressFn& progress) {
  Timer timer;
  MakeDirectories(root);
  const std::string name = CheckpointDirName(snapshot.step);
  const std::string temporary = JoinPath(root, ".tmp-" + name + "." + std::to_string(::getpid()));
  const std::string final_dir = JoinPath(root, name);
  RemoveTree(temporary);  // a leftover of this very process: never a published checkpoint
  if (::mkdir(temporary.c_str(), 0755) != 0) ThrowErrno("cannot create " + temporary);
  SaveStats stats;
  try {
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
    for (const auto& [state_name, buffer] : snapshot.optimizer_state) {
      if (CoversWholeTable(table, snapshot.optimizer_begin, buffer.size())) {
        for (const auto& p : table.params())
          views.push_back({state_name + "." + p.name, p.shape, buffer.data() + p.offset});
      } else {
        views.push_back({state_name, {static_cast<int64_t>(buffer.size())}, buffer.data()});
      }
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

std::optional<std::string> FindResumeCheckpoint(
    const std::string& root, const std::function<void(const std::string&)>& report) {
  auto checkpoints = ListCheckpoints(root);
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
  std::vector<std::string> failures;
  for (const auto& [step, dir] : checkpoints) {
    std::string failure = VerifyCheckpoint(dir);
    if (failure.empty()) return dir;
    report("checkpoint " + dir + " is unusable: " + failure + "; falling back to the one before");
    failures.push_back(dir + ": " + failure);
  }
  throw DataError(
      StrFormat("%s: none of the %zu checkpoints verifies (newest: %s); nothing was "
                "deleted. Pass --resume none to start over or --resume PATH",
                root.c_str(), checkpoints.size(), failures.front().c_str()));
}

nlohmann::json LoadCheckpoint(
    const std::string& dir, const ParameterTable& table, float* weights,
    const std::vector<std::pair<std::string, std::vector<float>*>>& optimizer_state,
    size_t optimizer_begin) {
  const std::string state_path = JoinPath(dir, "state.json");
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(ReadFile(state_path));
  } catch (const nlohmann::json::exception& e) {
    throw DataError(state_path + ": not valid JSON (" + e.what() + ")");
  }
  if (!state.is_object() || !state.contains("step") || !state["step"].is_number_integer())
    throw DataError(state_path + ": no integer 'step'");

  SafetensorsReader model(JoinPath(dir, "model.safetensors"));
  for (const auto& p : table.params()) model.ReadFloat32(p.name, p.shape, weights + p.offset);
  if (state.contains("weights_xxh3")) {
    std::string hash = HexU64(Hash64(weights, table.total() * sizeof(float)));
    if (hash != state["weights_xxh3"].get<std::string>())
      throw DataError(dir + "/model.safetensors: weights hash " + hash + " differs from " +
                      state["weights_xxh3"].get<std::string>() + " in state.json");
  }

  SafetensorsReader optimizer(JoinPath(dir, "optimizer.safetensors"));
  for (const auto& [state_name, buffer] : optimizer_state) {
    if (CoversWholeTable(table, optimizer_begin, buffer->size()) && !optimizer.Find(state_name)) {
      for (const auto& p : table.params())
        optimizer.ReadFloat32(state_name + "." + p.name, p.shape, buffer->data() + p.offset);
    } else {
      optimizer.ReadFloat32(state_name, {static_cast<int64_t>(buffer->size())}, buffer->data());
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
    std::string line = key + ": " + FormatConfigValue(saved.Value(key)) + " -> " +
                       FormatConfigValue(current.Value(key));
    (spec && spec->resume_sensitive ? changes.breaking : changes.harmless).push_back(line);
  }
  return changes;
}

}  // namespace crucible
