#include "launch/launcher.h"

#include <limits.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "common/error.h"
#include "common/files.h"
#include "common/log.h"
#include "common/strings.h"
#include "distributed/mesh.h"
#include "launch/attempt_log.h"
#include "launch/bad_node_patterns.h"
#include "launch/classifier.h"
#include "launch/command.h"
#include "launch/hostlist.h"
#include "launch/node_pool.h"
#include "launch/preflight.h"
#include "launch/process.h"
#include "launch/stop.h"
#include "launch/supervisor.h"

namespace crucible {
namespace {

using Json = nlohmann::json;

std::string Getenv(const Environment& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() ? "" : it->second;
}

std::string SelfExecutable() {
  char path[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  return n > 0 ? std::string(path, n) : "crucible";
}

std::string AbsolutePath(const std::string& path) {
  if (!path.empty() && path[0] == '/') return path;
  char cwd[PATH_MAX];
  return getcwd(cwd, sizeof(cwd)) ? JoinPath(cwd, path) : path;
}

std::string NowIso() {
  std::time_t now = std::time(nullptr);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%S", std::localtime(&now));
  return text;
}

void Say(const std::string& message) {
  std::fprintf(stderr, "crucible launch: %s\n", message.c_str());
  std::fflush(stderr);
}

void AppendLine(const std::string& path, const std::string& line) {
  std::FILE* file = std::fopen(path.c_str(), "a");
  if (!file) ThrowErrno("cannot open " + path);
  std::fputs((line + "\n").c_str(), file);
  if (std::fclose(file) != 0) ThrowErrno("cannot write " + path);
}

int CountAttempts(const std::string& attempts_path) {
  if (!FileExists(attempts_path)) return 0;
  int count = 0;
  for (const std::string& line : Split(ReadFile(attempts_path), '\n'))
    if (line.find("\"kind\":\"attempt\"") != std::string::npos) ++count;
  return count;
}

int CeilDiv(int a, int b) {
  return (a + b - 1) / b;
}

// Everything fixed for the whole launch.
struct Plan {
  Allocation allocation;
  MpiFlavour mpi = MpiFlavour::kNone;
  std::string mpi_chosen_by;  // "--mpi none", "CRUCIBLE_MPI=mpich"; empty when detected
  std::string mpi_launcher;   // local jobs: mpirun, mpiexec, mpiexec.mpich, ...
  Accelerator accelerator;
  BadNodePatterns patterns;
  int active_nodes = 1;
  int ranks_per_node = 1;
  int ranks = 1;
  int retries = 0;
  std::string launch_id;
  std::string crucible;
  std::string run_dir;
  std::string launch_dir;
};

Plan MakePlan(const LaunchOptions& options, const Environment& env) {
  ValidateLaunchOptions(options);
  Plan plan;
  plan.allocation = DetectAllocation(env, options.hostfile);
  std::vector<std::string> excluded = options.exclude_nodes;
  for (const std::string& file : options.exclude_files)
    for (const std::string& host : ReadExcludeFile(file)) excluded.push_back(host);
  if (!excluded.empty()) {
    std::vector<std::string> kept;
    for (const std::string& node : plan.allocation.nodes)
      if (FindHost(excluded, node) < 0) kept.push_back(node);
    if (kept.empty())
      throw UsageError("every node of the allocation (" + plan.allocation.source +
                       ") is excluded: " + JoinHosts(excluded));
    plan.allocation.source += ", less excluded " + JoinHosts(excluded);
    plan.allocation.nodes = kept;
  }
  plan.patterns = BadNodePatterns::Defaults();
  for (const std::string& file : Split(Getenv(env, "CRUCIBLE_BAD_NODE_PATTERNS"), ':'))
    if (!file.empty()) plan.patterns.AddFile(file);
  for (const std::string& file : options.pattern_files) plan.patterns.AddFile(file);
  std::string mpi = options.mpi;
  if (mpi != "auto") plan.mpi_chosen_by = "--mpi " + mpi;
  if (mpi == "auto" && !Getenv(env, "CRUCIBLE_MPI").empty()) {
    mpi = Getenv(env, "CRUCIBLE_MPI");
    plan.mpi_chosen_by = "CRUCIBLE_MPI=" + mpi;
  }
  plan.mpi = mpi == "auto" ? DetectMpiFlavour(env) : ParseMpiFlavour(mpi);
  if (plan.allocation.scheduler == Scheduler::kLocal)
    plan.mpi_launcher = LocalMpiLauncher(plan.mpi, env);
  plan.accelerator = DetectAccelerator();

  const int allocated = static_cast<int>(plan.allocation.nodes.size());
  const int spares = options.spares.value_or(0);
  if (options.nodes) {
    plan.active_nodes = *options.nodes;
  } else if (options.np && options.ppn) {
    plan.active_nodes = CeilDiv(*options.np, *options.ppn);
  } else {
    plan.active_nodes = std::max(1, allocated - spares);
    if (options.np) plan.active_nodes = std::min(plan.active_nodes, *options.np);
  }
  if (plan.active_nodes > allocated)
    throw UsageError(StrFormat("%d node(s) needed, but the allocation (%s) has only %d",
                               plan.active_nodes, plan.allocation.source.c_str(), allocated));
  if (options.ppn) {
    plan.ranks_per_node = *options.ppn;
  } else if (options.np) {
    plan.ranks_per_node = CeilDiv(*options.np, plan.active_nodes);
  } else if (plan.allocation.slots_per_node > 0) {
    plan.ranks_per_node = plan.allocation.slots_per_node;
  } else {
    plan.ranks_per_node = std::max(1, plan.accelerator.count);
  }
  plan.ranks = options.np.value_or(plan.active_nodes * plan.ranks_per_node);
  if (plan.ranks > plan.active_nodes * plan.ranks_per_node)
    throw UsageError(StrFormat("--np %d does not fit on %d node(s) x %d rank(s) per node",
                               plan.ranks, plan.active_nodes, plan.ranks_per_node));
  const int most = plan.allocation.max_ranks_per_node;
  if (most > 0 && plan.ranks_per_node > most && !options.oversubscribe) {
    const std::string asked = options.ppn  ? StrFormat("--ppn %d", *options.ppn)
                              : options.np ? StrFormat("--np %d", *options.np)
                                           : StrFormat("%d ranks", plan.ranks);
    throw UsageError(StrFormat(
        "%s puts %d rank(s) on each of %d node(s), more than the %d a node runs without "
        "oversubscribing (%s): ask for at most %d rank(s) in all, or pass --oversubscribe",
        asked.c_str(), plan.ranks_per_node, plan.active_nodes, most,
        plan.allocation.max_ranks_source.c_str(), most * plan.active_nodes));
  }
  plan.retries = options.retries.value_or(options.auto_retry ? 10 : 0);
  std::random_device random;
  plan.launch_id = StrFormat("%d-%08x", static_cast<int>(getpid()), random());
  plan.crucible = options.crucible_path.empty() ? SelfExecutable() : options.crucible_path;
  plan.run_dir = AbsolutePath(options.run_dir);
  plan.launch_dir = JoinPath(plan.run_dir, "launch");
  return plan;
}

LaunchSpec MakeSpec(const Plan& plan, const LaunchOptions& options,
                    const std::vector<std::string>& nodes, int attempt) {
  LaunchSpec spec;
  spec.scheduler = plan.allocation.scheduler;
  spec.mpi = plan.mpi;
  spec.nodes = nodes;
  spec.ranks_per_node = plan.ranks_per_node;
  spec.ranks = plan.ranks;
  spec.cpus_per_node = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  spec.as_root = geteuid() == 0;
  spec.hostfile_path = JoinPath(plan.launch_dir, StrFormat("hostfile-%d", attempt));
  spec.step_name = "crucible-" + plan.launch_id;
  spec.mpi_launcher = plan.mpi_launcher;
  spec.mpi_chosen_by = plan.mpi_chosen_by;
  spec.oversubscribe = options.oversubscribe;
  spec.env = {{"CRUCIBLE_RUN_DIR", plan.run_dir},
              {"CRUCIBLE_ATTEMPT", std::to_string(attempt)},
              {"CRUCIBLE_NODELIST", JoinHosts(nodes)},
              {"CRUCIBLE_ACCELERATOR", AcceleratorName(plan.accelerator.kind)},
              {"CRUCIBLE_LAUNCH_ID", plan.launch_id}};
  if (options.expand_node_name) spec.env["CRUCIBLE_EXPAND_NODE_NAME"] = "1";
  if (!options.node_local_pattern.empty())
    spec.env["CRUCIBLE_NODE_LOCAL"] = options.node_local_pattern;
  // The small wrapper binary beside crucible when it is there (faster start), else the same
  // code inside crucible.
  const std::string fast_wrapper = JoinPath(ParentDirectory(plan.crucible), "crucible-rank");
  spec.rank_wrapper = access(fast_wrapper.c_str(), X_OK) == 0
                          ? std::vector<std::string>{fast_wrapper, "--"}
                          : std::vector<std::string>{plan.crucible, "launch-rank", "--"};
  spec.command = options.command;
  return spec;
}

// Under Slurm, a killed srun can leave its step behind on remote nodes: cancel it by name.
void CancelSlurmStep(const Plan& plan) {
  if (plan.allocation.scheduler != Scheduler::kSlurm || plan.allocation.job_id.empty()) return;
  CaptureResult steps =
      RunCapture({"squeue", "-h", "-s", "-j", plan.allocation.job_id, "-o", "%i %j"}, 5.0);
  for (const std::string& line : Split(steps.output, '\n')) {
    std::vector<std::string> fields = Split(Trim(line), ' ');
    if (fields.size() == 2 && fields[1] == "crucible-" + plan.launch_id)
      RunCapture({"scancel", "--signal=KILL", fields[0]}, 5.0);
  }
}

struct AttemptRecord {
  int attempt = 0;
  std::vector<std::string> nodes;
  AttemptRun run;
  int exit_code = 0;  // what the attempt counts as: run.exit_code, or 143/75 for a stop
  std::optional<int64_t> first_step, last_step;
  Classification classification;
  std::string action;  // done, stop, retry, swap, resubmit
  std::string detail;  // "n2 -> n4", the reason to stop, the new job id
};

// --resubmit: queue the follow-on job behind this one. Returns its id, or "" (with `why`).
std::string Resubmit(const Plan& plan, const LaunchOptions& options, const Environment& env,
                     std::string* why) {
  const Allocation& allocation = plan.allocation;
  if (allocation.scheduler == Scheduler::kLocal || allocation.job_id.empty()) {
    *why = "not in a batch job: nothing to resubmit to";
    return "";
  }
  std::string chain = Getenv(env, "CRUCIBLE_JOB_CHAIN");
  chain += (chain.empty() ? "" : ":") + allocation.job_id;
  setenv("CRUCIBLE_JOB_CHAIN", chain.c_str(), 1);
  std::string script = options.resubmit_script;
  if (script.empty()) script = QueryBatchScript(allocation);
  if (script.empty()) {
    *why = "cannot tell the job's batch script; pass --resubmit-script";
    return "";
  }
  std::vector<std::string> argv;
  if (allocation.scheduler == Scheduler::kSlurm) {
    argv = {"sbatch", "--dependency=afterany:" + allocation.job_id, script};
  } else {
    argv = {"qsub", "-W", "depend=afterany:" + allocation.job_id, "-v", "CRUCIBLE_JOB_CHAIN",
            script};
  }
  CaptureResult result = RunCapture(argv, 60.0);
  const std::string output = Trim(result.output);
  if (result.exit_code != 0) {
    *why = ShellQuote(argv) + " failed: " + output;
    return "";
  }
  const std::string prefix = "Submitted batch job ";
  size_t at = output.rfind(prefix);
  std::string id = at == std::string::npos ? output : Trim(output.substr(at + prefix.size()));
  *why = ShellQuote(argv);
  return id;
}

void PrintSummary(const std::vector<AttemptRecord>& records, const NodePool& pool) {
  std::string table = "crucible launch: summary\n";
  table += StrFormat("  %-7s %-5s %-11s %-24s %-12s %-18s %s\n", "attempt", "exit", "steps",
                     "nodes", "verdict", "action", "evidence");
  for (const AttemptRecord& r : records) {
    std::string steps =
        r.first_step ? StrFormat("%lld-%lld", (long long)*r.first_step, (long long)*r.last_step)
                     : "-";
    std::string nodes = JoinHosts(r.nodes);
    if (nodes.size() > 24) nodes = nodes.substr(0, 21) + "...";
    std::string action = r.action + (r.detail.empty() ? "" : " " + r.detail);
    std::string evidence = r.classification.evidence;
    if (evidence.size() > 100) evidence = evidence.substr(0, 97) + "...";
    table += StrFormat("  %-7d %-5d %-11s %-24s %-12s %-18s %s\n", r.attempt, r.exit_code,
                       steps.c_str(), nodes.c_str(), VerdictName(r.classification.verdict),
                       action.c_str(), evidence.c_str());
  }
  for (const EvictedNode& e : pool.evicted())
    table += StrFormat("  bad node %s (%s, attempt %d)\n", e.node.c_str(),
                       e.named ? "named" : "blind", e.attempt);
  std::fputs(table.c_str(), stderr);
  std::fflush(stderr);
}

void PrintDryRun(const Plan& plan, const NodePool& pool, const LaunchCommand& command) {
  std::printf("scheduler:   %s%s\n", SchedulerName(plan.allocation.scheduler),
              plan.allocation.job_id.empty() ? "" : (" job " + plan.allocation.job_id).c_str());
  std::printf("allocation:  %s (%s)\n", JoinHosts(plan.allocation.nodes).c_str(),
              plan.allocation.source.c_str());
  std::printf("active:      %s\n", JoinHosts(pool.active()).c_str());
  std::printf("spares:      %s\n", JoinHosts(pool.spares()).c_str());
  std::printf("accelerator: %s x%d\n", AcceleratorName(plan.accelerator.kind),
              plan.accelerator.count);
  std::printf("mpi:         %s\n", MpiFlavourName(plan.mpi));
  std::printf("ranks:       %d (%d per node)\n", plan.ranks, plan.ranks_per_node);
  if (!command.hostfile_path.empty())
    std::printf("hostfile:    %s\n%s", command.hostfile_path.c_str(),
                command.hostfile_contents.c_str());
  std::printf("environment:\n");
  for (const auto& [key, value] : command.env)
    std::printf("  %s=%s\n", key.c_str(), ShellQuote({value}).c_str());
  std::printf("command:\n  %s\n", ShellQuote(command.argv).c_str());
}

}  // namespace

int TensorParallelDegree(const LaunchOptions& options, std::vector<std::string>* command) {
  *command = options.command;
  constexpr char kKey[] = "parallelism.tensor_parallel_degree=";
  std::optional<int> in_command;
  for (size_t i = 0; i < command->size(); ++i) {
    std::string item = (*command)[i];
    if (item == "--set" && i + 1 < command->size())
      item = (*command)[i + 1];
    else if (StartsWith(item, "--set="))
      item = item.substr(6);
    else
      continue;
    if (!StartsWith(item, kKey)) continue;
    const std::string value = item.substr(sizeof(kKey) - 1);
    char* end = nullptr;
    const long degree = std::strtol(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || degree < 1)
      throw UsageError("the command's --set " + item + ": expected a positive integer");
    in_command = static_cast<int>(degree);
  }
  if (!options.tensor_parallel) return in_command.value_or(1);
  if (in_command && *in_command != *options.tensor_parallel)
    throw UsageError(StrFormat("--tp %d, but the command sets %s%d; give one of them",
                               *options.tensor_parallel, kKey, *in_command));
  if (!in_command) {
    command->push_back("--set");
    command->push_back(kKey + std::to_string(*options.tensor_parallel));
  }
  return *options.tensor_parallel;
}

std::vector<std::string> DescribeTensorParallelGroups(int ranks, int ranks_per_node, int tp,
                                                      const std::vector<std::string>& nodes,
                                                      std::vector<std::string>* warnings) {
  std::vector<std::string> node_of_rank(static_cast<size_t>(std::max(0, ranks)));
  for (int rank = 0; rank < ranks; ++rank) {
    const size_t n = static_cast<size_t>(rank / std::max(1, ranks_per_node));
    node_of_rank[static_cast<size_t>(rank)] =
        n < nodes.size() ? nodes[n] : StrFormat("node %zu", n);
  }
  std::vector<std::string> lines;
  int index = 0;
  for (const ConsecutiveGroup& group : ConsecutiveGroups(node_of_rank, tp)) {
    const std::string hosts = JoinHosts(group.hosts);
    lines.push_back(
        StrFormat("  group %d: ranks %d-%d on %s", index, group.first, group.last, hosts.c_str()));
    if (group.hosts.size() > 1 && warnings)
      warnings->push_back(StrFormat(
          "tensor-parallel group %d (ranks %d-%d) spans %zu nodes (%s): its collectives run in "
          "every layer, on the critical path, over the network; keep each group on one node "
          "(ranks per node a multiple of --tp %d)",
          index, group.first, group.last, group.hosts.size(), hosts.c_str(), tp));
    ++index;
  }
  return lines;
}

void ValidateLaunchOptions(const LaunchOptions& options) {
  if (options.command.empty())
    throw UsageError("no command after '--' (usage: crucible launch [options] -- COMMAND...)");
  // The longest wait any option may ask for: 10^7 s (116 days).
  constexpr double kMaxSeconds = 1e7;
  constexpr int kMaxCount = 1000000;
  auto seconds = [&](const char* option, double value, bool zero_allowed) {
    const char* range =
        zero_allowed ? "give seconds from 0 to 10000000" : "give seconds above 0, at most 10000000";
    if (!std::isfinite(value))
      throw UsageError(StrFormat("%s: %g is not a finite number; %s", option, value, range));
    if (value < 0 || (value == 0 && !zero_allowed) || value > kMaxSeconds)
      throw UsageError(StrFormat("%s: %g is out of range; %s", option, value, range));
  };
  auto count = [&](const char* option, const std::optional<int>& value, int least) {
    if (value && (*value < least || *value > kMaxCount))
      throw UsageError(
          StrFormat("%s: %d is out of range; give %d to %d", option, *value, least, kMaxCount));
  };
  count("--np", options.np, 1);
  count("--ppn", options.ppn, 1);
  count("--nodes", options.nodes, 1);
  count("--retries", options.retries, 0);
  count("--spares", options.spares, 0);
  if (options.timeout_seconds) seconds("--timeout", *options.timeout_seconds, false);
  seconds("--kill-grace", options.kill_grace_seconds, true);
  seconds("--backoff-base", options.backoff_base_seconds, true);
  seconds("--backoff-cap", options.backoff_cap_seconds, true);
  seconds("--walltime-margin", options.walltime_margin_seconds, true);
  seconds("--preflight-timeout", options.preflight_timeout_seconds, false);
  if (options.spares && !options.auto_retry) throw UsageError("--spares needs --auto-retry");
}

double BackoffSeconds(int retry, double base, double cap) {
  return std::min(cap, base * std::pow(2.0, std::max(0, retry - 1)));
}

int RunLaunch(const LaunchOptions& given, const Environment& env) {
  // The tensor-parallel degree passed on to the command, its groups checked against the layout.
  LaunchOptions options = given;
  const int tp = TensorParallelDegree(given, &options.command);
  Plan plan = MakePlan(options, env);
  if (plan.ranks % tp != 0)
    throw UsageError(StrFormat(
        "--tp %d does not divide the %d ranks (the data-parallel degree is the ranks / it)", tp,
        plan.ranks));
  NodePool pool(plan.allocation.nodes, plan.active_nodes,
                options.auto_retry ? options.spares.value_or(-1) : 0);
  std::vector<std::string> tp_warnings;
  const std::vector<std::string> tp_groups =
      tp > 1 ? DescribeTensorParallelGroups(plan.ranks, plan.ranks_per_node, tp, pool.active(),
                                            &tp_warnings)
             : std::vector<std::string>{};
  for (const std::string& warning : tp_warnings) LogWarn(warning);
  if (options.dry_run) {
    PrintDryRun(plan, pool, BuildLaunchCommand(MakeSpec(plan, options, pool.active(), 1)));
    if (tp > 1) {
      std::printf("tensor parallel: degree %d, %d group(s), data-parallel degree %d\n", tp,
                  plan.ranks / tp, plan.ranks / tp);
      for (const std::string& line : tp_groups) std::printf("%s\n", line.c_str());
    }
    return kExitOk;
  }
  BuildLaunchCommand(MakeSpec(plan, options, pool.active(), 1));  // validate before any effect
  InstallLaunchSignalHandlers();
  MakeDirectories(plan.launch_dir);
  const std::string attempts_path = JoinPath(plan.launch_dir, "attempts.jsonl");
  const std::string bad_nodes_path = JoinPath(plan.launch_dir, "bad_nodes.txt");
  auto record_eviction = [&](const EvictedNode& e, const std::string& spare) {
    AppendLine(bad_nodes_path, StrFormat("%s\t%s\tattempt=%d\tverdict=%s\treplaced_by=%s\t%s",
                                         e.node.c_str(), e.named ? "named" : "blind", e.attempt,
                                         e.verdict.c_str(), spare.c_str(), e.evidence.c_str()));
  };

  PreflightOptions preflight_options{plan.crucible, plan.run_dir, options.command,
                                     options.preflight_timeout_seconds, options.preflight_command};
  // Preflight the active nodes; swap out every node that fails. False: not enough healthy nodes.
  auto preflight = [&](int attempt) -> bool {
    if (!options.preflight) return true;
    while (true) {
      LaunchSpec spec = MakeSpec(plan, options, pool.active(), attempt);
      PreflightResult result =
          RunPreflight(spec, preflight_options,
                       JoinPath(plan.launch_dir, StrFormat("preflight-%d.log", attempt)));
      Json line = {{"kind", "preflight"},       {"attempt", attempt},
                   {"time", NowIso()},          {"nodes", pool.active()},
                   {"seconds", result.seconds}, {"failed", Json::object()}};
      // A stop signal ended the health check: its failures are the stop's, not the nodes'.
      const int stopped_by = PendingLaunchSignal();
      if (stopped_by != 0) line["signal"] = stopped_by;
      for (const auto& [node, reason] : result.failed)
        if (stopped_by == 0) line["failed"][node] = reason;
      AppendLine(attempts_path, line.dump());
      if (stopped_by != 0) return false;
      if (result.failed.empty()) return true;
      for (const auto& [node, reason] : result.failed) {
        EvictedNode e{node, true, attempt, "preflight", reason};
        std::string spare = pool.Swap(e);
        if (spare.empty()) {
          Say("preflight: node " + node + " failed (" + reason + ") and no spare is left");
          return false;
        }
        Say("preflight: node " + node + " failed (" + reason + "); swapped for " + spare);
        record_eviction(e, spare);
      }
    }
  };

  std::vector<AttemptRecord> records;
  int exit_code = kExitFailure;
  bool previous_reached_step = true;
  // A resubmitted job continues the numbering of the run's earlier attempts.
  const int first_attempt = 1 + CountAttempts(attempts_path);
  // A stop signal before an attempt starts: nothing ran, so no checkpoint of it exists (75).
  auto stopped_before = [&](int attempt) {
    if (PendingLaunchSignal() == 0) return false;
    Say(StrFormat("stopped by signal %d before attempt %d (exit 75)", PendingLaunchSignal(),
                  attempt));
    return true;
  };
  if (!preflight(first_attempt)) {
    PrintSummary(records, pool);
    return stopped_before(first_attempt) ? kExitStoppedNoCheckpoint : kExitFailure;
  }
  for (int attempt = first_attempt;; ++attempt) {
    const int retry = attempt - first_attempt + 1;  // this launch's own count
    if (stopped_before(attempt)) {
      if (records.empty()) exit_code = kExitStoppedNoCheckpoint;
      break;
    }
    pool.NewAttempt();
    LaunchSpec spec = MakeSpec(plan, options, pool.active(), attempt);
    LaunchCommand command = BuildLaunchCommand(spec);
    AttemptLog log(&plan.patterns, pool.active());
    SupervisorOptions supervisor;
    supervisor.timeout_seconds = options.timeout_seconds.value_or(0);
    supervisor.kill_grace_seconds = options.kill_grace_seconds;
    supervisor.marker = "CRUCIBLE_LAUNCH_ID=" + plan.launch_id;
    supervisor.log_path = JoinPath(plan.launch_dir, StrFormat("attempt-%d.log", attempt));
    supervisor.before_kill = [&plan]() { CancelSlurmStep(plan); };
    const std::string started = NowIso();
    AttemptRecord record;
    record.attempt = attempt;
    record.nodes = pool.active();
    record.run = RunSupervised(command, supervisor, &log);
    record.first_step = log.first_step();
    record.last_step = log.last_step();
    // A stop: 143 only for a complete checkpoint of the step the trainer names, else 75.
    const StopJudgement stop = JudgeStop(log, {record.run.exit_code, record.run.stop_requested,
                                               record.run.timed_out, record.run.stop_end});
    exit_code = stop.applies ? stop.exit_code : record.run.exit_code;
    record.exit_code = exit_code;
    if (stop.applies && stop.exit_code == kExitStoppedNoCheckpoint)
      Say("stopped without a complete checkpoint (exit 75): " + stop.problem);

    AttemptFacts facts;
    facts.exit_code = exit_code;
    facts.timed_out = record.run.timed_out;
    facts.log = &log;
    facts.previous_reached_step = previous_reached_step;
    facts.walltime_margin_seconds = options.walltime_margin_seconds;
    facts.stop_signal = record.run.signal_received;
    if (exit_code == kExitSignalled || exit_code == kExitStoppedNoCheckpoint || exit_code == 271)
      facts.time_left_seconds = QueryTimeLeft(plan.allocation);
    if (exit_code != 0 && options.auto_retry)
      facts.node_states = QueryNodeStates(plan.allocation, pool.active());
    record.classification = ClassifyAttempt(facts);
    const Classification& c = record.classification;
    previous_reached_step = log.reached_step();

    // What to do next.
    bool again = false;
    const int signal_received =
        record.run.signal_received ? record.run.signal_received : PendingLaunchSignal();
    const Decision decision =
        DecideNextStep(c, {options.auto_retry, plan.retries, retry, signal_received});
    record.detail = decision.detail;
    switch (decision.step) {
      case NextStep::kDone:
        record.action = "done";
        break;
      case NextStep::kStop:
        record.action = "stop";
        break;
      case NextStep::kStopAndResubmit:
        record.action = "stop";
        if (options.resubmit) {
          std::string how;
          std::string job = Resubmit(plan, options, env, &how);
          record.action = job.empty() ? "stop" : "resubmit";
          record.detail = job.empty() ? "(resubmit failed: " + how + ")" : job;
          Say(job.empty() ? "cannot resubmit: " + how : "resubmitted as job " + job + ": " + how);
        }
        break;
      case NextStep::kRetry:
        again = true;
        record.action = "retry";
        break;
      case NextStep::kFailover: {
        pool.CountFailure(pool.active());
        EvictedNode e{c.node, !c.node.empty(), attempt, VerdictName(c.verdict), c.evidence};
        if (e.node.empty()) e.node = pool.BlindCandidate();
        if (e.node.empty()) {
          record.action = "stop";
          record.detail = "(no node to blame: every active node was just swapped in)";
        } else if (pool.spares().empty()) {
          record.action = "stop";
          record.detail = "(no spares left for " + e.node + ")";
        } else {
          std::string spare = pool.Swap(e);
          record_eviction(e, spare);
          record.action = e.named ? "swap" : "blind-swap";
          record.detail = e.node + "->" + spare;
          again = true;
        }
        break;
      }
    }
    const double backoff =
        again ? BackoffSeconds(retry, options.backoff_base_seconds, options.backoff_cap_seconds)
              : 0;
    Json rank_nodes = Json::object();
    for (const auto& [rank, node] : log.rank_nodes()) rank_nodes[std::to_string(rank)] = node;
    Json line = {
        {"kind", "attempt"},
        {"attempt", attempt},
        {"launch_id", plan.launch_id},
        {"started", started},
        {"wall_s", record.run.seconds},
        {"scheduler", SchedulerName(plan.allocation.scheduler)},
        {"job_id", plan.allocation.job_id},
        {"nodes", record.nodes},
        {"spares", pool.spares()},
        {"ranks", plan.ranks},
        {"ranks_per_node", plan.ranks_per_node},
        {"argv", command.argv},
        {"exit_code", exit_code},
        {"job_exit_code", record.run.exit_code},
        {"timed_out", record.run.timed_out},
        {"signal", signal_received},
        {"stop_grace_s",
         record.run.stop_requested ? Json(record.run.stop_grace_seconds) : Json(nullptr)},
        {"stop_s", record.run.stop_requested ? Json(record.run.stop_seconds) : Json(nullptr)},
        {"stopped_step", log.stopped() ? Json(log.stopped()->step) : Json(nullptr)},
        {"stopped_checkpoint",
         stop.applies && !stop.checkpoint.empty() ? Json(stop.checkpoint) : Json(nullptr)},
        {"stop_problem", stop.problem},
        {"first_step", record.first_step ? Json(*record.first_step) : Json(nullptr)},
        {"last_step", record.last_step ? Json(*record.last_step) : Json(nullptr)},
        {"first_step_seconds",
         log.first_step_seconds() ? Json(*log.first_step_seconds()) : Json(nullptr)},
        {"rank_nodes", rank_nodes},
        {"verdict", VerdictName(c.verdict)},
        {"evidence", c.evidence},
        {"blamed_node", c.node},
        {"pattern", c.pattern},
        {"time_left_seconds",
         facts.time_left_seconds ? Json(*facts.time_left_seconds) : Json(nullptr)},
        {"action", record.action},
        {"detail", record.detail},
        {"backoff_seconds", backoff}};
    if (record.action == "resubmit") {
      line["resubmitted_job"] = record.detail;
      line["job_chain"] = Split(Getenv(CurrentEnvironment(), "CRUCIBLE_JOB_CHAIN"), ':');
    }
    AppendLine(attempts_path, line.dump());
    records.push_back(record);
    if (c.verdict != Verdict::kSuccess)
      Say(StrFormat("attempt %d exit %d: %s (%s) -> %s %s", attempt, exit_code,
                    VerdictName(c.verdict), c.evidence.c_str(), record.action.c_str(),
                    record.detail.c_str()));
    if (!again) break;
    if (backoff > 0) Say(StrFormat("next attempt in %.1f s", backoff));
    if (!SleepUnlessSignalled(backoff)) break;
    if (record.action != "retry" && !preflight(attempt + 1)) break;
  }
  PrintSummary(records, pool);
  return exit_code;
}

}  // namespace crucible
