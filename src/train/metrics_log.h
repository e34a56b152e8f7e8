// The metrics a run writes as it trains (a TrainerHook): the progress line `step=N loss=...`
// every metrics.log_freq steps and at the last (rank 0), <run>/metrics.jsonl (rank 0, every
// step) and, with metrics.per_rank on more than one rank, <run>/metrics-rank<r>.jsonl. Each
// line is written and flushed as it comes, so a killed run loses at most the line being
// written; a resumed run first drops the lines of the steps after its checkpoint. With
// metrics.enable_tensorboard, rank 0 also writes every number of each metrics.jsonl record as a
// TensorBoard scalar tagged train/<key> (train/tensorboard.h), and the resolved config as text.
#pragma once

#include <cstdio>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "train/hooks.h"
#include "train/tensorboard.h"
#include "train/training_config.h"

namespace crucible {

// A JSON-lines file, closed when destroyed.
class JsonLinesFile {
 public:
  JsonLinesFile() = default;
  JsonLinesFile(const JsonLinesFile&) = delete;
  JsonLinesFile& operator=(const JsonLinesFile&) = delete;
  ~JsonLinesFile() { Close(); }

  void Open(const std::string& path, bool append);  // Error (exit 74) when it cannot
  bool is_open() const { return file_ != nullptr; }
  void Append(const nlohmann::json& record);
  void Close();

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

// Peak resident memory (VmHWM) of this process, in bytes (0 where getrusage fails): metrics.jsonl's
// rss_peak_bytes and the trainer's phase=memory_peak.
double PeakResidentBytes();

// Keeps the lines of `path` whose step is at most `last_step` (and drops lines a kill cut),
// atomically; returns how many were kept.
int64_t TruncateMetrics(const std::string& path, int64_t last_step);

class MetricsLog : public TrainerHook {
 public:
  // `resumed_step`: the step a resumed run continues after (-1: a fresh run); `config_toml`: the
  // resolved config (TensorBoard's "config" text).
  MetricsLog(const TrainingConfig& training, const std::string& run_dir, int rank,
             const std::string& host, int64_t resumed_step, const std::string& config_toml);
  ~MetricsLog() override;
  std::optional<int> AfterStep(const StepReport& report) override;
  void End(bool stopped) override;
  // Rank 0's TensorBoard writer, for the hooks after this one (validation); null without one.
  TensorBoardWriter* tensorboard() const { return tensorboard_.get(); }

 private:
  const TrainingConfig& training_;
  int rank_;
  std::string host_;
  JsonLinesFile metrics_, rank_metrics_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
};

}  // namespace crucible
