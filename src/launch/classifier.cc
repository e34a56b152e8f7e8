#include "launch/classifier.h"

#include "common/error.h"
#include "common/strings.h"
#include "launch/detect.h"

namespace crucible {
namespace {

// A stop: 143 (with a complete checkpoint) or 75 (without one), 271 / -29 (PBS's codes for a
// job killed by SIGTERM).
bool IsWalltimeCode(int code) {
  return code == kExitSignalled || code == kExitStoppedNoCheckpoint || code == 271 || code == -29;
}

// A stop code while the scheduler says little time is left, or its log says the job hit its
// time limit.
bool IsWalltime(const AttemptFacts& facts) {
  const bool little_left =
      facts.time_left_seconds && *facts.time_left_seconds <= facts.walltime_margin_seconds;
  return IsWalltimeCode(facts.exit_code) &&
         (little_left || (facts.log && facts.log->time_limit_line()));
}

std::string Evidence(const AttemptLog* log) {
  return log ? log->EvidenceLine() : "(no output)";
}

std::string LastLine(const AttemptLog* log) {
  return log ? log->LastMeaningfulLine() : "(no output)";
}

}  // namespace

const char* VerdictName(Verdict verdict) {
  switch (verdict) {
    case Verdict::kSuccess:
      return "success";
    case Verdict::kConfigError:
      return "config_error";
    case Verdict::kDiverged:
      return "diverged";
    case Verdict::kDiskIo:
      return "disk_io";
    case Verdict::kWalltime:
      return "walltime";
    case Verdict::kBadNode:
      return "bad_node";
    case Verdict::kHang:
      return "hang";
    case Verdict::kNoProgress:
      return "no_progress";
    case Verdict::kStopped:
      return "stopped";
    default:
      return "unknown";
  }
}

Classification ClassifyAttempt(const AttemptFacts& facts) {
  const int code = facts.exit_code;
  const AttemptLog* log = facts.log;
  const bool reached_step = log && log->reached_step();
  Classification c;

  if (code == 0 && !facts.timed_out) {
    c.verdict = Verdict::kSuccess;
    c.evidence = "exit 0";
    return c;
  }
  if (code == kExitUsage || code == kExitBadData) {
    c.verdict = Verdict::kConfigError;
    c.evidence =
        StrFormat("exit %d (%s): %s", code,
                  code == kExitUsage ? "usage or config error" : "bad data", Evidence(log).c_str());
    return c;
  }
  if (code == kExitDiverged) {
    c.verdict = Verdict::kDiverged;
    c.evidence = "exit 3 (the run diverged, or a stage gate stopped it): " + Evidence(log);
    return c;
  }
  if (!reached_step && !facts.previous_reached_step) {
    c.verdict = Verdict::kConfigError;
    c.evidence = StrFormat("two attempts in a row reached no step= line; exit %d: %s", code,
                           Evidence(log).c_str());
    return c;
  }
  if (code == kExitIo) {
    c.verdict = Verdict::kDiskIo;
    c.evidence = "exit 74 (I/O error): " + Evidence(log);
    return c;
  }
  if (IsWalltime(facts)) {
    c.verdict = Verdict::kWalltime;
    c.evidence = log && log->time_limit_line() ? *log->time_limit_line()
                                               : StrFormat("exit %d with %.0f s of wall time left",
                                                           code, *facts.time_left_seconds);
    return c;
  }
  const bool stop_code = code == kExitSignalled || code == kExitStoppedNoCheckpoint;
  if (facts.stop_signal != 0 && stop_code) {
    c.verdict = Verdict::kStopped;
    c.evidence =
        StrFormat("exit %d after signal %d to the launcher: %s", code, facts.stop_signal,
                  log && log->stopped() ? log->stopped()->line.c_str() : Evidence(log).c_str());
    return c;
  }
  if (log) {
    if (auto named = log->BadNode()) {
      c.verdict = Verdict::kBadNode;
      c.node = named->node;
      c.pattern = named->pattern;
      c.evidence = named->evidence;
      return c;
    }
  }
  for (const auto& [node, state] : facts.node_states) {
    if (IsBadNodeState(state)) {
      c.verdict = Verdict::kBadNode;
      c.node = node;
      c.pattern = "scheduler-state";
      c.evidence = "scheduler reports node " + node + " " + state;
      return c;
    }
  }
  if (facts.timed_out || code == kExitTimeout) {
    c.verdict = Verdict::kHang;
    c.node = log ? log->FirstSilentNode(facts.silence_gap_seconds) : "";
    c.pattern = c.node.empty() ? "" : "first-silent";
    c.evidence = c.node.empty()
                     ? "no output within the watchdog timeout; last line: " + LastLine(log)
                     : "node " + c.node + " went silent first; last line: " + LastLine(log);
    return c;
  }
  if (!reached_step) {
    c.verdict = Verdict::kNoProgress;
    c.evidence = StrFormat("exit %d before the first step= line: %s", code, Evidence(log).c_str());
    return c;
  }
  c.verdict = Verdict::kUnknown;
  c.evidence = StrFormat("exit %d: %s", code, Evidence(log).c_str());
  return c;
}

Decision DecideNextStep(const Classification& c, const NextStepFacts& facts) {
  if (c.verdict == Verdict::kSuccess) return {NextStep::kDone, ""};
  if (c.verdict == Verdict::kConfigError || c.verdict == Verdict::kDiverged)
    return {NextStep::kStop, ""};
  if (c.verdict == Verdict::kWalltime) return {NextStep::kStopAndResubmit, "(walltime)"};
  if (c.verdict == Verdict::kStopped) return {NextStep::kStopAndResubmit, "(signalled)"};
  if (facts.signal_received != 0) return {NextStep::kStopAndResubmit, "(signalled)"};
  if (facts.retry > facts.retries)
    return {NextStep::kStop, facts.retries > 0 ? "(retries used up)" : ""};
  if (!facts.auto_retry) return {NextStep::kRetry, ""};
  if (c.verdict == Verdict::kDiskIo || c.verdict == Verdict::kNoProgress)
    return {NextStep::kRetry, ""};
  return {NextStep::kFailover, ""};
}

}  // namespace crucible
