#include "report/top.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>

#include "ckpt/checkpoint.h"
#include "common/config.h"
#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"

namespace crucible {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double ModifiedSeconds(const struct stat& st) {
  return double(st.st_mtim.tv_sec) + 1e-9 * double(st.st_mtim.tv_nsec);
}

// The modification time of `path`; nullopt when it does not exist.
std::optional<double> ModifiedTime(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return ModifiedSeconds(st);
}

double Number(const nlohmann::json& record, const char* key) {
  const auto it = record.find(key);
  return it != record.end() && it->is_number() ? it->get<double>() : kNaN;
}

std::string Text(const nlohmann::json& record, const char* key) {
  const auto it = record.find(key);
  return it != record.end() && it->is_string() ? it->get<std::string>() : std::string("?");
}

// One metrics.jsonl line; nullopt for anything that is not a step record (a line a kill cut).
std::optional<TopStep> ParseStepLine(std::string_view line) {
  const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
  if (!record.is_object()) return std::nullopt;
  const auto step = record.find("step");
  if (step == record.end() || !step->is_number_integer()) return std::nullopt;
  return TopStep{step->get<int64_t>(), Number(record, "loss"), Number(record, "tok_per_s"),
                 Number(record, "step_seconds")};
}

// "step-<n>" -> n; nullopt for any other name.
std::optional<int64_t> StepOfFolderName(const std::string& name) {
  if (!StartsWith(name, "step-") || name.size() == 5 || name.size() > 24) return std::nullopt;
  if (!std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return std::stoll(name.substr(5));
}

// Cuts `text` to `width` code points (a terminal cell each, for the text top writes).
std::string Fit(const std::string& text, size_t width) {
  size_t cells = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) continue;  // continuation byte
    if (cells == width) return text.substr(0, i);
    ++cells;
  }
  return text;
}

std::string Row(const char* label, const std::string& value) {
  return StrFormat("%-13s", label) + value;
}

}  // namespace

MetricsTail::MetricsTail(std::string path, size_t keep, uint64_t first_read_bytes)
    : path_(std::move(path)),
      keep_(std::max<size_t>(keep, 1)),
      first_read_bytes_(first_read_bytes) {}

void MetricsTail::Add(const TopStep& step) {
  // A step at or before one already read: the file was rewritten under us; keep the new story.
  while (!steps_.empty() && steps_.back().step >= step.step) steps_.pop_back();
  steps_.push_back(step);
  while (steps_.size() > keep_) steps_.pop_front();
}

bool MetricsTail::Poll() {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) {
      exists_ = false;
      return false;
    }
    ThrowErrno("cannot open " + path_);
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) ThrowErrno("cannot stat " + path_);
  if (!S_ISREG(st.st_mode)) throw IoError(path_ + " is not a regular file");
  exists_ = true;
  modified_time_ = ModifiedSeconds(st);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (started_ && (st.st_dev != device_ || st.st_ino != inode_ || size < offset_)) {
    steps_.clear();  // replaced or truncated (a resume): read it again from the start
    started_ = false;
    ++restarts_;
  }
  bool skip_first_line = false;
  if (!started_) {
    started_ = true;
    device_ = st.st_dev;
    inode_ = st.st_ino;
    offset_ = size > first_read_bytes_ ? size - first_read_bytes_ : 0;
    skip_first_line = offset_ > 0;  // most likely the middle of a line
  }
  if (size <= offset_) return true;
  std::string text(size - offset_, '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::pread(fd, text.data() + got, text.size() - got, off_t(offset_ + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) ThrowErrno("cannot read " + path_);
    if (n == 0) break;
    got += size_t(n);
  }
  text.resize(got);
  size_t begin = 0;
  while (true) {
    const size_t end = text.find('\n', begin);
    if (end == std::string::npos) break;  // a half-written line waits for its newline
    if (!skip_first_line) {
      if (auto step = ParseStepLine(std::string_view(text).substr(begin, end - begin))) Add(*step);
    }
    skip_first_line = false;
    begin = end + 1;
  }
  offset_ += begin;
  return true;
}

std::optional<double> RecentStepSeconds(const std::vector<TopStep>& steps) {
  double sum = 0;
  size_t count = 0;
  for (auto it = steps.rbegin(); it != steps.rend() && count < kTopRecentSteps; ++it) {
    if (!std::isfinite(it->step_seconds) || it->step_seconds <= 0) continue;
    sum += it->step_seconds;
    ++count;
  }
  if (count == 0) return std::nullopt;
  return sum / double(count);
}

std::optional<double> EstimateEtaSeconds(const std::vector<TopStep>& steps,
                                         std::optional<int64_t> total_steps) {
  if (steps.empty() || !total_steps) return std::nullopt;
  const int64_t remaining = *total_steps - steps.back().step;
  if (remaining <= 0) return 0.0;
  const std::optional<double> step_seconds = RecentStepSeconds(steps);
  if (!step_seconds) return std::nullopt;
  return double(remaining) * *step_seconds;
}

double StallThresholdSeconds(const std::vector<TopStep>& steps, double fixed,
                             double floor_seconds) {
  if (fixed > 0) return fixed;
  const std::optional<double> step_seconds = RecentStepSeconds(steps);
  return std::max(floor_seconds, step_seconds ? 3 * *step_seconds : 0.0);
}

std::string Sparkline(const std::vector<double>& values, size_t width, bool unicode) {
  static const char* const kBlocks[8] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  static const char kAscii[] = "_.-~=+*#";
  const size_t count = std::min(values.size(), width);
  const auto first = values.end() - std::ptrdiff_t(count);
  double low = HUGE_VAL, high = -HUGE_VAL;
  for (auto it = first; it != values.end(); ++it) {
    if (!std::isfinite(*it)) continue;
    low = std::min(low, *it);
    high = std::max(high, *it);
  }
  std::string line;
  for (auto it = first; it != values.end(); ++it) {
    if (!std::isfinite(*it)) {
      line += ' ';
      continue;
    }
    int level = 3;  // all equal: the middle
    if (high > low) level = std::clamp(int(std::lround((*it - low) / (high - low) * 7)), 0, 7);
    if (unicode)
      line += kBlocks[level];
    else
      line += kAscii[level];
  }
  return line;
}

std::string FormatSeconds(double seconds) {
  if (!std::isfinite(seconds)) return "?";
  seconds = std::max(0.0, seconds);
  if (seconds < 10) return StrFormat("%.1f s", seconds);
  const long long s = std::llround(seconds);
  if (s < 60) return StrFormat("%lld s", s);
  if (s < 3600) return StrFormat("%lldm %02llds", s / 60, s % 60);
  if (s < 86400) return StrFormat("%lldh %02lldm", s / 3600, s / 60 % 60);
  return StrFormat("%lldd %02lldh", s / 86400, s / 3600 % 24);
}

bool LooksFinished(const TopSnapshot& snapshot) {
  if (!snapshot.steps.empty() && snapshot.total_steps &&
      snapshot.steps.back().step >= *snapshot.total_steps)
    return true;
  return snapshot.final_weights || snapshot.launcher_ended;
}

std::vector<TopLine> ComposeTopFrame(const TopSnapshot& s, const TopFrameOptions& options) {
  const size_t width = std::max<size_t>(options.width, 20);
  std::vector<TopLine> lines;
  auto add = [&](const std::string& text, bool alert = false) {
    lines.push_back({Fit(text, width), alert});
  };
  add("crucible top  " + (s.run_name.empty() ? std::string("?") : s.run_name) + "  " + s.run_dir);
  if (!s.run_dir_exists) {
    add("waiting for the run directory " + s.run_dir + " (no such folder yet)");
    return lines;
  }
  if (!s.metrics_exist || s.steps.empty()) {
    add(s.metrics_exist ? "waiting for the first step in metrics.jsonl"
                        : "waiting for metrics.jsonl (the run has logged no step yet)");
    if (s.attempt) add(Row("attempt", std::to_string(*s.attempt)));
    return lines;
  }
  const TopStep& last = s.steps.back();
  std::string step = std::to_string(last.step);
  if (s.total_steps) {
    step += " / " + std::to_string(*s.total_steps);
    if (*s.total_steps > 0)
      step += StrFormat("  (%.1f%%)", 100.0 * double(last.step) / double(*s.total_steps));
  } else {
    step += " / ?" + (s.config_problem.empty() ? "" : "  (" + s.config_problem + ")");
  }
  add(Row("step", step));

  std::vector<double> losses;
  losses.reserve(s.steps.size());
  for (const TopStep& t : s.steps) losses.push_back(t.loss);
  const size_t spark_width = width - 13;  // width >= 20
  const size_t shown = std::min(losses.size(), spark_width);
  double low = HUGE_VAL, high = -HUGE_VAL;
  for (size_t i = losses.size() - shown; i < losses.size(); ++i) {
    if (!std::isfinite(losses[i])) continue;
    low = std::min(low, losses[i]);
    high = std::max(high, losses[i]);
  }
  std::string loss = std::isfinite(last.loss) ? StrFormat("%.6f", last.loss) : "non-finite";
  if (low <= high) loss += StrFormat("   last %zu steps: min %.4f  max %.4f", shown, low, high);
  add(Row("loss", loss));
  add(Row("", Sparkline(losses, spark_width, options.unicode)));
  add(Row("tokens/s", std::isfinite(last.tokens_per_second)
                          ? StrFormat("%.1f", last.tokens_per_second)
                          : std::string("?")));

  const bool finished = LooksFinished(s);
  const std::optional<double> step_seconds = RecentStepSeconds(s.steps);
  const std::optional<double> eta = EstimateEtaSeconds(s.steps, s.total_steps);
  std::string eta_text = eta ? FormatSeconds(*eta) : std::string("?");
  if (eta && *eta > 0 && step_seconds)
    eta_text += StrFormat("  (%.3f s/step, mean of the last %zu)", *step_seconds,
                          std::min(kTopRecentSteps, s.steps.size()));
  add(Row("ETA", eta_text));

  if (s.checkpoint_step) {
    std::string checkpoint = "step " + std::to_string(*s.checkpoint_step);
    if (s.checkpoint_age_seconds)
      checkpoint += ", " + FormatSeconds(*s.checkpoint_age_seconds) + " ago";
    add(Row("checkpoint", checkpoint + "  (" + s.checkpoint_path + ")"));
  } else {
    add(Row("checkpoint", "none yet"));
  }
  if (s.attempt || !s.attempt_outcome.empty()) {
    std::string attempt = s.attempt ? std::to_string(*s.attempt) : std::string("?");
    if (!s.attempt_outcome.empty()) attempt += "  (" + s.attempt_outcome + ")";
    add(Row("attempt", attempt));
  } else {
    add(Row("attempt", "- (not started by crucible launch)"));
  }

  const double threshold = StallThresholdSeconds(s.steps, options.stall_seconds);
  const double since = s.seconds_since_step.value_or(0);
  const bool stalled = !finished && since > threshold;
  add(Row("stalled for", FormatSeconds(since) + (finished ? "  (finished)"
                                                          : "  (no step line since; alert above " +
                                                                FormatSeconds(threshold) + ")")),
      stalled);
  std::string state = "running";
  if (finished) {
    state = "finished";
    if (s.total_steps && last.step >= *s.total_steps)
      state += StrFormat(" (step %lld of %lld)", (long long)last.step, (long long)*s.total_steps);
    else if (s.launcher_ended)
      state = "launch ended (" + s.attempt_outcome + ")";
    else
      state += " (final weights written)";
  } else if (stalled) {
    state = "STALLED: no step for " + FormatSeconds(since);
  }
  add(Row("state", state), stalled);
  return lines;
}

double WallSeconds() {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return std::chrono::duration<double>(now).count();
}

TopWatcher::TopWatcher(std::string run_dir)
    : run_dir_(std::move(run_dir)), metrics_(JoinPath(run_dir_, "metrics.jsonl")) {}

void TopWatcher::ReadConfig() {
  const std::string path = JoinPath(run_dir_, "config.toml");
  const std::optional<double> modified = ModifiedTime(path);
  if (!modified) {
    config_problem_ = "config.toml not written yet";
    return;
  }
  if (*modified == config_time_) return;
  config_time_ = *modified;
  try {
    const Config config = Config::Parse(ReadConfigFile(path), path);
    run_name_ = config.String("job.name");
    total_steps_ = config.Int("training.steps");
    checkpoint_folder_ = config.String("checkpoint.folder");
    config_problem_.clear();
  } catch (const Error& e) {
    config_problem_ = e.what();
  }
}

TopSnapshot TopWatcher::Poll(double now) {
  TopSnapshot s;
  s.run_dir = run_dir_;
  s.run_dir_exists = IsDirectory(run_dir_);
  if (!s.run_dir_exists) return s;
  ReadConfig();
  s.run_name = run_name_;
  s.total_steps = total_steps_;
  s.config_problem = config_problem_;

  s.metrics_exist = metrics_.Poll();
  s.steps.assign(metrics_.steps().begin(), metrics_.steps().end());
  if (s.metrics_exist) s.seconds_since_step = now - metrics_.modified_time();

  // The newest checkpoint: the one `latest` names, else the newest step folder with COMPLETE.
  const std::string folder = checkpoint_folder_.empty() ? "ckpt" : checkpoint_folder_;
  const std::string root = StartsWith(folder, "/") ? folder : JoinPath(run_dir_, folder);
  const std::string latest = JoinPath(root, "latest");
  std::string name;
  if (FileExists(latest)) {
    try {
      name = Trim(ReadFile(latest));
    } catch (const Error&) {
      name.clear();  // replaced while read; the next poll sees the new one
    }
  }
  if (!StepOfFolderName(name)) {
    name.clear();
    for (const auto& [step, dir] : ListCheckpoints(root)) {
      if (FileExists(JoinPath(dir, "COMPLETE"))) {
        name = CheckpointDirName(step);
        break;
      }
    }
  }
  if (!name.empty()) {
    s.checkpoint_step = StepOfFolderName(name);
    s.checkpoint_path = JoinPath(folder, name);
    std::optional<double> saved = ModifiedTime(JoinPath(JoinPath(root, name), "COMPLETE"));
    if (!saved) saved = ModifiedTime(latest);
    if (saved) s.checkpoint_age_seconds = now - *saved;
  }

  // The launcher's attempt: the newest attempt-<k>.log (written while k runs) or record.
  const std::string launch = JoinPath(run_dir_, "launch");
  int newest_log = 0;
  if (DIR* dir = ::opendir(launch.c_str())) {
    while (const dirent* entry = ::readdir(dir)) {
      const std::string entry_name = entry->d_name;
      if (!StartsWith(entry_name, "attempt-") || !EndsWith(entry_name, ".log")) continue;
      const std::string digits = entry_name.substr(8, entry_name.size() - 12);
      if (digits.empty() || digits.size() > 6 ||
          !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
        continue;
      newest_log = std::max(newest_log, std::stoi(digits));
    }
    ::closedir(dir);
  }
  const std::string attempts_path = JoinPath(launch, "attempts.jsonl");
  int recorded = 0;
  std::string action;
  if (FileExists(attempts_path)) {
    for (const std::string& line : Split(ReadFile(attempts_path), '\n')) {
      const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
      if (!record.is_object() || Text(record, "kind") != "attempt") continue;
      const auto attempt = record.find("attempt");
      if (attempt == record.end() || !attempt->is_number_integer()) continue;
      recorded = attempt->get<int>();
      action = Text(record, "action");
      s.attempt_outcome = StrFormat("attempt %d: %s -> %s", recorded,
                                    Text(record, "verdict").c_str(), action.c_str());
    }
  }
  if (newest_log > 0 || recorded > 0) s.attempt = std::max(newest_log, recorded);
  s.launcher_ended = recorded > 0 && recorded >= newest_log && action != "retry" &&
                     action != "swap" && action != "blind-swap";

  const std::optional<double> weights = ModifiedTime(JoinPath(run_dir_, "model.safetensors"));
  s.final_weights = weights && s.metrics_exist && *weights >= metrics_.modified_time();
  return s;
}

}  // namespace crucible
