// `crucible top RUN`: what a run directory says about a running job, read from its files alone
// (it works over a shared filesystem, with no connection to the job), and the text frame that
// shows it. Three layers:
//
//   MetricsTail    reads <run>/metrics.jsonl incrementally: it remembers the offset after the
//                  last whole line, ignores a half-written last line until its newline arrives,
//                  and starts over when the file shrinks or is replaced (a resumed trainer
//                  rewrites it without the steps after its checkpoint).
//   TopWatcher     one poll of the run directory -> a TopSnapshot: the recent steps, the total
//                  (training.steps of <run>/config.toml), the newest checkpoint (<folder>/latest),
//                  the launcher's attempt (launch/attempt-<k>.log, launch/attempts.jsonl) and the
//                  age of metrics.jsonl, i.e. the time since the last step line.
//   ComposeTopFrame  snapshot -> lines of text, a pure function (the live view draws them with
//                  ncurses, --once prints them).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

namespace crucible {

// One line of metrics.jsonl, the fields `top` shows. NaN where the line holds null.
struct TopStep {
  int64_t step = 0;
  double loss = 0;
  double tokens_per_second = 0;
  double step_seconds = 0;
};

class MetricsTail {
 public:
  // `keep`: how many of the newest steps to hold. A first read of a file larger than
  // `first_read_bytes` starts that many bytes before its end (only recent steps are shown).
  explicit MetricsTail(std::string path, size_t keep = 4096,
                       uint64_t first_read_bytes = uint64_t{4} << 20);

  // Reads what was appended since the last call. False when the file does not exist (the steps
  // read before are kept). Throws IoError when it exists but cannot be read.
  bool Poll();

  const std::string& path() const { return path_; }
  const std::deque<TopStep>& steps() const { return steps_; }
  bool exists() const { return exists_; }
  double modified_time() const { return modified_time_; }  // seconds since the epoch
  int restarts() const { return restarts_; }               // times the file shrank or was replaced

 private:
  void Add(const TopStep& step);

  std::string path_;
  size_t keep_;
  uint64_t first_read_bytes_;
  bool exists_ = false, started_ = false;
  dev_t device_ = 0;
  ino_t inode_ = 0;
  uint64_t offset_ = 0;  // just after the last whole line read
  double modified_time_ = 0;
  int restarts_ = 0;
  std::deque<TopStep> steps_;
};

// What the run directory says at one moment.
struct TopSnapshot {
  std::string run_dir;
  std::string run_name;  // job.name of config.toml; "" when unknown
  bool run_dir_exists = false;
  bool metrics_exist = false;
  std::vector<TopStep> steps;          // the recent steps, oldest first
  std::optional<int64_t> total_steps;  // training.steps
  std::string config_problem;          // why config.toml could not be read ("" when it could)
  std::optional<int64_t> checkpoint_step;
  std::string checkpoint_path;
  std::optional<double> checkpoint_age_seconds;
  std::optional<int> attempt;   // the launcher's attempt number, when launched by it
  std::string attempt_outcome;  // the last finished attempt: "attempt 1: <verdict> -> <action>"
  bool launcher_ended = false;  // the current attempt has its record and no retry follows
  bool final_weights = false;   // <run>/model.safetensors, written at the end of training
  std::optional<double> seconds_since_step;  // age of metrics.jsonl
};

// The number of recent steps the ETA and the stall threshold average over.
inline constexpr size_t kTopRecentSteps = 20;

// The mean step_seconds of the last kTopRecentSteps steps (finite and positive ones); nullopt
// when there is none.
std::optional<double> RecentStepSeconds(const std::vector<TopStep>& steps);
// Seconds to finish: (total - last step) x RecentStepSeconds; 0 once the last step is reached;
// nullopt without steps, a total or a step time.
std::optional<double> EstimateEtaSeconds(const std::vector<TopStep>& steps,
                                         std::optional<int64_t> total_steps);
// How long without a step line counts as stalled: `fixed` when given (> 0), else 3 x the recent
// step time, at least `floor_seconds` (file times over a shared filesystem lag by seconds).
double StallThresholdSeconds(const std::vector<TopStep>& steps, double fixed,
                             double floor_seconds = 5);

// The loss curve in `width` cells, newest last: the last `width` values scaled from their minimum
// (▁) to their maximum (█); all equal draw ▄; a non-finite value is a blank. `unicode` false draws
// the ASCII levels "_.-~=+*#" instead (a terminal without UTF-8).
std::string Sparkline(const std::vector<double>& values, size_t width, bool unicode = true);

// "0.4 s", "12 s", "3m 05s", "2h 07m", "3d 04h".
std::string FormatSeconds(double seconds);

struct TopLine {
  std::string text;
  bool alert = false;  // drawn highlighted (a stall)
};
struct TopFrameOptions {
  size_t width = 80;         // cells per line
  bool unicode = true;       // sparkline characters
  double stall_seconds = 0;  // fixed stall threshold; 0: StallThresholdSeconds
};
// The frame for `snapshot`; no line is wider than `width` cells.
std::vector<TopLine> ComposeTopFrame(const TopSnapshot& snapshot, const TopFrameOptions& options);
// True when the snapshot says the job is over: its last step is training.steps, or the final
// weights were written after the last step line, or the launcher recorded its last attempt.
bool LooksFinished(const TopSnapshot& snapshot);

// Polls one run directory; keeps what it read between polls.
class TopWatcher {
 public:
  explicit TopWatcher(std::string run_dir);
  // `now`: seconds since the epoch. Throws IoError when a file exists but cannot be read.
  TopSnapshot Poll(double now);

 private:
  void ReadConfig();

  std::string run_dir_;
  MetricsTail metrics_;
  double config_time_ = -1;
  std::string run_name_, checkpoint_folder_, config_problem_;
  std::optional<int64_t> total_steps_;
};

// Seconds since the epoch, as file modification times count them.
double WallSeconds();

}  // namespace crucible
