#include "rl/rewards.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/error.h"

extern char** environ;

namespace crucible {
namespace {

std::uint64_t SplitMix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A stream of draws that depends only on (seed, index).
class ProblemRandom {
 public:
  ProblemRandom(std::uint64_t seed, std::uint64_t index)
      : state_(SplitMix64(SplitMix64(seed) ^ index)) {}
  // Uniform in [low, high] (the modulo bias of a 64-bit draw over these small ranges is < 1e-17).
  std::uint64_t Uniform(std::uint64_t low, std::uint64_t high) {
    state_ = SplitMix64(state_);
    return low + state_ % (high - low + 1);
  }
  // A number of exactly `digits` decimal digits (0-9 for one digit).
  std::uint64_t Number(int digits) {
    std::uint64_t value = digits == 1 ? Uniform(0, 9) : Uniform(1, 9);
    for (int i = 1; i < digits; ++i) value = value * 10 + Uniform(0, 9);
    return value;
  }

 private:
  std::uint64_t state_;
};

constexpr const char* kFormatInstruction = " Finish with a line \"Answer: <integer>\".";

// "-007" -> "-7", "-0" -> "0": the canonical decimal form of an integer written with digits.
std::string CanonicalInteger(std::string_view text) {
  bool negative = !text.empty() && text[0] == '-';
  if (negative) text.remove_prefix(1);
  while (text.size() > 1 && text[0] == '0') text.remove_prefix(1);
  if (text == "0") negative = false;
  std::string canonical = negative ? "-" : "";
  canonical.append(text);
  return canonical;
}

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

// A text for a one-line message: newlines escaped, at most `limit` characters.
std::string Shorten(std::string_view text, std::size_t limit) {
  std::string out;
  for (char c : text) {
    if (out.size() >= limit) return out + "...";
    if (c == '\n')
      out += "\\n";
    else if (c == '\r' || c == '\t')
      out += ' ';
    else
      out += c;
  }
  return out;
}

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { Close(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

// Blocks SIGPIPE in this thread while it writes to a pipe whose reader may be gone (write then
// fails with EPIPE), and discards the SIGPIPE that such a write leaves pending.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigset_t pipe_set;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &previous_);
  }
  ~SigpipeBlock() {
    sigset_t pipe_set, pending;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    sigpending(&pending);
    if (sigismember(&pending, SIGPIPE) && !sigismember(&previous_, SIGPIPE)) {
      const timespec zero{0, 0};
      sigtimedwait(&pipe_set, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }
  const sigset_t& previous() const { return previous_; }

 private:
  sigset_t previous_;
};

std::string CommandInput(const std::vector<RewardCommandItem>& items) {
  std::string input;
  for (std::size_t i = 0; i < items.size(); ++i) {
    nlohmann::json line = items[i].extra.is_object() ? items[i].extra : nlohmann::json::object();
    line["prompt"] = items[i].prompt;
    line["completion"] = items[i].completion;
    line["index"] = i;
    input += line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    input += '\n';
  }
  return input;
}

}  // namespace

RewardTask ParseRewardTask(const std::string& name, const std::string& key) {
  if (name == "sum_digits") return RewardTask::kSumDigits;
  if (name == "addition") return RewardTask::kAddition;
  throw UsageError(key + " = \"" + name +
                   "\": expected a built-in task, \"sum_digits\" or \"addition\"");
}

const char* RewardTaskName(RewardTask task) {
  return task == RewardTask::kSumDigits ? "sum_digits" : "addition";
}

TaskProblem MakeProblem(RewardTask task, std::uint64_t seed, std::uint64_t index) {
  ProblemRandom random(seed, index);
  TaskProblem problem;
  if (task == RewardTask::kSumDigits) {
    const std::uint64_t number = random.Number(static_cast<int>(random.Uniform(2, 8)));
    std::uint64_t sum = 0;
    for (std::uint64_t rest = number; rest > 0; rest /= 10) sum += rest % 10;
    problem.prompt =
        "What is the sum of the digits of " + std::to_string(number) + "?" + kFormatInstruction;
    problem.answer = std::to_string(sum);
  } else {
    const std::uint64_t a = random.Number(static_cast<int>(random.Uniform(1, 6)));
    const std::uint64_t b = random.Number(static_cast<int>(random.Uniform(1, 6)));
    problem.prompt =
        "What is " + std::to_string(a) + " + " + std::to_string(b) + "?" + kFormatInstruction;
    problem.answer = std::to_string(a + b);
  }
  return problem;
}

AnswerCheck CheckAnswer(std::string_view completion, std::string_view expected) {
  AnswerCheck check;
  const std::size_t marker = completion.rfind("Answer:");
  if (marker == std::string_view::npos) return check;
  std::size_t at = marker + 7;
  while (at < completion.size() && (completion[at] == ' ' || completion[at] == '\t')) ++at;
  const std::size_t start = at;
  if (at < completion.size() && completion[at] == '-') ++at;
  const std::size_t digits_start = at;
  while (at < completion.size() && completion[at] >= '0' && completion[at] <= '9') ++at;
  const std::size_t digits = at - digits_start;
  if (digits < 1 || digits > 40) return check;
  const std::string_view integer = completion.substr(start, at - start);
  for (; at < completion.size(); ++at)
    if (!IsSpace(completion[at])) return check;
  check.format_ok = true;
  check.correct = CanonicalInteger(integer) == CanonicalInteger(expected);
  check.reward = check.correct ? 1 : 0;
  return check;
}

std::vector<double> RunRewardCommand(const std::string& command,
                                     const std::vector<RewardCommandItem>& items,
                                     double timeout_seconds) {
  const std::string name = "reward command `" + Shorten(command, 80) + "`";
  const auto prompt_of = [&](std::size_t i) {
    return "completion " + std::to_string(i) + ", prompt \"" + Shorten(items[i].prompt, 60) + "\"";
  };
  const std::string input = CommandInput(items);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);

  int in_pipe[2], out_pipe[2];
  if (pipe2(in_pipe, O_CLOEXEC) != 0) ThrowErrno("cannot create a pipe for the " + name);
  Fd in_read(in_pipe[0]), in_write(in_pipe[1]);
  if (pipe2(out_pipe, O_CLOEXEC) != 0) ThrowErrno("cannot create a pipe for the " + name);
  Fd out_read(out_pipe[0]), out_write(out_pipe[1]);

  SigpipeBlock sigpipe_block;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_read.get(), STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out_write.get(), STDOUT_FILENO);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&attributes, 0);  // its own process group, killed whole on a timeout
  posix_spawnattr_setsigmask(&attributes, &sigpipe_block.previous());
  sigset_t default_signals;
  sigemptyset(&default_signals);
  sigaddset(&default_signals, SIGPIPE);
  posix_spawnattr_setsigdefault(&attributes, &default_signals);
  const char* argv[] = {"sh", "-c", command.c_str(), nullptr};
  pid_t pid = 0;
  const int spawned =
      posix_spawn(&pid, "/bin/sh", &actions, &attributes, const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (spawned != 0) {
    errno = spawned;
    ThrowErrno("cannot start the " + name);
  }
  in_read.Close();
  out_write.Close();
  const auto kill_and_throw_timeout = [&]() {
    kill(-pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%g", timeout_seconds);
    throw DataError(
        name + " ran past its timeout of " + seconds + " s on a batch of " +
        std::to_string(items.size()) +
        " completions; its process group was killed (raise the timeout or fix the command)");
  };

  // Write stdin and read stdout together, so that neither side waits on a full pipe.
  fcntl(in_write.get(), F_SETFL, O_NONBLOCK);
  fcntl(out_read.get(), F_SETFL, O_NONBLOCK);
  std::size_t written = 0;
  if (input.empty()) in_write.Close();
  std::string output;
  char buffer[65536];
  for (bool stdout_open = true; stdout_open;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) kill_and_throw_timeout();
    pollfd fds[2] = {{out_read.get(), POLLIN, 0}, {in_write.get(), POLLOUT, 0}};
    const int count = poll(fds, in_write.get() >= 0 ? 2 : 1,
                           static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (count < 0 && errno != EINTR) ThrowErrno("poll on the " + name);
    if (count <= 0) continue;
    if (in_write.get() >= 0 && fds[1].revents != 0) {
      const ssize_t n = write(in_write.get(), input.data() + written, input.size() - written);
      if (n > 0) written += static_cast<std::size_t>(n);
      // EPIPE: the command stopped reading; its exit status and output tell whether that is an
      // error.
      if ((n < 0 && errno != EAGAIN && errno != EINTR) || written == input.size()) in_write.Close();
    }
    if (fds[0].revents != 0) {
      for (;;) {
        const ssize_t n = read(out_read.get(), buffer, sizeof buffer);
        if (n > 0) {
          output.append(buffer, static_cast<std::size_t>(n));
          continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EINTR)) stdout_open = false;
        break;
      }
    }
  }
  in_write.Close();

  int status = 0;
  for (;;) {
    const pid_t waited = waitpid(pid, &status, WNOHANG);
    if (waited == pid) break;
    if (waited < 0 && errno != EINTR) ThrowErrno("waitpid on the " + name);
    if (std::chrono::steady_clock::now() >= deadline) kill_and_throw_timeout();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (WIFSIGNALED(status))
    throw DataError(name + " was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
                    strsignal(WTERMSIG(status)) + ") on a batch of " +
                    std::to_string(items.size()) + " completions; its stderr is above");
  if (WEXITSTATUS(status) != 0)
    throw DataError(name + " exited with status " + std::to_string(WEXITSTATUS(status)) +
                    " on a batch of " + std::to_string(items.size()) +
                    " completions; its stderr is above");

  std::vector<double> rewards;
  std::size_t line_start = 0;
  while (line_start < output.size()) {
    std::size_t line_end = output.find('\n', line_start);
    if (line_end == std::string::npos) line_end = output.size();
    std::string line = output.substr(line_start, line_end - line_start);
    line_start = line_end + 1;
    const std::size_t index = rewards.size();
    if (index >= items.size())
      throw DataError(name + " printed more than " + std::to_string(items.size()) + " lines for " +
                      std::to_string(items.size()) +
                      " completions; it must print one reward per line");
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::size_t first = 0, last = line.size();
    while (first < last && (line[first] == ' ' || line[first] == '\t')) ++first;
    while (last > first && (line[last - 1] == ' ' || line[last - 1] == '\t')) --last;
    const std::string text = line.substr(first, last - first);
    char* end = nullptr;
    const double value = text.empty() ? NAN : std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(value))
      throw DataError(name + " line " + std::to_string(index + 1) + " \"" + Shorten(line, 40) +
                      "\" is not a finite number (" + prompt_of(index) +
                      "); it must print one reward per line");
    rewards.push_back(value);
  }
  if (rewards.size() < items.size())
    throw DataError(name + " printed " + std::to_string(rewards.size()) + " lines for " +
                    std::to_string(items.size()) + " completions: no reward for " +
                    prompt_of(rewards.size()) + "; it must print one reward per line");
  return rewards;
}

}  // namespace crucible
