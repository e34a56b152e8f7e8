#include "launch/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/files.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/timer.h"
#include "launch/process.h"
#include "launch/rank_environment.h"
#include "launch/stop.h"

namespace crucible {
namespace {

int signal_pipe[2] = {-1, -1};
std::atomic<int> first_signal{0};
std::atomic<int> signal_count{0};
std::atomic<int> hard_signal_count{0};  // SIGTERM, SIGINT, SIGHUP: a repeated SIGUSR1 is not one

void WakeUp() {
  const int saved = errno;
  char byte = 1;
  ssize_t ignored = write(signal_pipe[1], &byte, 1);
  (void)ignored;
  errno = saved;
}

void OnSignal(int signal_number) {
  int expected = 0;
  first_signal.compare_exchange_strong(expected, signal_number);
  signal_count.fetch_add(1);
  if (signal_number != SIGUSR1) hard_signal_count.fetch_add(1);
  WakeUp();
}

void OnChild(int) {
  WakeUp();
}

void WriteAll(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {  // a closed or full stdout must not stop the job; main reports it at the end
      if (fd == 1) RecordStdoutError(n < 0 ? errno : EIO);
      return;
    }
    done += static_cast<size_t>(n);
  }
}

void DrainSignalPipe() {
  char buffer[64];
  while (read(signal_pipe[0], buffer, sizeof(buffer)) > 0) {
  }
}

constexpr size_t kMaxLine = 64 * 1024;

// One output stream of the job: bytes in, complete lines of each rank out.
struct Stream {
  Stream(int fd, int out_fd, LabelStyle labels) : fd(fd), out_fd(out_fd), ranks(labels, kMaxLine) {}
  int fd;
  int out_fd;
  std::string partial;
  RankLines ranks;
  bool open() const { return fd >= 0; }
};

class Watcher {
 public:
  Watcher(const SupervisorOptions& options, AttemptLog* log) : options_(options), log_(log) {
    if (!options.log_path.empty()) {
      log_fd_ = open(options.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (log_fd_ < 0) ThrowErrno("cannot open attempt log " + options.log_path);
    }
  }
  ~Watcher() {
    if (log_fd_ >= 0) close(log_fd_);
  }

  // Reads what is available; returns false at end of stream.
  bool Read(Stream* stream) {
    char buffer[65536];
    ssize_t n = read(stream->fd, buffer, sizeof(buffer));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (n <= 0) {
      if (!stream->partial.empty()) Line(stream, stream->partial);
      stream->partial.clear();
      for (const OutputLine& line : stream->ranks.Finish()) Show(stream, line);
      close(stream->fd);
      stream->fd = -1;
      return false;
    }
    size_t start = 0;
    for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
      if (buffer[i] != '\n') continue;
      stream->partial.append(buffer + start, i - start);
      Line(stream, stream->partial);
      stream->partial.clear();
      start = i + 1;
    }
    stream->partial.append(buffer + start, n - start);
    if (stream->partial.size() >= kMaxLine) {
      Line(stream, stream->partial);
      stream->partial.clear();
    }
    return true;
  }

  double last_line_seconds() const { return last_line_seconds_; }
  double first_line_seconds() const { return first_line_seconds_; }
  const Timer& timer() const { return timer_; }

 private:
  void Line(Stream* stream, const std::string& raw) {
    const double now = timer_.Seconds();
    last_line_seconds_ = now;
    if (first_line_seconds_ < 0) first_line_seconds_ = now;
    for (const OutputLine& line : stream->ranks.Add(raw)) Show(stream, line);
  }

  void Show(Stream* stream, const OutputLine& line) {
    if (log_) log_->Add(line, timer_.Seconds());
    std::string shown = DisplayLine(line) + "\n";
    if (log_fd_ >= 0) WriteAll(log_fd_, shown);
    RankIdentity ignored;
    if (options_.pass_through && !ParseRankAnnouncement(line.text, &ignored))
      WriteAll(stream->out_fd, shown);
  }

  const SupervisorOptions& options_;
  AttemptLog* log_;
  int log_fd_ = -1;
  Timer timer_;
  double last_line_seconds_ = 0;
  double first_line_seconds_ = -1;
};

// Asks the job to stop: SIGUSR1 to the launch command (mpirun, mpiexec and srun forward it to
// every rank, remote ones included, and do not end the job for it; with no MPI launcher the
// command is the rank itself) and to every rank that announced a pid which is a process of this
// job on this host (the marker proves it), so local ranks hear it even if forwarding fails.
void DeliverStop(pid_t child, const AttemptLog* log, const std::string& marker) {
  kill(child, SIGUSR1);
  if (!log) return;
  for (const auto& [rank, pid] : log->rank_pids())
    if (pid != child && ProcessCarries(pid, marker)) kill(pid, SIGUSR1);
}

// Signals the job's process group and every process of the job.
void SignalJob(pid_t child, const std::string& marker, int signal_number) {
  kill(-child, signal_number);
  for (pid_t pid : JobProcesses(marker)) kill(pid, signal_number);
}

// Reaps every exited child (as subreaper, orphaned ranks too); records the job's own status.
void Reap(pid_t child, int* child_status, bool* child_done) {
  while (true) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    if (pid == child) {
      *child_status = status;
      *child_done = true;
    }
  }
}

}  // namespace

void InstallLaunchSignalHandlers() {
  if (signal_pipe[0] >= 0) return;
  if (pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) ThrowErrno("pipe");
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;
  for (int s : {SIGTERM, SIGINT, SIGHUP, SIGUSR1}) sigaction(s, &action, nullptr);
  action.sa_handler = OnChild;
  action.sa_flags = SA_NOCLDSTOP;
  sigaction(SIGCHLD, &action, nullptr);  // wakes poll() when the job exits
  signal(SIGPIPE, SIG_IGN);
  BecomeSubreaper();
}

int PendingLaunchSignal() {
  return first_signal.load();
}

bool SleepUnlessSignalled(double seconds) {
  Timer timer;
  while (PendingLaunchSignal() == 0) {
    double left = seconds - timer.Seconds();
    if (left <= 0) return true;
    pollfd p{signal_pipe[0], POLLIN, 0};
    poll(&p, 1, static_cast<int>(std::min(left, 1.0) * 1000) + 1);
    DrainSignalPipe();
  }
  return false;
}

AttemptRun RunSupervised(const LaunchCommand& command, const SupervisorOptions& options,
                         AttemptLog* log) {
  InstallLaunchSignalHandlers();
  if (!command.hostfile_path.empty())
    AtomicWriteFile(command.hostfile_path, command.hostfile_contents);
  Watcher watcher(options, log);
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) ThrowErrno("pipe");
  const int signals_before = signal_count.load();
  const int hard_signals_before = hard_signal_count.load();

  const pid_t launcher = getpid();
  pid_t child = fork();
  if (child < 0) ThrowErrno("fork");
  if (child == 0) {
    setsid();
    // The job must not outlive the launcher, even a SIGKILLed one: on SIGTERM mpirun and mpiexec
    // end their ranks and srun cancels its step (and each rank dies with its parent, see
    // ExecRank). A launcher gone before this took effect has re-parented us already.
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != launcher) _exit(kExitFailure);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    int null = open("/dev/null", O_RDONLY);
    dup2(null, 0);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    for (const auto& [key, value] : command.env) setenv(key.c_str(), value.c_str(), 1);
    std::vector<char*> args;
    for (const std::string& arg : command.argv) args.push_back(const_cast<char*>(arg.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::string message = "crucible launch: error: cannot run " + command.argv[0] + ": " +
                          std::strerror(errno) + "\n";
    WriteAll(2, message);
    _exit(errno == ENOENT ? 127 : 126);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  Stream streams[2] = {{out_pipe[0], 1, command.labels}, {err_pipe[0], 2, command.labels}};

  AttemptRun run;
  int child_status = 0;
  bool child_done = false;
  double drain_deadline = -1;  // after the child exits, how long leftover writers may hold pipes
  int signals_seen = signals_before;

  // Ends the job: SIGTERM (and SIGCONT) to every process of it, --kill-grace, then SIGKILL
  // until nothing is left; `at_once` skips to SIGKILL.
  auto kill_job = [&](bool at_once) {
    if (!at_once) {
      SignalJob(child, options.marker, SIGTERM);
      SignalJob(child, options.marker, SIGCONT);
      Timer grace;
      while (grace.Seconds() < options.kill_grace_seconds) {
        Reap(child, &child_status, &child_done);
        if (child_done && JobProcesses(options.marker).empty()) return;
        usleep(20000);
      }
    }
    if (options.before_kill) options.before_kill();
    Timer hard;
    while (hard.Seconds() < 10) {
      SignalJob(child, options.marker, SIGKILL);
      usleep(10000);
      Reap(child, &child_status, &child_done);
      if (child_done && JobProcesses(options.marker).empty()) return;
    }
  };

  double stop_started = -1, stop_deadline = -1;
  bool kill_at_once = false;
  int hard_signals_at_stop = 0;
  while (streams[0].open() || streams[1].open() || !child_done) {
    const double now = watcher.timer().Seconds();
    // A signal to the launcher asks the job to stop (SIGUSR1 to the ranks, see launch/stop.h)
    // and waits for it, up to the stop grace; a second SIGTERM, SIGINT or SIGHUP kills the job
    // at once (a repeated SIGUSR1, a scheduler's warning sent again, changes nothing).
    const int signals_now = signal_count.load();
    if (signals_now != signals_seen) {
      signals_seen = signals_now;
      if (run.signal_received == 0) {
        run.signal_received = PendingLaunchSignal();
        hard_signals_at_stop = hard_signals_before + (run.signal_received != SIGUSR1 ? 1 : 0);
        if (!child_done) {
          run.stop_requested = true;
          const AttemptLog nothing_seen(nullptr, {});
          run.stop_grace_seconds =
              StopGraceSeconds(log ? *log : nothing_seen, options.kill_grace_seconds);
          stop_started = now;
          stop_deadline = now + run.stop_grace_seconds;
          DeliverStop(child, log, options.marker);
        }
      }
      if (hard_signal_count.load() > hard_signals_at_stop) {
        run.stop_end = "was killed at once by a second signal to the launcher";
        kill_at_once = true;
        break;
      }
    }
    double wait = 1.0;
    if (stop_deadline >= 0 && !child_done) {
      if (now >= stop_deadline) {
        run.stop_end =
            StrFormat("was killed after the stop grace of %.1f s", run.stop_grace_seconds);
        break;
      }
      wait = std::min(wait, stop_deadline - now);
    }
    if (options.timeout_seconds > 0) {
      double silent_for = now - watcher.last_line_seconds();
      if (silent_for >= options.timeout_seconds) {
        run.timed_out = true;
        if (run.stop_requested)
          run.stop_end = StrFormat("went silent for %.0f s during the stop (watchdog)",
                                   options.timeout_seconds);
        break;
      }
      wait = std::min(wait, options.timeout_seconds - silent_for);
    }
    if (child_done) {
      if (drain_deadline < 0) drain_deadline = now + 2.0;
      if (now >= drain_deadline) break;
      wait = std::min(wait, drain_deadline - now);
    }
    pollfd fds[3];
    int count = 0;
    for (Stream& s : streams)
      if (s.open()) fds[count++] = {s.fd, POLLIN, 0};
    fds[count++] = {signal_pipe[0], POLLIN, 0};
    int ready = poll(fds, count, static_cast<int>(wait * 1000) + 1);
    if (ready < 0 && errno != EINTR) ThrowErrno("poll");
    DrainSignalPipe();
    for (Stream& s : streams) {
      if (!s.open()) continue;
      for (int i = 0; i < count; ++i)
        if (fds[i].fd == s.fd && fds[i].revents) watcher.Read(&s);
    }
    Reap(child, &child_status, &child_done);
  }
  // Whatever is still running now is the silent job, a job signalled twice, one past its stop
  // grace, or a leftover holding our pipes.
  if (run.timed_out || !child_done || !JobProcesses(options.marker).empty()) kill_job(kill_at_once);
  if (stop_started >= 0) run.stop_seconds = watcher.timer().Seconds() - stop_started;
  // Read what the writers left; a writer this host cannot see must not hold us forever.
  for (Stream& s : streams) {
    while (s.open()) {
      pollfd p{s.fd, POLLIN, 0};
      if (poll(&p, 1, 1000) <= 0) {
        close(s.fd);
        s.fd = -1;
      } else {
        watcher.Read(&s);
      }
    }
  }
  while (!child_done) {
    int status = 0;
    pid_t pid = waitpid(child, &status, 0);
    if (pid == child) child_status = status, child_done = true;
    if (pid < 0 && errno != EINTR) break;
  }
  run.exit_code = run.timed_out ? kExitTimeout : ExitCodeFromStatus(child_status);
  run.seconds = watcher.timer().Seconds();
  run.first_line_seconds = watcher.first_line_seconds();
  return run;
}

}  // namespace crucible
