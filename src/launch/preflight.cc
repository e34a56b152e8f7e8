#include "launch/preflight.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"
#include "launch/attempt_log.h"
#include "launch/hostlist.h"
#include "launch/process.h"
#include "launch/rank_environment.h"
#include "launch/supervisor.h"

namespace crucible {
namespace {
constexpr char kPrefix[] = "crucible-preflight: ";

// "why it failed" -> the one-line reason a report carries.
std::string OneLine(std::string text) {
  text = Trim(text);
  size_t newline = text.rfind('\n');
  if (newline != std::string::npos) text = text.substr(newline + 1);
  return text.size() > 200 ? text.substr(0, 200) : text;
}
}  // namespace

PreflightResult RunPreflight(const LaunchSpec& base, const PreflightOptions& options,
                             const std::string& log_path) {
  LaunchSpec spec = base;
  spec.ranks_per_node = 1;
  spec.ranks = static_cast<int>(spec.nodes.size());
  spec.rank_wrapper = {options.crucible, "launch-rank", "--check", options.run_dir};
  if (!options.check_command.empty())
    spec.rank_wrapper.insert(spec.rank_wrapper.end(), {"--check-command", options.check_command});
  spec.rank_wrapper.push_back("--");
  spec.command = options.command;
  spec.hostfile_path += "-preflight";
  spec.step_name += "-preflight";
  LaunchCommand command = BuildLaunchCommand(spec);
  SupervisorOptions supervisor;
  supervisor.timeout_seconds = options.timeout_seconds;
  supervisor.marker = "CRUCIBLE_LAUNCH_ID=" + spec.env["CRUCIBLE_LAUNCH_ID"];
  supervisor.log_path = log_path;
  supervisor.pass_through = false;
  AttemptLog log(nullptr, spec.nodes);
  AttemptRun run = RunSupervised(command, supervisor, &log);

  std::map<std::string, std::string> reports;  // active node -> "ok" or reason
  std::string text;
  try {
    text = ReadFile(log_path);
  } catch (const Error&) {
  }
  for (const std::string& line : Split(text, '\n')) {
    size_t at = line.find(kPrefix);
    if (at == std::string::npos) continue;
    std::string report = line.substr(at + sizeof(kPrefix) - 1);
    size_t node_at = report.find("node=");
    if (node_at == std::string::npos) continue;
    // The node as the rank named it; else (a local run calls itself by its host name) the
    // active node of its rank, one rank per node in order.
    std::string node = report.substr(node_at + 5, report.find(' ', node_at) - node_at - 5);
    int index = FindHost(spec.nodes, node);
    size_t rank_at = report.find("rank=");
    if (index < 0 && rank_at != std::string::npos) index = std::atoi(report.c_str() + rank_at + 5);
    if (index < 0 || index >= static_cast<int>(spec.nodes.size())) continue;
    node = spec.nodes[index];
    if (StartsWith(report, "ok ")) {
      reports.emplace(node, "ok");
    } else {
      size_t reason = report.find("reason=");
      reports[node] = reason == std::string::npos ? report : report.substr(reason + 7);
    }
  }
  PreflightResult result;
  result.seconds = run.seconds;
  for (const std::string& node : spec.nodes) {
    auto it = reports.find(node);
    if (it == reports.end()) {
      result.failed[node] = run.timed_out
                                ? StrFormat("no report within %.0f s", options.timeout_seconds)
                                : StrFormat("did not report (exit %d): %s", run.exit_code,
                                            log.EvidenceLine().c_str());
    } else if (it->second != "ok") {
      result.failed[node] = it->second;
    }
  }
  return result;
}

int RunNodeCheck(const std::string& run_dir, const std::vector<std::string>& command,
                 const std::string& check_command) {
  char hostname[256] = {0};
  gethostname(hostname, sizeof(hostname) - 1);
  const Environment env = CurrentEnvironment();
  const RankIdentity id = RankIdentityFromEnvironment(env, hostname);
  setenv("CRUCIBLE_NODE", id.node.c_str(), 1);
  auto fail = [&](const std::string& reason) {
    std::printf("%sfailed node=%s rank=%d reason=%s\n", kPrefix, id.node.c_str(), id.rank,
                OneLine(reason).c_str());
    std::fflush(stdout);
    return 1;
  };
  if (command.empty()) return fail("no command to check");
  if (FindExecutable(command[0], env).empty()) return fail("command not found: " + command[0]);
  const std::string folder = JoinPath(run_dir, "launch/preflight");
  const std::string probe = JoinPath(folder, StrFormat("%s-%d", id.node.c_str(), (int)getpid()));
  try {
    MakeDirectories(folder);
    const std::string contents = "crucible preflight " + id.node + "\n";
    AtomicWriteFile(probe, contents);
    if (ReadFile(probe) != contents) return fail("read back a different file from " + probe);
    unlink(probe.c_str());
  } catch (const Error& e) {
    return fail(std::string("run directory not writable: ") + e.what());
  }
  if (!check_command.empty()) {
    CaptureResult check = RunCapture({check_command}, 300.0);
    if (check.exit_code != 0)
      return fail(StrFormat("%s exited %d: %s", check_command.c_str(), check.exit_code,
                            OneLine(check.output).c_str()));
  }
  std::printf("%sok node=%s rank=%d\n", kPrefix, id.node.c_str(), id.rank);
  std::fflush(stdout);
  return 0;
}

}  // namespace crucible
