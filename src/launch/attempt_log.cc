#include "launch/attempt_log.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "common/strings.h"
#include "launch/hostlist.h"
#include "launch/rank_environment.h"

namespace crucible {
namespace {

constexpr size_t kTailLines = 20;
constexpr size_t kMaxCandidates = 32;

// Digits at text[pos...] followed by `terminator`; returns the number and moves pos past both.
std::optional<int> NumberThen(std::string_view text, size_t* pos, std::string_view terminator) {
  size_t start = *pos, end = start;
  while (end < text.size() && end - start < 9 && text[end] >= '0' && text[end] <= '9') ++end;
  if (end == start || text.substr(end, terminator.size()) != terminator) return std::nullopt;
  *pos = end + terminator.size();
  return std::atoi(std::string(text.substr(start, end - start)).c_str());
}

// Banners, separators and the fixed text MPI launchers print around a failure: they say nothing
// the exit code does not (Open MPI 4 mpirun, MPICH Hydra, srun).
bool IsBoilerplate(std::string_view text) {
  const std::string trimmed = Trim(std::string(text));
  if (trimmed.find_first_not_of("-=*#_~+ ") == std::string::npos) return true;
  static const char* const kBoilerplate[] = {
      // Open MPI
      "Primary job  terminated normally, but",
      "Primary job terminated normally, but",
      "a non-zero exit code. Per user-direction, the job has been aborted.",
      "mpirun detected that one or more processes exited with non-zero status",
      "the job to be terminated. The first process to do so was:",
      "NOTE: invoking MPI_ABORT causes Open MPI to kill all MPI processes.",
      "You may or may not see output from other processes, depending on",
      "exactly when Open MPI kills them.",
      // MPICH Hydra
      "This typically refers to a problem with your application.",
      "Please see the FAQ page for debugging suggestions",
      // srun
      "srun: Job step aborted: Waiting up to",
      "srun: launch/slurm: _step_signal: Terminating StepId=",
      "srun: forcing job termination",
  };
  for (const char* line : kBoilerplate)
    if (trimmed.rfind(line, 0) == 0) return true;
  // Open MPI's "Process name: [[...]]" / "Exit code: N" and Hydra's "=   ..." box.
  return StartsWith(trimmed, "Process name:") || StartsWith(trimmed, "Exit code:") ||
         StartsWith(trimmed, "=   ");
}

std::string Lower(std::string_view text) {
  std::string lower(text);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower;
}

// "error:", "fatal:", "exception:" (also as the end of a word: "ValueError:"), or a C++ abort.
bool NamesAnError(std::string_view text) {
  const std::string lower = Lower(text);
  for (const char* marker : {"error:", "fatal:", "exception:", "terminate called", "what():"})
    if (lower.find(marker) != std::string::npos) return true;
  return false;
}

// A word that says something failed, at word boundaries ("errors=0" does not count).
bool MentionsAFailure(std::string_view text) {
  const std::string lower = Lower(text);
  static const char* const kWords[] = {
      "error",         "failed", "failure",      "fatal",      "killed",    "abort",
      "aborted",       "cannot", "timeout",      "timed out",  "signal",    "segmentation fault",
      "out of memory", "denied", "no such file", "terminated", "exception", "bad termination"};
  auto is_word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (const char* word : kWords) {
    const std::string_view w(word);
    for (size_t at = lower.find(w); at != std::string::npos; at = lower.find(w, at + 1)) {
      const bool starts = at == 0 || !is_word(lower[at - 1]);
      const bool ends = at + w.size() == lower.size() || !is_word(lower[at + w.size()]);
      if (starts && ends) return true;
    }
  }
  return false;
}

// The number after " key=" in a key=value line; nullopt if absent or not a number.
std::optional<double> NumberField(std::string_view text, std::string_view key) {
  size_t at = 0;
  while ((at = text.find(key, at + 1)) != std::string_view::npos) {
    if (text[at - 1] == ' ' && text.substr(at + key.size(), 1) == "=") break;
  }
  if (at == std::string_view::npos) return std::nullopt;
  const std::string rest(text.substr(at + key.size() + 1));
  char* end = nullptr;
  const double value = std::strtod(rest.c_str(), &end);
  if (end == rest.c_str() || !std::isfinite(value)) return std::nullopt;
  return value;
}

// A kTagged label at text[pos]: "[<job>,<rank>]<word>:" with a word of 1-8 letters (stdout,
// stderr, stddiag, hydra). Returns the rank and moves pos past the label.
std::optional<int> TagAt(std::string_view text, size_t* pos) {
  size_t at = *pos;
  if (text.substr(at, 1) != "[") return std::nullopt;
  ++at;
  if (!NumberThen(text, &at, ",")) return std::nullopt;
  auto rank = NumberThen(text, &at, "]<");
  if (!rank) return std::nullopt;
  size_t end = at;
  while (end < text.size() && end - at < 8 && std::isalpha(static_cast<unsigned char>(text[end])))
    ++end;
  if (end == at || text.substr(end, 2) != ">:") return std::nullopt;
  *pos = end + 2;
  return rank;
}

bool IsTimeLimitMessage(std::string_view text) {
  return text.find("DUE TO TIME LIMIT") != std::string_view::npos ||
         (text.find("walltime") != std::string_view::npos &&
          text.find("exceeded limit") != std::string_view::npos);
}

}  // namespace

std::optional<StoppedLine> ParseStoppedLine(std::string_view text) {
  constexpr std::string_view kPrefix = "stopped step=";
  if (!StartsWith(text, kPrefix)) return std::nullopt;
  size_t pos = kPrefix.size();
  auto step = NumberThen(text, &pos, " signal=");
  const size_t checkpoint_at = text.find(" checkpoint=", pos);
  const size_t exit_at = text.rfind(" exit=");
  if (!step || checkpoint_at == std::string_view::npos || exit_at == std::string_view::npos ||
      exit_at < checkpoint_at)
    return std::nullopt;
  StoppedLine stopped;
  stopped.step = *step;
  stopped.signal = std::string(text.substr(pos, checkpoint_at - pos));
  const size_t path_at = checkpoint_at + 12;
  stopped.checkpoint = std::string(text.substr(path_at, exit_at - path_at));
  stopped.exit_code = std::atoi(std::string(text.substr(exit_at + 6)).c_str());
  stopped.line = std::string(text);
  return stopped;
}

OutputLine ParseOutputLine(std::string_view raw, LabelStyle style) {
  OutputLine line;
  size_t pos = 0;
  switch (style) {
    case LabelStyle::kColon: {  // optional padding, "3: "
      while (pos < raw.size() && raw[pos] == ' ') ++pos;
      if (auto rank = NumberThen(raw, &pos, ": ")) {
        line.rank = *rank;
        line.text = raw.substr(pos);
        return line;
      }
      break;
    }
    case LabelStyle::kTagged: {  // "[1,3]<stdout>:" (also <stderr>, <stddiag>, <hydra>)
      if (auto rank = TagAt(raw, &pos)) {
        line.rank = *rank;
        line.text = raw.substr(pos);
        return line;
      }
      break;
    }
    case LabelStyle::kNone:
      break;
  }
  line.text = raw;
  return line;
}

std::string DisplayLine(const OutputLine& line) {
  return line.rank < 0 ? line.text : std::to_string(line.rank) + ": " + line.text;
}

RankLines::RankLines(LabelStyle style, size_t max_line) : style_(style), max_line_(max_line) {}

std::vector<OutputLine> RankLines::Add(std::string_view raw) {
  if (style_ != LabelStyle::kTagged) return {ParseOutputLine(raw, style_)};
  std::vector<OutputLine> lines;
  size_t pos = 0;
  int rank = TagAt(raw, &pos).value_or(-1);
  while (true) {
    // The next label, if any, ends this rank's piece: a chunk that did not end its line.
    size_t next = raw.find('[', pos), after = 0;
    std::optional<int> next_rank;
    for (; next != std::string_view::npos; next = raw.find('[', next + 1)) {
      after = next;
      if ((next_rank = TagAt(raw, &after))) break;
    }
    std::string& line = pending_[rank];
    line.append(raw.substr(pos, next == std::string_view::npos ? raw.size() - pos : next - pos));
    if (!next_rank || line.size() >= max_line_) {
      lines.push_back({rank, std::move(line)});
      pending_.erase(rank);
    }
    if (!next_rank) return lines;
    rank = *next_rank;
    pos = after;
  }
}

std::vector<OutputLine> RankLines::Finish() {
  std::vector<OutputLine> lines;
  for (auto& [rank, text] : pending_)
    if (!text.empty()) lines.push_back({rank, std::move(text)});
  pending_.clear();
  return lines;
}

AttemptLog::AttemptLog(const BadNodePatterns* patterns, std::vector<std::string> active_nodes)
    : patterns_(patterns), active_nodes_(std::move(active_nodes)) {}

void AttemptLog::Add(const OutputLine& line, double seconds) {
  const std::string& text = line.text;
  RankIdentity identity;
  if (ParseRankAnnouncement(text, &identity)) {
    rank_nodes_[identity.rank] = identity.node;
    if (identity.pid > 0) rank_pids_[identity.rank] = identity.pid;
    return;
  }
  if (line.rank >= 0) {
    auto node = rank_nodes_.find(line.rank);
    if (node != rank_nodes_.end()) node_last_output_[NormalizeHost(node->second)] = seconds;
  }
  if (StartsWith(text, "step=")) {
    const int64_t step = std::strtoll(text.c_str() + 5, nullptr, 10);
    if (!first_step_) {
      first_step_ = step;
      first_step_seconds_ = seconds;
    }
    last_step_ = step;
    if (last_step_line_seconds_) {
      const double gap = seconds - *last_step_line_seconds_;
      longest_step_seconds_ = std::max(gap, longest_step_seconds_.value_or(0.0));
    }
    last_step_line_seconds_ = seconds;
  } else if (StartsWith(text, "phase=checkpoint ")) {
    auto longest = [](std::optional<double>* kept, std::optional<double> value) {
      if (value) *kept = std::max(*value, kept->value_or(0.0));
    };
    longest(&longest_stall_seconds_, NumberField(text, "stall_s"));
    longest(&longest_write_seconds_, NumberField(text, "write_s"));
  } else if (auto stopped = ParseStoppedLine(text)) {
    stopped_ = std::move(stopped);
  } else if (patterns_ && candidates_.size() < kMaxCandidates) {
    if (auto match = patterns_->Find(text))
      candidates_.push_back({*match, line.rank, DisplayLine(line)});
  }
  if (!time_limit_line_ && IsTimeLimitMessage(text)) time_limit_line_ = DisplayLine(line);
  const std::string shown = DisplayLine(line);
  tail_.push_back(shown);
  if (tail_.size() > kTailLines) tail_.pop_front();
  if (IsBoilerplate(text)) return;
  meaningful_.push_back(shown);
  if (meaningful_.size() > kTailLines) meaningful_.pop_front();
  if (StartsWith(text, "step=") || StartsWith(text, "phase=")) return;
  if (!first_error_line_ && NamesAnError(text)) first_error_line_ = shown;
  if (MentionsAFailure(text)) last_failure_line_ = shown;
}

std::string AttemptLog::EvidenceLine() const {
  if (first_error_line_) return *first_error_line_;
  if (last_failure_line_) return *last_failure_line_;
  return LastMeaningfulLine();
}

std::string AttemptLog::LastMeaningfulLine() const {
  return meaningful_.empty() ? "(no output)" : meaningful_.back();
}

std::optional<double> AttemptLog::longest_save_seconds() const {
  if (!longest_stall_seconds_ && !longest_write_seconds_) return std::nullopt;
  return longest_stall_seconds_.value_or(0.0) + longest_write_seconds_.value_or(0.0);
}

std::vector<std::string> AttemptLog::RankNodes() const {
  std::vector<std::string> nodes;
  for (const auto& [rank, node] : rank_nodes_)
    if (FindHost(nodes, node) < 0) nodes.push_back(node);
  return nodes;
}

std::optional<std::string> AttemptLog::ResolveNode(const Candidate& candidate) const {
  if (!candidate.match.host.empty()) {
    int index = FindHost(active_nodes_, candidate.match.host);
    if (index >= 0) return active_nodes_[index];
  }
  for (int rank : {candidate.match.rank, candidate.line_rank}) {
    auto node = rank_nodes_.find(rank);
    if (rank < 0 || node == rank_nodes_.end()) continue;
    int index = FindHost(active_nodes_, node->second);
    if (index >= 0) return active_nodes_[index];
  }
  return std::nullopt;
}

std::optional<NamedNode> AttemptLog::BadNode() const {
  for (const Candidate& candidate : candidates_) {
    if (auto node = ResolveNode(candidate))
      return NamedNode{*node, candidate.match.pattern, candidate.line};
  }
  return std::nullopt;
}

std::string AttemptLog::FirstSilentNode(double gap) const {
  if (active_nodes_.size() < 2) return "";
  std::string quietest;
  double quietest_time = 0, next_time = 0;
  bool first = true;
  for (const std::string& node : active_nodes_) {
    auto it = node_last_output_.find(NormalizeHost(node));
    if (it == node_last_output_.end()) return "";  // a node that never spoke tells nothing
    if (first || it->second < quietest_time) {
      next_time = first ? 1e300 : quietest_time;
      quietest_time = it->second;
      quietest = node;
    } else if (it->second < next_time) {
      next_time = it->second;
    }
    first = false;
  }
  return next_time - quietest_time >= gap ? quietest : "";
}

}  // namespace crucible
