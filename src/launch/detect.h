// What the launcher finds out about where it runs: the scheduler and its allocation, the
// accelerator the node exposes, the MPI flavour on PATH, and how much wall time the job has
// left. Every function takes its inputs (environment, file-system root, command output) as
// arguments so tests can fake a PBS or Slurm job without one.
#pragma once

#include <ctime>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "launch/environment.h"

namespace crucible {

enum class Scheduler { kLocal, kSlurm, kPbs };
enum class MpiFlavour { kNone, kOpenMpi, kMpich };
enum class AcceleratorKind { kCpu, kNvidia, kAmd, kIntelXpu };

const char* SchedulerName(Scheduler scheduler);     // "local", "slurm", "pbs"
const char* MpiFlavourName(MpiFlavour flavour);     // "none", "openmpi", "mpich"
const char* AcceleratorName(AcceleratorKind kind);  // "cpu", "nvidia", "amd", "xpu"
Scheduler ParseScheduler(const std::string& name);  // throws UsageError
MpiFlavour ParseMpiFlavour(const std::string& name);

struct Allocation {
  Scheduler scheduler = Scheduler::kLocal;
  std::string job_id;              // SLURM_JOB_ID / PBS_JOBID; empty when local
  std::vector<std::string> nodes;  // every allocated node, in the scheduler's order
  int slots_per_node = 0;          // ranks per node the allocation implies; 0 when unknown
  std::string source;              // where the node list came from, for --dry-run
  // The most ranks a node runs without oversubscribing: its slots (PBS_NODEFILE, a hostfile's
  // slots=N), Slurm's tasks or CPUs per node, or this machine's CPUs for a local job; 0 when
  // unknown. `max_ranks_source` says where it came from, for messages.
  int max_ranks_per_node = 0;
  std::string max_ranks_source;
};

// Scheduler: CRUCIBLE_SCHEDULER if set, else PBS (PBS_JOBID + PBS_NODEFILE), else Slurm
// (SLURM_JOB_ID + SLURM_JOB_NODELIST or SLURM_NODELIST), else local (this host only). A
// non-empty `hostfile` replaces the node list. Throws UsageError for an unreadable or empty
// node file, or an override naming a scheduler whose variables are missing.
Allocation DetectAllocation(const Environment& env, const std::string& hostfile);

struct Accelerator {
  AcceleratorKind kind = AcceleratorKind::kCpu;
  int count = 0;  // devices on this node (0 for CPU)
};
// From what the node exposes under `root` ("/" normally): /dev/nvidiaN, /dev/kfd with GPU
// nodes in the KFD topology, Intel data-centre GPUs (PCI class 0x0380xx) under /sys/class/drm.
Accelerator DetectAccelerator(const std::string& root = "/");

// The MPI flavour of the `mpirun`/`mpiexec` found on PATH in `env`: by the launcher's real
// name and its neighbours (ompi_info, hydra_pmi_proxy), else by its --version output. kNone
// when no launcher is on PATH.
MpiFlavour DetectMpiFlavour(const Environment& env);
// The flavour of one launcher executable (a path): by its real name and neighbours, else by
// its --version output.
MpiFlavour MpiFlavourOfLauncher(const std::string& launcher);
// Same, from --version text alone.
MpiFlavour MpiFlavourFromVersion(std::string_view version_text);
// The launcher a local job of `flavour` runs: `mpirun` (Open MPI) or `mpiexec` (MPICH) from
// PATH, unless that one is missing or belongs to the other MPI (Debian installs both side by
// side and points mpirun/mpiexec at one of them); then the flavour's own name when it is on
// PATH: mpirun.openmpi, or mpiexec.mpich / mpiexec.hydra. "" for kNone.
std::string LocalMpiLauncher(MpiFlavour flavour, const Environment& env);

// Seconds of wall time the job has left, from `scontrol show job -o <id>` output (EndTime,
// Reason=TimeLimit) or `qstat -f <id>` output (Resource_List.walltime - resources_used.walltime).
// nullopt when the text does not say (unlimited, unknown).
std::optional<double> SlurmTimeLeft(std::string_view scontrol_show_job, std::time_t now);
std::optional<double> PbsTimeLeft(std::string_view qstat_full);
// Asks the scheduler (nullopt for local jobs and when the query fails).
std::optional<double> QueryTimeLeft(const Allocation& allocation);

// Slurm node states (sinfo %T, e.g. "idle", "down*", "drained") of `nodes`; empty for other
// schedulers or when sinfo fails. A state is bad when the node is down, drained, failing or
// not responding.
std::map<std::string, std::string> QueryNodeStates(const Allocation& allocation,
                                                   const std::vector<std::string>& nodes);
bool IsBadNodeState(std::string_view state);

// The path to a batch job's script as the scheduler recorded it (Slurm: Command= of scontrol
// show job); empty when unknown.
std::string QueryBatchScript(const Allocation& allocation);

}  // namespace crucible
