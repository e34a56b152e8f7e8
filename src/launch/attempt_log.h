// What one attempt's output said, gathered line by line as it streams past (nothing is kept
// but the evidence): progress (`step=<n>` lines and the time between them), the save times the
// trainer reports (`phase=checkpoint ... stall_s= / write_s=`), its `stopped` line, which rank
// runs on which node (and pid), the first line a bad-node pattern matched, a scheduler's
// time-limit message, when each node last spoke, and the last lines for the summary.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "launch/bad_node_patterns.h"
#include "launch/command.h"

namespace crucible {

struct OutputLine {
  int rank = -1;     // from the launcher's label; -1 when the line has none
  std::string text;  // the line without its label
};
// Splits the rank label the MPI launcher put in front of a line.
OutputLine ParseOutputLine(std::string_view raw, LabelStyle style);
// The line as the launcher passes it through: "<rank>: text" or the text alone.
std::string DisplayLine(const OutputLine& line);

// Whole lines of each rank from one output stream of the MPI launcher. kTagged launchers label
// every chunk a rank writes, not every line, and chunks of different ranks interleave: rank 0's
// "step=1 loss=" and "2.5\n", written apart, arrive as
// "[1,0]<stdout>:step=1 loss=[1,1]<stdout>:hello\n[1,0]<stdout>:2.5\n". Each rank's pieces are
// joined up to its newline. kColon and kNone lines are taken as they come: srun sends whole
// lines (test_launch_slurm.py); PALS is assumed to, which no test here can check.
class RankLines {
 public:
  explicit RankLines(LabelStyle style, size_t max_line = 64 * 1024);
  // One line of the stream as read, without its newline: the ranks' lines it completes (a rank's
  // line that reaches max_line is passed on as it is).
  std::vector<OutputLine> Add(std::string_view raw);
  // At the end of the stream: what the ranks left unfinished, in rank order.
  std::vector<OutputLine> Finish();

 private:
  LabelStyle style_;
  size_t max_line_;
  std::map<int, std::string> pending_;  // rank (-1: unlabelled) -> its line so far
};

// The trainer's last word when a stop signal ended it (docs/architecture.md, "Progress line"):
// "stopped step=<n> signal=<SIG> checkpoint=<path|none> exit=<143|75>".
struct StoppedLine {
  int64_t step = 0;
  std::string signal;
  std::string checkpoint;  // "none" when it wrote none
  int exit_code = 0;
  std::string line;  // the line itself
};
// Parses that line (the path may hold spaces: it runs to the last " exit="); nullopt otherwise.
std::optional<StoppedLine> ParseStoppedLine(std::string_view text);

// A node a log line blamed, with the line itself as evidence.
struct NamedNode {
  std::string node;
  std::string pattern;
  std::string evidence;
};

class AttemptLog {
 public:
  AttemptLog(const BadNodePatterns* patterns, std::vector<std::string> active_nodes);

  // Feeds one line; `seconds` is the time since the attempt started.
  void Add(const OutputLine& line, double seconds);

  bool reached_step() const { return first_step_.has_value(); }
  std::optional<int64_t> first_step() const { return first_step_; }
  std::optional<int64_t> last_step() const { return last_step_; }
  std::optional<double> first_step_seconds() const { return first_step_seconds_; }
  const std::map<int, std::string>& rank_nodes() const { return rank_nodes_; }
  const std::map<int, int>& rank_pids() const { return rank_pids_; }  // as the ranks announced
  const std::optional<StoppedLine>& stopped() const { return stopped_; }
  // The longest time between two consecutive step= lines (a step, with whatever ran between);
  // nullopt before the second one.
  std::optional<double> longest_step_seconds() const { return longest_step_seconds_; }
  // The longest save the trainer reported: its longest stall_s plus its longest write_s (a
  // stop's synchronous save may first wait for a background one); nullopt before the first.
  std::optional<double> longest_save_seconds() const;
  // Distinct nodes ranks announced, in rank order.
  std::vector<std::string> RankNodes() const;
  const std::optional<std::string>& time_limit_line() const { return time_limit_line_; }
  const std::deque<std::string>& tail() const { return tail_; }

  // The line that best says why the attempt failed, as shown ("<rank>: text"): the first line
  // that names an error ("crucible: error: ...", "srun: error: ...", "ValueError: ..."), else
  // the last one that mentions a failure (killed, aborted, failed, ...), else the last line;
  // banners, separators and the MPI launchers' boilerplate are never chosen. "(no output)" when
  // there is nothing else.
  std::string EvidenceLine() const;
  // The last line that is not a banner, separator or boilerplate; "(no output)" if none.
  std::string LastMeaningfulLine() const;

  // The first pattern match that resolves to an active node (a host the match names, or the
  // node of the rank it names or the line came from).
  std::optional<NamedNode> BadNode() const;

  // The active node whose ranks went quiet first, when that is clear: every active node spoke
  // after its ranks started, and the quietest fell silent at least `gap` seconds before any
  // other. Empty otherwise.
  std::string FirstSilentNode(double gap) const;

 private:
  struct Candidate {
    BadNodePatterns::Match match;
    int line_rank;
    std::string line;
  };
  std::optional<std::string> ResolveNode(const Candidate& candidate) const;

  const BadNodePatterns* patterns_;
  std::vector<std::string> active_nodes_;
  std::optional<int64_t> first_step_, last_step_;
  std::optional<double> first_step_seconds_;
  std::map<int, std::string> rank_nodes_;
  std::map<int, int> rank_pids_;
  std::optional<StoppedLine> stopped_;
  std::optional<double> last_step_line_seconds_, longest_step_seconds_;
  std::optional<double> longest_stall_seconds_, longest_write_seconds_;
  std::map<std::string, double> node_last_output_;
  std::vector<Candidate> candidates_;
  std::optional<std::string> time_limit_line_;
  std::deque<std::string> tail_;        // every line
  std::deque<std::string> meaningful_;  // lines that are not banners or boilerplate
  std::optional<std::string> first_error_line_;
  std::optional<std::string> last_failure_line_;
};

}  // namespace crucible
