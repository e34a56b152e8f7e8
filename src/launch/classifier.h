// Why an attempt ended, decided from its exit code, its log and the scheduler's state, in this
// fixed order (docs/launch.md, "Failover"):
//   success      exit 0
//   config_error exit 2 or 65, or a second attempt in a row that reached no `step=` line
//   diverged     exit 3: the loss or the weights went non-finite; a resume would replay the same
//                bits on any node, so it is never retried and no node is blamed
//   disk_io      exit 74: retry in place, no node to blame
//   walltime     exit 143, 75, 271 or -29 while the scheduler says little time is left (or its
//                log says the job hit its time limit); a 143 with hours left is not walltime
//   stopped      exit 143 or 75 after the launcher itself was sent a stop signal: it was asked
//                to stop and did
//   bad_node     a bad-node pattern in the log, or the scheduler's node state, names a node
//   hang         exit 124 from the watchdog; names the node that went silent first, if known
//   no_progress  a first attempt that reached no `step=` line: retry in place once, so a
//                config error is caught on the next attempt without touching the spares
//   unknown      anything else
// Every verdict carries the evidence line it was decided on.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launch/attempt_log.h"

namespace crucible {

enum class Verdict {
  kSuccess,
  kConfigError,
  kDiverged,
  kDiskIo,
  kWalltime,
  kBadNode,
  kHang,
  kNoProgress,
  kStopped,
  kUnknown
};
const char* VerdictName(Verdict verdict);

struct AttemptFacts {
  int exit_code = 0;
  bool timed_out = false;  // the watchdog killed it (exit 124)
  const AttemptLog* log = nullptr;
  bool previous_reached_step = true;               // false: the attempt before also made no step
  std::optional<double> time_left_seconds;         // from the scheduler; nullopt if unknown
  double walltime_margin_seconds = 300;            // "little time is left" means at most this
  std::map<std::string, std::string> node_states;  // scheduler's state of each active node
  double silence_gap_seconds = 1.0;                // see AttemptLog::FirstSilentNode
  int stop_signal = 0;  // a stop signal the launcher received during the attempt, 0 if none
};

struct Classification {
  Verdict verdict = Verdict::kUnknown;
  std::string evidence;  // the line or fact the verdict rests on
  std::string node;      // the node to blame (bad_node, and hang when known); empty otherwise
  std::string pattern;   // the pattern that named it, or "scheduler-state" / "first-silent"
};

Classification ClassifyAttempt(const AttemptFacts& facts);

// What the launcher does after an attempt, decided from its verdict (docs/launch.md, "Retries"
// and "Failover"). A verdict and its action never disagree: success is done, a config error and
// a divergence always stop (with or without --auto-retry), walltime and a stop the launcher was
// asked for stop (and may resubmit); with plain --retries every other failure is retried in
// place, with --auto-retry disk_io and no_progress are, and the rest fail over to a spare.
enum class NextStep { kDone, kStop, kStopAndResubmit, kRetry, kFailover };
struct NextStepFacts {
  bool auto_retry = false;
  int retries = 0;          // --retries (resolved)
  int retry = 1;            // this launch's count of the attempt just ended, from 1
  int signal_received = 0;  // a stop signal the launcher received, 0 if none
};
struct Decision {
  NextStep step = NextStep::kStop;
  std::string detail;  // why it stops, e.g. "(retries used up)"; empty otherwise
};
Decision DecideNextStep(const Classification& classification, const NextStepFacts& facts);

}  // namespace crucible
