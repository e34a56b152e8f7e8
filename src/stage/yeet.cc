// crucible yeet: the driver on the launch node (stage/yeet.h).
#include "stage/yeet.h"

#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"
#include "common/timer.h"
#include "launch/attempt_log.h"
#include "launch/command.h"
#include "launch/detect.h"
#include "launch/hostlist.h"
#include "launch/supervisor.h"
#include "stage/archive.h"

namespace crucible {
namespace fs = std::filesystem;
namespace {

using Json = nlohmann::json;

std::string Getenv(const Environment& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() ? "" : it->second;
}

std::string Absolute(const std::string& path) {
  if (!path.empty() && path[0] == '/') return path;
  char cwd[PATH_MAX];
  return getcwd(cwd, sizeof(cwd)) ? JoinPath(cwd, path) : path;
}

std::string SelfExecutable() {
  char path[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  return n > 0 ? std::string(path, n) : "crucible";
}

double WallClock() {
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  return now.tv_sec + now.tv_nsec * 1e-9;
}

void Say(const std::string& message) {
  std::fprintf(stderr, "crucible yeet: %s\n", message.c_str());
  std::fflush(stderr);
}

void Validate(const YeetOptions& o) {
  if (o.sources.empty()) throw UsageError("no sources (usage: crucible yeet SRC... --to DIR)");
  if (o.destination.empty()) throw UsageError("--to DIR is required");
  if (o.destination[0] != '/')
    throw UsageError("--to " + o.destination +
                     ": give an absolute path (a node-local folder such as /tmp/job-%N)");
  if (o.retries < 0 || o.retries > 100)
    throw UsageError(StrFormat("--retries: %d is out of range; give 0 to 100", o.retries));
  if (!std::isfinite(o.backoff_seconds) || o.backoff_seconds < 0 || o.backoff_seconds > 3600)
    throw UsageError(
        StrFormat("--backoff: %g is out of range; give seconds from 0 to 3600", o.backoff_seconds));
  if (!std::isfinite(o.timeout_seconds) || o.timeout_seconds <= 0 || o.timeout_seconds > 1e7)
    throw UsageError(
        StrFormat("--timeout: %g is out of range; give seconds above 0, at most "
                  "10000000",
                  o.timeout_seconds));
  if (o.min_success_fraction && !(*o.min_success_fraction > 0 && *o.min_success_fraction <= 1))
    throw UsageError(
        StrFormat("--min-success-fraction: %g is out of range; give a fraction "
                  "above 0, at most 1",
                  *o.min_success_fraction));
  if (o.min_success_nodes && *o.min_success_nodes < 1)
    throw UsageError(
        StrFormat("--min-success-nodes: %d is out of range; give 1 or more", *o.min_success_nodes));
  if (o.transport != "mpi" && o.transport != "sbcast")
    throw UsageError("--transport " + o.transport + ": give mpi or sbcast");
  if (o.chunk_bytes < 4096 || o.chunk_bytes > (size_t{1} << 30))
    throw UsageError("--chunk-bytes: give 4096 to 1073741824");
}

// Refuses an unsafe archive among the sources before any node is touched (DataError naming
// the member); the nodes check every member again as they unpack.
void CheckArchives(const std::vector<std::string>& sources) {
  for (const std::string& source : sources) {
    struct stat info;
    if (stat(source.c_str(), &info) != 0)
      throw UsageError("cannot stage " + source + ": " + StatFailure(source));
    if (!S_ISDIR(info.st_mode)) {
      if (IsArchive(source)) CheckArchive(source);
      continue;
    }
    std::error_code error;
    for (fs::recursive_directory_iterator
             it(source, fs::directory_options::follow_directory_symlink, error),
         end;
         it != end; it.increment(error))
      if (IsArchive(it->path().string()) && it->is_regular_file())
        CheckArchive(it->path().string());
  }
}

struct Driver {
  explicit Driver(const YeetOptions& given) : options(given) {}
  const YeetOptions& options;
  Allocation allocation;
  MpiFlavour mpi = MpiFlavour::kNone;
  std::string mpi_chosen_by, mpi_launcher, crucible, id, work, status_dir;
  std::vector<std::string> sources;  // absolute
  int jobs = 0;
  std::vector<Json> stats;

  LaunchSpec Spec(const std::vector<std::string>& nodes, int attempt) {
    ++jobs;
    LaunchSpec spec;
    spec.scheduler = allocation.scheduler;
    spec.mpi = mpi;
    spec.nodes = nodes;
    spec.ranks_per_node = 1;
    spec.ranks = static_cast<int>(nodes.size());
    spec.as_root = geteuid() == 0;
    spec.hostfile_path = JoinPath(work, StrFormat("hostfile-%d", jobs));
    spec.step_name = "crucible-yeet-" + id;
    spec.mpi_launcher = mpi_launcher;
    spec.mpi_chosen_by = mpi_chosen_by;
    spec.env = {{"CRUCIBLE_NODELIST", JoinHosts(nodes)},
                {"CRUCIBLE_LAUNCH_ID", StrFormat("%s-%d", id.c_str(), jobs)}};
    const std::string fail = Getenv(CurrentEnvironment(), "CRUCIBLE_YEET_FAIL");
    if (!fail.empty()) spec.env["CRUCIBLE_YEET_FAIL"] = fail;
    const std::string fast_wrapper = JoinPath(ParentDirectory(crucible), "crucible-rank");
    spec.rank_wrapper = access(fast_wrapper.c_str(), X_OK) == 0
                            ? std::vector<std::string>{fast_wrapper, "--"}
                            : std::vector<std::string>{crucible, "launch-rank", "--"};
    spec.command = {crucible,
                    "yeet-rank",
                    "--to",
                    options.destination,
                    "--status-dir",
                    status_dir,
                    "--id",
                    StrFormat("%s-%d", id.c_str(), jobs),
                    "--attempt",
                    std::to_string(attempt),
                    "--stats",
                    JoinPath(work, StrFormat("stats-%d.json", jobs)),
                    "--chunk-bytes",
                    std::to_string(options.chunk_bytes),
                    "--timeout",
                    StrFormat("%g", options.timeout_seconds),
                    "--transport",
                    options.transport,
                    "--cache-dir",
                    JoinPath(Absolute(options.work_dir), "cache"),
                    "--started-at",
                    StrFormat("%.6f", WallClock()),
                    "--"};
    spec.command.insert(spec.command.end(), sources.begin(), sources.end());
    return spec;
  }

  // Runs one job over `nodes`; returns its exit code. Rank 0's stats are kept.
  int Run(const std::vector<std::string>& nodes, int attempt) {
    for (const std::string& node : nodes) unlink(JoinPath(status_dir, node).c_str());
    LaunchSpec spec = Spec(nodes, attempt);
    const std::string stats_path = JoinPath(work, StrFormat("stats-%d.json", jobs));
    LaunchCommand command = BuildLaunchCommand(spec);
    SupervisorOptions supervisor;
    supervisor.timeout_seconds = options.timeout_seconds;
    supervisor.marker = "CRUCIBLE_LAUNCH_ID=" + spec.env["CRUCIBLE_LAUNCH_ID"];
    supervisor.log_path = JoinPath(work, StrFormat("job-%d.log", jobs));
    AttemptLog log(nullptr, nodes);
    const AttemptRun run = RunSupervised(command, supervisor, &log);
    if (FileExists(stats_path)) {
      try {
        stats.push_back(Json::parse(ReadFile(stats_path)));
      } catch (const std::exception&) {
      }
    }
    return run.exit_code;
  }

  // "done" or the reason the node did not finish.
  std::string Status(const std::string& node) {
    const std::string path = JoinPath(status_dir, node);
    if (!FileExists(path)) return "no status (its rank did not finish)";
    const std::string text = Trim(ReadFile(path));
    if (StartsWith(text, "done ")) return "done";
    const std::string prefix = "failed " + node + " ";
    return StartsWith(text, prefix) ? text.substr(prefix.size()) : text;
  }
};

void PrintTable(const Json& phases, double seconds) {
  std::string table = "crucible yeet: phases\n";
  table += StrFormat("  %-10s %10s %14s %10s\n", "phase", "seconds", "bytes", "MB/s");
  for (const Json& p : phases) {
    const double s = p["seconds"].get<double>();
    const double b = p["bytes"].get<double>();
    table += StrFormat("  %-10s %10.3f %14.0f %10.1f\n", p["name"].get<std::string>().c_str(), s, b,
                       s > 0 ? b / 1e6 / s : 0.0);
  }
  table += StrFormat("  %-10s %10.3f\n", "total", seconds);
  std::fputs(table.c_str(), stderr);
  std::fflush(stderr);
}

}  // namespace

YeetResult RunYeet(const YeetOptions& options, const Environment& env) {
  Validate(options);
  Timer timer;
  Driver d(options);
  for (const std::string& source : options.sources) d.sources.push_back(Absolute(source));
  CheckArchives(d.sources);
  d.allocation = DetectAllocation(env, options.hostfile);
  if (options.transport == "sbcast" && d.allocation.scheduler != Scheduler::kSlurm)
    throw UsageError(
        "--transport sbcast needs a Slurm allocation (run inside salloc or sbatch); use "
        "--transport mpi elsewhere");
  std::vector<std::string> nodes =
      options.nodes.empty() ? d.allocation.nodes : ExpandHostList(options.nodes);
  std::vector<std::string> excluded;
  for (const std::string& file : options.exclude_files)
    for (const std::string& host : ReadExcludeFile(file)) excluded.push_back(host);
  std::vector<std::string> kept;
  for (const std::string& node : nodes)
    if (FindHost(excluded, node) < 0) kept.push_back(node);
  nodes = kept;
  if (nodes.empty()) throw UsageError("no nodes to stage on (all excluded, or none allocated)");
  const int total = static_cast<int>(nodes.size());
  const int floor =
      options.min_success_nodes
          ? *options.min_success_nodes
          : static_cast<int>(std::ceil(options.min_success_fraction.value_or(1.0) * total - 1e-9));
  if (options.min_success_nodes && *options.min_success_nodes > total)
    throw UsageError(StrFormat("--min-success-nodes %d: only %d node(s) to stage on",
                               *options.min_success_nodes, total));
  const int fraction_floor =
      static_cast<int>(std::ceil(options.min_success_fraction.value_or(0) * total - 1e-9));
  const int needed = std::max(floor, fraction_floor);

  std::string mpi = options.mpi;
  if (mpi != "auto") d.mpi_chosen_by = "--mpi " + mpi;
  if (mpi == "auto" && !Getenv(env, "CRUCIBLE_MPI").empty()) {
    mpi = Getenv(env, "CRUCIBLE_MPI");
    d.mpi_chosen_by = "CRUCIBLE_MPI=" + mpi;
  }
  d.mpi = mpi == "auto" ? DetectMpiFlavour(env) : ParseMpiFlavour(mpi);
  if (d.allocation.scheduler == Scheduler::kLocal) d.mpi_launcher = LocalMpiLauncher(d.mpi, env);
  if (d.mpi == MpiFlavour::kNone && total > 1)
    throw UsageError(StrFormat(
        "staging on %d nodes needs MPI (%s); pass --mpi openmpi or mpich, or set CRUCIBLE_MPI",
        total, d.mpi_chosen_by.empty() ? "none found on PATH" : d.mpi_chosen_by.c_str()));
  d.crucible = options.crucible_path.empty() ? SelfExecutable() : options.crucible_path;
  std::random_device random;
  d.id = StrFormat("%d-%08x", static_cast<int>(getpid()), random());
  d.work = JoinPath(Absolute(options.work_dir), d.id);
  d.status_dir = JoinPath(d.work, "status");
  MakeDirectories(d.status_dir);
  BuildLaunchCommand(d.Spec(nodes, 1));  // validate before any effect
  d.jobs = 0;
  InstallLaunchSignalHandlers();

  Say(StrFormat("staging %zu source(s) to %s on %d node(s) (%s); records in %s", d.sources.size(),
                options.destination.c_str(), total, JoinHosts(nodes).c_str(), d.work.c_str()));
  std::map<std::string, std::string> status;  // node -> "done" or reason
  auto count_done = [&]() {
    int done = 0;
    for (const auto& [node, state] : status) done += state == "done";
    return done;
  };
  Timer broadcast_timer;
  const int exit_code = d.Run(nodes, 1);
  for (const std::string& node : nodes) status[node] = d.Status(node);
  Say(StrFormat("phase=job seconds=%.3f exit=%d nodes_done=%d/%d", broadcast_timer.Seconds(),
                exit_code, count_done(), total));

  Timer retry_timer;
  bool retried = false;
  for (int retry = 1; retry <= options.retries && count_done() < total; ++retry) {
    const double pause = std::min(60.0, options.backoff_seconds * std::pow(2.0, retry - 1));
    if (pause > 0) Say(StrFormat("retry %d in %.1f s", retry, pause));
    if (!SleepUnlessSignalled(pause)) break;
    retried = true;
    for (const std::string& node : nodes) {
      if (status[node] == "done") continue;
      Say("node " + node + " did not finish (" + status[node] + "); retrying it alone");
      Timer one;
      const int code = d.Run({node}, retry + 1);
      status[node] = d.Status(node);
      Say(StrFormat("phase=retry node=%s try=%d exit=%d result=%s seconds=%.3f nodes_done=%d/%d",
                    node.c_str(), retry + 1, code, status[node] == "done" ? "ok" : "failed",
                    one.Seconds(), count_done(), total));
    }
  }

  YeetResult result;
  for (const std::string& node : nodes)
    (status[node] == "done" ? result.nodes_ok : result.nodes_failed).push_back(node);
  result.failed_hosts_path = options.failed_hosts.empty()
                                 ? JoinPath(Absolute(options.work_dir), "failed_hosts.txt")
                                 : options.failed_hosts;
  std::string failed_text;
  for (const std::string& node : result.nodes_failed) failed_text += node + "\n";
  MakeDirectories(ParentDirectory(Absolute(result.failed_hosts_path)));
  AtomicWriteFile(result.failed_hosts_path, failed_text);
  for (const std::string& node : result.nodes_failed)
    Say("node " + node + " failed: " + status[node]);

  // Phases: rank 0's of every job, summed by name, then the retries' wall time.
  Json phases = Json::array();
  std::map<std::string, size_t> position;
  uint64_t bytes_read = 0, bytes_sent = 0, files_sent = 0;
  for (const Json& s : d.stats) {
    bytes_read += s.value("bytes_read", uint64_t{0});
    bytes_sent += s.value("bytes_sent", uint64_t{0});
    files_sent += s.value("files_sent", uint64_t{0});
    for (const Json& p : s["phases"]) {
      const std::string name = p["name"];
      if (!position.count(name)) {
        position[name] = phases.size();
        phases.push_back({{"name", name}, {"seconds", 0.0}, {"bytes", uint64_t{0}}});
      }
      Json& sum = phases[position[name]];
      sum["seconds"] = sum["seconds"].get<double>() + p["seconds"].get<double>();
      sum["bytes"] = sum["bytes"].get<uint64_t>() + p["bytes"].get<uint64_t>();
    }
  }
  if (retried)
    phases.push_back({{"name", "retry"}, {"seconds", retry_timer.Seconds()}, {"bytes", 0}});
  const double seconds = timer.Seconds();
  PrintTable(phases, seconds);
  const bool met = static_cast<int>(result.nodes_ok.size()) >= needed;
  Say(StrFormat("%zu/%d node(s) staged, %d needed: %s; failed hosts (%zu) in %s",
                result.nodes_ok.size(), total, needed, met ? "ok" : "below the floor",
                result.nodes_failed.size(), result.failed_hosts_path.c_str()));
  if (!options.summary.empty()) {
    Json summary = {{"transport", options.transport},
                    {"bytes_read", bytes_read},
                    {"bytes_sent", bytes_sent},
                    {"files_sent", files_sent},
                    {"nodes_ok", result.nodes_ok},
                    {"nodes_failed", result.nodes_failed},
                    {"phases", phases},
                    {"seconds", seconds},
                    {"destination", options.destination},
                    {"failed_hosts", result.failed_hosts_path},
                    {"work_dir", d.work}};
    AtomicWriteFile(options.summary, summary.dump(2) + "\n");
  }
  result.exit_code = met ? kExitOk : kExitYeetFloor;
  return result;
}

}  // namespace crucible
