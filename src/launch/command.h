// The launch command for one attempt: srun under Slurm, mpiexec under PBS, mpirun (or mpiexec
// for MPICH) locally. Always argv, never a shell string. Every rank runs through the rank
// wrapper (`crucible launch-rank --`), which gives it the same environment whatever started it.
#pragma once

#include <string>
#include <vector>

#include "launch/detect.h"

namespace crucible {

// How the MPI launcher labels its output with the rank that wrote it.
enum class LabelStyle {
  kNone,    // no label (one process, no MPI launcher)
  kColon,   // "3: text" at each line's start: srun --label, PALS --label
  kTagged,  // "[1,3]<stdout>:text" at each chunk a rank writes, mid-line too: mpirun
            // --tag-output; Hydra with -prepend-pattern "[%g,%r]<hydra>:"
};

// The pattern Hydra is given: the same tag as Open MPI's, which cannot be mistaken for text
// (its own -l label, "[3] ", can: "a[3] = 5").
inline constexpr const char* kHydraLabelPattern = "[%g,%r]<hydra>:";

struct LaunchSpec {
  Scheduler scheduler = Scheduler::kLocal;
  MpiFlavour mpi = MpiFlavour::kNone;
  std::vector<std::string> nodes;  // the active nodes, in rank order
  int ranks_per_node = 1;
  int ranks = 1;              // total; at most nodes x ranks_per_node
  int cpus_per_node = 1;      // for CPU binding depth under PBS
  bool as_root = false;       // OpenMPI refuses root without --allow-run-as-root
  std::string hostfile_path;  // PBS: where the active nodes are written
  std::string step_name;      // srun --job-name, to find the step again
  std::string mpi_launcher;   // local: the MPI launcher (empty: mpirun for Open MPI, mpiexec
                              // for MPICH); see LocalMpiLauncher
  std::string mpi_chosen_by;  // "--mpi none", "CRUCIBLE_MPI=none": how kNone was chosen; empty
                              // when no MPI launcher was found on PATH
  // More ranks per node than slots: srun --overcommit, PBS's Open MPI mpiexec --oversubscribe.
  bool oversubscribe = false;
  Environment env;  // variables every rank gets (CRUCIBLE_RUN_DIR, ...)
  std::vector<std::string>
      rank_wrapper;  // argv prefix run on each rank, e.g. crucible launch-rank --
  std::vector<std::string> command;
};

struct LaunchCommand {
  std::vector<std::string> argv;
  Environment env;            // added to the launcher's environment for the child
  std::string hostfile_path;  // written (hostfile_contents) before argv runs, when non-empty
  std::string hostfile_contents;
  LabelStyle labels = LabelStyle::kNone;
};

// Throws UsageError for a spec no launcher can run (no MPI with more than one rank, more
// ranks than slots, no nodes).
LaunchCommand BuildLaunchCommand(const LaunchSpec& spec);

// argv as a shell would need it typed (for --dry-run and logs only; never executed).
std::string ShellQuote(const std::vector<std::string>& argv);

}  // namespace crucible
