// The checkpoint interval from evidence (Young 1974, Daly 2006): with a save that costs the run
// C seconds and failures every M seconds on average, checkpointing every sqrt(2 C M) seconds
// minimises the expected time lost, which is then about C/tau + (tau + C) / (2 M).
#pragma once

#include <cstdint>
#include <string>

namespace crucible {

struct MtbfEstimate {
  double seconds = 0;
  std::string source;  // "attempts.jsonl", "checkpoint.mtbf_hours" or "default"
  int64_t failures = 0;
  double observed_seconds = 0;  // run time covered by attempts.jsonl
};

// Reads launch/attempts.jsonl (one JSON object per attempt; a missing file is no evidence).
// An attempt's length is its "wall_s" / "duration_s" / "elapsed_s", or "end" - "start" (numbers,
// seconds); it failed when its "exit_code" (or "rc", "returncode") is none of 0, the stops 143
// and 75, and the errors a retry cannot cure (2, 3, 65). With at least one failure, MTBF = observed time / failures; otherwise
// `mtbf_hours` when positive, else `default_hours`.
MtbfEstimate EstimateMtbf(const std::string& attempts_path, double mtbf_hours,
                          double default_hours = 24.0);

// sqrt(2 C M), in seconds.
double YoungDalyIntervalSeconds(double checkpoint_cost_seconds, double mtbf_seconds);
// Expected fraction of run time lost to saving and to recomputing after failures.
double ExpectedLostFraction(double checkpoint_cost_seconds, double interval_seconds,
                            double mtbf_seconds);
// The interval in whole steps (at least 1) for a mean step time.
int64_t IntervalSteps(double interval_seconds, double step_seconds);

}  // namespace crucible
