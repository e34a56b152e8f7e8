// `crucible launch`: detection, the attempt loop (watchdog, retries with backoff, failover to
// spare nodes, resubmission), and the records it leaves in <run_dir>/launch/. The one entry
// point the CLI calls; see docs/launch.md for the behaviour in full.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "launch/detect.h"

namespace crucible {

// An empty optional is an option that was not given; every value that was given is checked by
// ValidateLaunchOptions (finite, within range), so no explicit value can mean "not given".
struct LaunchOptions {
  std::vector<std::string> command;  // what every rank runs
  std::string run_dir = "runs/launch";
  // Layout; not given: from the allocation.
  std::optional<int> np;
  std::optional<int> ppn;
  std::optional<int> nodes;
  std::string hostfile;
  std::string mpi = "auto";  // auto, openmpi, mpich, none
  // Run more ranks per node than the allocation's slots (or, locally, CPUs); refused otherwise.
  bool oversubscribe = false;
  bool dry_run = false;
  // Watchdog; not given: off.
  std::optional<double> timeout_seconds;
  double kill_grace_seconds = 1;
  // Retries: attempts after the first; not given: 0, or 10 with --auto-retry.
  std::optional<int> retries;
  double backoff_base_seconds = 5;
  double backoff_cap_seconds = 60;
  // Failover.
  bool auto_retry = false;
  std::optional<int> spares;  // not given: every allocated node left over
  std::vector<std::string> pattern_files;
  double walltime_margin_seconds = 300;
  // Resubmission and health check.
  bool resubmit = false;
  std::string resubmit_script;
  bool preflight = false;
  double preflight_timeout_seconds = 60;
  std::string preflight_command;  // a site health check run on every node, e.g. a GPU test
  // Hosts left out of the allocation: those named in --exclude-file files (one per line, e.g.
  // `crucible yeet`'s failed_hosts.txt) and `exclude_nodes` (the nodes --yeet could not stage).
  std::vector<std::string> exclude_files;
  std::vector<std::string> exclude_nodes;
  // Every %N in the command becomes the rank's node name, at rank start (launch --yeet), and
  // `node_local_pattern` (--to DIR, with its %N) is passed on so the trainer's config check
  // treats paths that differ only by the node's own folder as equal (train/rank_agreement.h).
  bool expand_node_name = false;
  std::string node_local_pattern;
  // The crucible binary ranks run the wrapper from; empty: this process's executable.
  std::string crucible_path;
  // The tensor-parallel degree (docs/parallelism.md): passed to the command as
  // --set parallelism.tensor_parallel_degree=N; not given: the command's own such --set, else 1.
  std::optional<int> tensor_parallel;
};

// The tensor-parallel degree of `options` (--tp, else the command's
// --set parallelism.tensor_parallel_degree=N, else 1), and the command with it passed on.
// UsageError when the two disagree or a value is not a positive integer.
int TensorParallelDegree(const LaunchOptions& options, std::vector<std::string>* command);
// The tensor-parallel groups of `ranks` ranks placed `ranks_per_node` per node in `nodes`'
// order (consecutive ranks on a node, as the launch commands place them), one line each:
// "  group 1: ranks 2-3 on n1", and a warning line for each group that spans nodes.
std::vector<std::string> DescribeTensorParallelGroups(int ranks, int ranks_per_node, int tp,
                                                      const std::vector<std::string>& nodes,
                                                      std::vector<std::string>* warnings);

// Throws UsageError (exit 2) naming the option when a given number is not finite or out of
// range, or when options contradict each other (--spares without --auto-retry).
void ValidateLaunchOptions(const LaunchOptions& options);

// Validates the options (UsageError, exit 2, for bad input), runs the job, and returns its
// exit code: the last attempt's, or 124 when the watchdog killed it.
int RunLaunch(const LaunchOptions& options, const Environment& env);

// The pause before retry `retry` (1-based): base x 2^(retry-1), at most cap.
double BackoffSeconds(int retry, double base, double cap);

}  // namespace crucible
