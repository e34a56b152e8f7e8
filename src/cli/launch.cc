// crucible launch [options] -- COMMAND...   (docs/launch.md)
// crucible launch-rank [--check RUN_DIR] -- COMMAND...   (hidden: the per-rank wrapper)
#include <memory>

#include "cli/command.h"
#include "common/error.h"
#include "common/files.h"
#include "launch/launcher.h"
#include "launch/preflight.h"
#include "launch/rank_environment.h"
#include "stage/node_paths.h"
#include "stage/yeet.h"

namespace crucible {
namespace {

CommandRun SetupLaunch(CLI::App& app) {
  auto o = std::make_shared<LaunchOptions>();
  app.add_option("command", o->command, "the command every rank runs, after --");
  app.add_option("--run-dir", o->run_dir,
                 "run directory; launch records go to RUN_DIR/launch/ (default runs/launch)");
  app.add_option("--np", o->np, "total ranks (default: nodes x ranks per node)");
  app.add_option("--ppn", o->ppn,
                 "ranks per node (default: the allocation's slots, else accelerators, else 1)");
  app.add_option("--nodes", o->nodes, "active nodes (default: the allocation, less the spares)");
  app.add_option("--hostfile", o->hostfile, "file of hosts to use instead of the allocation's");
  app.add_option("--exclude-file", o->exclude_files,
                 "file of hosts to leave out of the allocation, one per line (crucible yeet's "
                 "failed_hosts.txt, launch's bad_nodes.txt); repeatable");
  auto yeet = std::make_shared<YeetOptions>();
  app.add_option("--yeet", yeet->sources,
                 "stage SRC on every node first (crucible yeet; repeatable, needs --to), then "
                 "point the command's arguments under SRC at DIR/<SRC's name>");
  app.add_option("--to", yeet->destination,
                 "where --yeet stages, an absolute node-local path; %N (the node's name) is "
                 "expanded on each rank, in the rewritten arguments too");
  app.add_option("--mpi", o->mpi, "MPI flavour: auto, openmpi, mpich or none")
      ->check(CLI::IsMember({"auto", "openmpi", "mpich", "none"}));
  app.add_flag("--oversubscribe", o->oversubscribe,
               "run more ranks per node than the allocation's slots (locally: CPUs); without it "
               "that is refused (exit 2)");
  app.add_flag("--dry-run", o->dry_run,
               "print the exact command and environment (and the tensor-parallel groups with "
               "their nodes), run nothing");
  app.add_option("--tp", o->tensor_parallel,
                 "tensor-parallel degree, passed to the command as --set "
                 "parallelism.tensor_parallel_degree=N (default: the command's own, else 1); "
                 "warns when a group of consecutive ranks would span nodes");
  app.add_option(
      "--timeout", o->timeout_seconds,
      "hang watchdog: kill the job when no output line appears for S seconds (exit 124); "
      "default: off");
  app.add_option("--kill-grace", o->kill_grace_seconds,
                 "seconds between SIGTERM and SIGKILL when the job is killed, and the least a stop "
                 "waits for the job (default 1)");
  app.add_option("--retries", o->retries,
                 "re-run a failed job up to N times (default 0; 10 with --auto-retry); never "
                 "after a config error (exit 2 or 65, or two attempts in a row without a step)");
  app.add_option("--backoff-base", o->backoff_base_seconds,
                 "first pause between attempts, doubling each time (default 5 s)");
  app.add_option("--backoff-cap", o->backoff_cap_seconds, "longest pause (default 60 s)");
  app.add_flag("--auto-retry", o->auto_retry,
               "classify each failure and fail over: swap bad nodes for spares, retry in place "
               "after I/O errors, stop on config errors");
  app.add_option("--spares", o->spares,
                 "spare nodes held back for failover (default: every node not active)");
  app.add_option("--bad-node-patterns", o->pattern_files,
                 "extra bad-node pattern file (configs/bad_node_patterns.txt format); repeatable");
  app.add_option(
      "--walltime-margin", o->walltime_margin_seconds,
      "a 143 counts as walltime when at most this much wall time is left (default 300 s)");
  app.add_flag("--resubmit", o->resubmit,
               "on walltime, or a stop after a signal to the launcher (143 or 75), queue the "
               "follow-on job with sbatch/qsub afterany dependency");
  app.add_option("--resubmit-script", o->resubmit_script,
                 "batch script to resubmit (default: the current job's, from scontrol)");
  app.add_flag("--preflight", o->preflight,
               "health-check nodes before the first attempt and every swapped-in spare");
  app.add_option("--preflight-command", o->preflight_command,
                 "site health check run on every node by --preflight (non-zero: node is bad)");
  app.add_option("--preflight-timeout", o->preflight_timeout_seconds,
                 "seconds the preflight may stay silent (default 60)");
  app.footer(
      "Scheduler: CRUCIBLE_SCHEDULER (local, slurm, pbs) or detected from PBS_*/SLURM_* "
      "variables.\n"
      "MPI: --mpi or CRUCIBLE_MPI, else detected from mpirun on PATH.\n"
      "Stop: SIGTERM, SIGINT, SIGHUP or SIGUSR1 sends SIGUSR1 to the ranks and waits for their\n"
      "checkpoint (a grace measured from the save times); a second TERM/INT/HUP kills at once.\n"
      "Exit: the job's exit code; after a stop 143 only when the checkpoint the trainer names is\n"
      "complete, else 75; 124 when the watchdog killed it; 2 for bad usage (every number\n"
      "is checked: finite, counts from 1 (--retries, --spares from 0), seconds at most 1e7; more\n"
      "ranks per node than the allocation's slots, or locally CPUs, needs --oversubscribe).\n"
      "Records: RUN_DIR/launch/attempts.jsonl, attempt-<k>.log, bad_nodes.txt; with --yeet,\n"
      "RUN_DIR/yeet/ (status, logs, failed_hosts.txt). See docs/launch.md.");
  return [o, yeet]() {
    if (yeet->sources.empty() != yeet->destination.empty())
      throw UsageError("--yeet SRC and --to DIR go together");
    if (yeet->sources.empty()) return RunLaunch(*o, CurrentEnvironment());
    LaunchOptions options = *o;
    options.command = RewriteArguments(o->command, yeet->sources, yeet->destination);
    options.expand_node_name = true;
    options.node_local_pattern = yeet->destination;
    if (!o->dry_run) {
      // Stage on every node of the allocation (spares too), recorded in RUN_DIR/yeet/.
      YeetOptions staging = *yeet;
      staging.work_dir = JoinPath(o->run_dir, "yeet");
      staging.hostfile = o->hostfile;
      staging.exclude_files = o->exclude_files;
      // Staging always runs over MPI, even for a job launched without it (--mpi none).
      staging.mpi = o->mpi == "none" ? "auto" : o->mpi;
      Environment env = CurrentEnvironment();
      if (env["CRUCIBLE_MPI"] == "none") env.erase("CRUCIBLE_MPI");
      const YeetResult staged = RunYeet(staging, env);
      if (staged.exit_code != kExitOk) return staged.exit_code;
      options.exclude_nodes = staged.nodes_failed;
    }
    return RunLaunch(options, CurrentEnvironment());
  };
}

CommandRun SetupLaunchRank(CLI::App& app) {
  auto command = std::make_shared<std::vector<std::string>>();
  auto check_dir = std::make_shared<std::string>();
  auto check_command = std::make_shared<std::string>();
  app.group("");  // internal: not listed in crucible --help
  app.add_option("command", *command, "the rank's command, after --");
  app.add_option("--check", *check_dir, "run the preflight node check against RUN_DIR instead");
  app.add_option("--check-command", *check_command, "site health check for --check");
  return [command, check_dir, check_command]() {
    if (!check_dir->empty()) return RunNodeCheck(*check_dir, *command, *check_command);
    return ExecRank(*command);
  };
}

CommandRegistrar launch_registrar(
    "launch", "start a distributed job and keep it alive: crucible launch [options] -- COMMAND...",
    SetupLaunch);
CommandRegistrar launch_rank_registrar("launch-rank", "per-rank wrapper of crucible launch",
                                       SetupLaunchRank);

}  // namespace
}  // namespace crucible
