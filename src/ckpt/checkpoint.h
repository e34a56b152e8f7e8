// Training checkpoints on disk: one folder per step under the checkpoint root,
//
//   <root>/step-<n>/model.safetensors      fp32 master weights, the table's names (Llama: HF)
//   <root>/step-<n>/optimizer.safetensors  optimizer state, "<state>.<parameter name>" tensors
//   <root>/step-<n>/state.json             step, consumed samples, data cursor, RNG, LR position,
//                                          config hash, world size, crucible version
//   <root>/step-<n>/config.toml            the resolved config of the run that wrote it
//   <root>/step-<n>/MANIFEST               "<xxh3-128> <bytes> <file>" for each file above
//   <root>/step-<n>/COMPLETE               written last: step and the MANIFEST's own checksum
//   <root>/latest                          "step-<n>": the newest published checkpoint
//
// A checkpoint is written in "<root>/.tmp-step-<n>.<pid>" (every file fsynced), published by
// renaming that folder, and only then pointed to by `latest` (itself written atomically).
// Readers trust a checkpoint only when COMPLETE is present and every file matches MANIFEST.
// Nothing here deletes a checkpoint that failed verification: evidence stays on disk. The one
// thing a save removes is the temporary folder of a save whose writer is known to be gone: each
// temporary folder holds WRITER (host, boot, pid namespace, pid, process start time) while it is
// written, and the next save removes those whose writer ran here and no longer runs.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/config.h"
#include "model/model.h"
#include "model/parameters.h"

namespace crucible {

// An optimizer state buffer by name ("exp_avg", "exp_avg_sq", "momentum"; the optimizer's
// StateSpec), held by the tensors `carried` marks (one flag per tensor of the table; empty:
// every tensor). per_tensor 0: one float per element of the carrying tensors, concatenated in
// table order, stored as "<name>.<parameter name>" tensors of the parameters' shapes. (A state
// every tensor carries may instead cover a slice [optimizer_begin, optimizer_begin + size) of
// the parameter buffer, stored as one flat "<name>" tensor.) per_tensor n > 0: n floats per
// carrying tensor, in table order, stored as "<name>.<parameter name>" tensors of shape {n}.
// Nothing is stored for a tensor that does not carry the state.
struct OptimizerStateValues {
  std::string name;
  std::vector<float> values;
  size_t per_tensor = 0;
  std::vector<bool> carried = {};
};
// The same, naming the buffer a load fills. A checkpoint written before states were carried by
// subsets holds "<name>.<parameter name>" for every tensor; a load accepts such an entry of a
// tensor that does not carry `name` when it is all zeros (what that code kept there), and
// ignores it, else refuses it with a DataError naming it.
struct OptimizerStateTarget {
  std::string name;
  std::vector<float>* values;
  size_t per_tensor = 0;
  std::vector<bool> carried = {};
};

// Everything one checkpoint holds, copied out of the training state into host memory, so a
// background thread can write it while training goes on.
struct CheckpointSnapshot {
  int64_t step = 0;
  std::vector<float> weights;  // the flat parameter buffer (ParameterTable layout)
  std::vector<OptimizerStateValues> optimizer_state;
  size_t optimizer_begin = 0;
  nlohmann::json state;     // becomes state.json
  std::string config_toml;  // becomes config.toml
};

struct CheckpointFileInfo {
  std::string name;
  std::string xxh3;  // 128-bit, 32 hex digits
  uint64_t bytes = 0;
};

// Called with a phase= line while a save or a verification runs (from the calling thread).
using ProgressFn = std::function<void(const std::string& line)>;

struct SaveStats {
  std::string path;  // the published folder
  uint64_t bytes = 0;
  double seconds = 0;
};

// Writes `snapshot` as <root>/step-<n>, publishes it and updates `latest`. A folder already
// named step-<n> (left by an earlier attempt) is moved aside to step-<n>.replaced-<k>, never
// deleted. On any failure the temporary folder is removed, `latest` and the older checkpoints
// are untouched, and IoError (exit 74) is thrown naming the file and the OS error.
SaveStats WriteCheckpoint(const std::string& root, const CheckpointSnapshot& snapshot,
                          const ParameterTable& table, const ModelSpec& model,
                          const ProgressFn& progress = nullptr);

std::string CheckpointDirName(int64_t step);  // "step-<n>"

// The WRITER record of process `pid` as this process sees it ("host=...\nboot_id=...\n
// pid_namespace=...\npid=...\nstart_time=...\n"), or "" when no such process runs.
std::string CheckpointWriterRecord(int pid);

// Removes every "<root>/.tmp-step-*" folder whose WRITER names a process that ran on this host
// (same host name, boot and pid namespace) and is gone: no such pid, or the pid now runs a process
// with another start time. Keeps any other (another host or namespace, a live writer, no record).
// Logs each removal, and once per process each folder kept and why. Returns the folders removed.
// WriteCheckpoint calls it before it starts.
std::vector<std::string> RemoveStaleCheckpointTemporaries(const std::string& root);

// The step-<n> folders under `root`, newest first (complete or not).
std::vector<std::pair<int64_t, std::string>> ListCheckpoints(const std::string& root);
// The newest step folder under `root` from before step `step` that verifies by its sizes
// (VerifyDepth::kSizes), or "" when there is none: what to roll back to past a bad checkpoint.
std::string NewestCheckpointBefore(const std::string& root, int64_t step);

// Checks COMPLETE, MANIFEST and every file's size and checksum (kSizes: sizes only, which reads
// no tensor data; what `crucible launch` checks before it reports a stop as complete). Returns ""
// when the checkpoint is good, else one line naming the file that failed and how.
enum class VerifyDepth { kChecksums, kSizes };
std::string VerifyCheckpoint(const std::string& dir, VerifyDepth depth = VerifyDepth::kChecksums);

// The checkpoint a resume should use: `latest` is read as a hint (a missing or dangling one is
// reported), then step folders are verified newest first; each one that fails is reported with
// its reason through `report` and skipped. Returns nullopt when `root` holds no step folder;
// throws DataError (65) when it holds some and none verifies.
std::optional<std::string> FindResumeCheckpoint(
    const std::string& root, const std::function<void(const std::string&)>& report);

// The weights `crucible eval` and `crucible export hf` read from a run directory (config.toml,
// checkpoint.folder): its newest checkpoint that verifies, each one that does not reported
// through `report` with its reason and skipped; else its final model.safetensors, reported when
// checkpoints were skipped. `verb` names the command in errors ("evaluate", "export"). Throws
// DataError (65) when checkpoints exist, none verifies and there is no final model, UsageError
// (2) when there is neither. Nothing is deleted.
struct RunWeights {
  std::string weights_path;  // the model.safetensors to load
  std::string config_path;   // the config.toml that describes it
};
RunWeights FindRunWeights(const std::string& run_dir, const std::string& verb,
                          const std::function<void(const std::string&)>& report);

// Reads a checkpoint that VerifyCheckpoint accepted: weights (table layout), the optimizer
// state buffers named in `optimizer_state` (per-element ones filled over the slice starting at
// `optimizer_begin`), and returns state.json. Throws DataError naming the file on a mismatch.
nlohmann::json LoadCheckpoint(const std::string& dir, const ParameterTable& table, float* weights,
                              const std::vector<OptimizerStateTarget>& optimizer_state,
                              size_t optimizer_begin);

// Deletes complete checkpoints that the retention policy no longer keeps: the newest
// `keep_latest_k` (0 keeps all) and every one whose step is a multiple of `keep_every_n` (0: none)
// stay. Incomplete or unverified folders are never deleted. Returns the folders removed.
std::vector<std::string> PruneCheckpoints(const std::string& root, int64_t keep_latest_k,
                                          int64_t keep_every_n);

// How the config of a run that resumes differs from the one that wrote the checkpoint.
struct ConfigChanges {
  std::vector<std::string> breaking;  // resume_sensitive keys: "key: old -> new"
  std::vector<std::string> harmless;  // other keys
};
ConfigChanges CompareResumeConfigs(const Config& saved, const Config& current);

// Removes `path` and everything below it (for pruning and for a failed save's temporary folder).
void RemoveTree(const std::string& path);

}  // namespace crucible
