#include "ckpt/interval.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/files.h"
#include "common/log.h"

namespace crucible {
namespace {

// An attempt that lost work to a failure of the job or the machine: not a success, not a stop
// (143, 75), and not an error that a retry cannot cure (usage 2, diverged 3, bad data 65).
bool IsInterruption(int exit_code) {
  switch (exit_code) {
    case kExitOk:
    case kExitUsage:
    case kExitDiverged:
    case kExitBadData:
    case kExitStoppedNoCheckpoint:
    case kExitSignalled:
      return false;
    default:
      return true;
  }
}

bool NumberField(const nlohmann::json& line, std::initializer_list<const char*> keys, double* out) {
  for (const char* key : keys) {
    auto it = line.find(key);
    if (it != line.end() && it->is_number()) {
      *out = it->get<double>();
      return true;
    }
  }
  return false;
}

}  // namespace

MtbfEstimate EstimateMtbf(const std::string& attempts_path, double mtbf_hours,
                          double default_hours) {
  MtbfEstimate estimate;
  std::ifstream in(attempts_path);
  std::string text;
  int line_number = 0;
  while (in && std::getline(in, text)) {
    ++line_number;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json line = nlohmann::json::parse(text, nullptr, false);
    if (!line.is_object()) {
      LogWarn(attempts_path + ":" + std::to_string(line_number) +
              ": not a JSON object; ignored for MTBF");
      continue;
    }
    double seconds = 0, start = 0, end = 0;
    if (!NumberField(line, {"wall_s", "duration_s", "elapsed_s"}, &seconds) &&
        NumberField(line, {"start", "started_at", "start_time"}, &start) &&
        NumberField(line, {"end", "ended_at", "end_time"}, &end))
      seconds = end - start;
    if (seconds > 0) estimate.observed_seconds += seconds;
    double exit_code = 0;
    if (NumberField(line, {"exit_code", "rc", "returncode"}, &exit_code) &&
        IsInterruption(static_cast<int>(exit_code)))
      ++estimate.failures;
  }
  if (estimate.failures > 0 && estimate.observed_seconds > 0) {
    estimate.seconds = estimate.observed_seconds / static_cast<double>(estimate.failures);
    estimate.source = "attempts.jsonl";
  } else if (mtbf_hours > 0) {
    estimate.seconds = mtbf_hours * 3600.0;
    estimate.source = "checkpoint.mtbf_hours";
  } else {
    estimate.seconds = default_hours * 3600.0;
    estimate.source = "default";
  }
  return estimate;
}

double YoungDalyIntervalSeconds(double cost, double mtbf) {
  return std::sqrt(2.0 * std::max(cost, 0.0) * std::max(mtbf, 0.0));
}

double ExpectedLostFraction(double cost, double interval, double mtbf) {
  if (interval <= 0 || mtbf <= 0) return 1.0;
  return std::min(1.0, cost / interval + (interval + cost) / (2.0 * mtbf));
}

int64_t IntervalSteps(double interval_seconds, double step_seconds) {
  if (!(step_seconds > 0) || !std::isfinite(interval_seconds)) return 1;
  double steps = std::round(interval_seconds / step_seconds);
  return static_cast<int64_t>(std::clamp(steps, 1.0, 1e12));
}

}  // namespace crucible
