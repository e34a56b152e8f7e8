#include "launch/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/strings.h"
#include "common/timer.h"

namespace crucible {
namespace {

bool IsPid(const char* name) {
  if (!*name) return false;
  for (const char* c = name; *c; ++c)
    if (*c < '0' || *c > '9') return false;
  return true;
}

// Parent pid from /proc/<pid>/stat ("pid (comm) state ppid ..."; comm may hold spaces).
pid_t ParentOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(stat.substr(close + 2));
  char state;
  pid_t parent = -1;
  rest >> state >> parent;
  if (state == 'Z') return -1;  // zombies are gone already; only reaping remains
  return parent;
}

bool EnvironmentHas(pid_t pid, const std::string& marker) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  std::string entry;
  while (std::getline(in, entry, '\0'))
    if (entry == marker) return true;
  return false;
}

}  // namespace

int ExitCodeFromStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string FindExecutable(const std::string& name, const Environment& env) {
  if (name.find('/') != std::string::npos) return access(name.c_str(), X_OK) == 0 ? name : "";
  auto path = env.find("PATH");
  const std::string dirs = path == env.end() ? "/usr/local/bin:/usr/bin:/bin" : path->second;
  for (const std::string& dir : Split(dirs, ':')) {
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

CaptureResult RunCapture(const std::vector<std::string>& argv, double timeout_s) {
  CaptureResult result;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return result;
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return result;
  }
  if (pid == 0) {
    int null = open("/dev/null", O_RDONLY);
    dup2(null, 0);
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  Timer timer;
  char buffer[4096];
  while (true) {
    double left = timeout_s - timer.Seconds();
    if (left <= 0) {
      kill(pid, SIGKILL);
      result.timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    int ready = poll(&p, 1, static_cast<int>(left * 1000) + 1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    ssize_t n = read(fds[0], buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    result.output.append(buffer, n);
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.exit_code = result.timed_out ? 124 : ExitCodeFromStatus(status);
  return result;
}

bool ProcessCarries(pid_t pid, const std::string& marker) {
  return pid > 0 && ParentOf(pid) >= 0 && EnvironmentHas(pid, marker);
}

void BecomeSubreaper() {
  prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
}

std::vector<pid_t> JobProcesses(const std::string& marker) {
  std::vector<std::pair<pid_t, pid_t>> table;  // (pid, parent)
  DIR* proc = opendir("/proc");
  if (!proc) return {};
  while (dirent* entry = readdir(proc)) {
    if (!IsPid(entry->d_name)) continue;
    pid_t pid = static_cast<pid_t>(std::atoi(entry->d_name));
    pid_t parent = ParentOf(pid);
    if (parent >= 0) table.emplace_back(pid, parent);
  }
  closedir(proc);
  const pid_t self = getpid();
  std::vector<pid_t> found;
  auto contains = [&](pid_t pid) {
    return std::find(found.begin(), found.end(), pid) != found.end();
  };
  // Descendants: repeat until no new child appears (the table is not ordered by parent).
  std::vector<pid_t> frontier = {self};
  while (!frontier.empty()) {
    std::vector<pid_t> next;
    for (auto [pid, parent] : table) {
      if (pid == self || contains(pid)) continue;
      if (std::find(frontier.begin(), frontier.end(), parent) != frontier.end()) {
        found.push_back(pid);
        next.push_back(pid);
      }
    }
    frontier = std::move(next);
  }
  if (!marker.empty()) {
    for (auto [pid, parent] : table) {
      if (pid != self && !contains(pid) && EnvironmentHas(pid, marker)) found.push_back(pid);
    }
  }
  return found;
}

}  // namespace crucible
