#include "train/metrics_log.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/files.h"
#include "common/log.h"
#include "common/strings.h"

namespace crucible {

void JsonLinesFile::Open(const std::string& path, bool append) {
  path_ = path;
  file_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (!file_) ThrowErrno("cannot open " + path);
}

void JsonLinesFile::Append(const nlohmann::json& record) {
  const std::string text = record.dump() + "\n";
  if (std::fwrite(text.data(), 1, text.size(), file_) != text.size() || std::fflush(file_) != 0)
    ThrowErrno("cannot write " + path_);
}

void JsonLinesFile::Close() {
  if (file_) std::fclose(file_);
  file_ = nullptr;
}

int64_t TruncateMetrics(const std::string& path, int64_t last_step) {
  if (!FileExists(path)) return 0;
  std::string kept;
  int64_t lines = 0;
  for (const std::string& line : Split(ReadFile(path), '\n')) {
    if (line.empty()) continue;
    nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    if (!record.is_object() || !record.contains("step") || !record["step"].is_number_integer())
      continue;  // a line cut by a kill
    if (record["step"].get<int64_t>() > last_step) continue;
    kept += line + "\n";
    ++lines;
  }
  AtomicWriteFile(path, kept);
  return lines;
}

double PeakResidentBytes() {
  // One system call (getrusage's ru_maxrss is the kernel's VmHWM, in KiB), not a read and parse
  // of /proc/self/status: metrics.jsonl asks for it every step.
  struct rusage usage;
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<double>(usage.ru_maxrss) * 1024.0;
}

namespace {

nlohmann::json FiniteOrNull(double value) {
  return std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(nullptr);
}

}  // namespace

MetricsLog::MetricsLog(const TrainingConfig& training, const std::string& run_dir, int rank,
                       const std::string& host, int64_t resumed_step,
                       const std::string& config_toml)
    : training_(training), rank_(rank), host_(host) {
  const bool resumed = resumed_step >= 0;
  if (rank == 0 && training.metrics_jsonl) {
    const std::string path = JoinPath(run_dir, "metrics.jsonl");
    if (resumed) TruncateMetrics(path, resumed_step);
    metrics_.Open(path, resumed);
  }
  if (training.metrics_per_rank && training.world > 1)
    rank_metrics_.Open(JoinPath(run_dir, StrFormat("metrics-rank%d.jsonl", rank)), resumed);
  if (rank == 0 && !training.tensorboard_folder.empty()) {
    // A new file from the run's first step: its SessionLog START makes the reader drop the
    // steps an earlier attempt logged after the checkpoint this run resumed from.
    const int64_t first_step = resumed ? resumed_step + 1 : 1;
    tensorboard_ = std::make_unique<TensorBoardWriter>(
        JoinPath(run_dir, training.tensorboard_folder), host, first_step);
    tensorboard_->WriteText(first_step, "config", config_toml);
  }
}

MetricsLog::~MetricsLog() = default;

std::optional<int> MetricsLog::AfterStep(const StepReport& r) {
  if (rank_ == 0 && (r.step % training_.log_freq == 0 || r.last)) {
    // A mixture of experts adds the largest coefficient of variation of its layers' loads.
    std::string load;
    if (!r.expert_loads.empty()) {
      double cv = 0;
      for (const ExpertLoadSummary& s : r.expert_loads) cv = std::max(cv, s.cv);
      load = StrFormat(" load_cv=%.3f", cv);
    }
    if (!std::isnan(r.aux_loss)) load = StrFormat(" aux_loss=%.6f", r.aux_loss) + load;
    if (r.stage > 0) load += StrFormat(" stage=%d stage_name=%s", r.stage, r.stage_name.c_str());
    for (const auto& [name, value] : r.source_metrics)
      load += StrFormat(" %s=%.6g", name.c_str(), value);
    if (r.padding_tokens >= 0)
      load += StrFormat(" padding=%.4f content_tok/s=%.1f", r.padding_share,
                        r.content_tokens_per_second);
    PrintLine(StrFormat(
        "step=%lld loss=%.6f lr=%.6e grad_norm=%.6f global_batch=%lld skipped=%lld tok/s=%.1f "
        "mfu=%.2f%s",
        (long long)r.step, r.loss, r.lr, r.grad_norm, (long long)r.global_batch,
        (long long)r.skipped_total, r.tokens_per_second, r.mfu, load.c_str()));
  }
  if (metrics_.is_open() || tensorboard_) {
    nlohmann::json record = {{"step", r.step},
                             {"loss", r.loss},
                             {"lr", r.lr},
                             {"grad_norm", FiniteOrNull(r.grad_norm)},
                             {"grad_norm_clipped", FiniteOrNull(r.grad_norm_clipped)},
                             {"skipped", r.skipped},
                             {"global_batch", r.global_batch},
                             {"tokens", r.tokens_seen},
                             {"tok_per_s", r.tokens_per_second},
                             {"mfu", FiniteOrNull(r.mfu)},
                             {"step_seconds", r.step_seconds},
                             {"reduce_wait_s", r.reduce_wait_seconds},
                             {"rss_peak_bytes", PeakResidentBytes()}};
    for (const auto& [name, value] : r.optimizer_metrics) record[name] = FiniteOrNull(value);
    for (const auto& [name, value] : r.source_metrics) record[name] = FiniteOrNull(value);
    if (!std::isnan(r.aux_loss)) record["aux_loss"] = r.aux_loss;
    if (r.stage > 0) {
      record["stage"] = r.stage;
      record["stage_name"] = r.stage_name;
    }
    if (!std::isnan(r.expert_exchange_seconds))
      record["expert_exchange_s"] = r.expert_exchange_seconds;
    if (r.padding_tokens >= 0) {
      record["padding_tokens"] = r.padding_tokens;
      record["padding_share"] = r.padding_share;
      record["content_tok_per_s"] = r.content_tokens_per_second;
    }
    if (!r.expert_loads.empty()) {
      nlohmann::json layers = nlohmann::json::array();
      for (const ExpertLoadSummary& s : r.expert_loads)
        layers.push_back({{"layer", s.layer}, {"min", s.min}, {"max", s.max}, {"cv", s.cv}});
      record["expert_load"] = layers;
    }
    if (metrics_.is_open()) metrics_.Append(record);
    if (tensorboard_) tensorboard_->WriteScalars(r.step, ScalarsOfRecord(record, "train/"));
  }
  if (rank_metrics_.is_open()) {
    nlohmann::json record = {{"step", r.step},
                             {"rank", rank_},
                             {"host", host_},
                             {"local_loss_sum", r.local_loss_sum},
                             {"local_valid_tokens", r.local_valid_tokens},
                             {"step_seconds", r.step_seconds},
                             {"reduce_wait_s", r.reduce_wait_seconds}};
    if (!std::isnan(r.expert_exchange_seconds))
      record["expert_exchange_s"] = r.expert_exchange_seconds;
    rank_metrics_.Append(record);
  }
  return std::nullopt;
}

void MetricsLog::End(bool) {
  metrics_.Close();
  rank_metrics_.Close();
}

}  // namespace crucible
