#include "launch/command.h"

#include "common/error.h"
#include "common/strings.h"
#include "launch/hostlist.h"

namespace crucible {
namespace {

void Append(std::vector<std::string>* argv, std::initializer_list<std::string> items) {
  argv->insert(argv->end(), items.begin(), items.end());
}

std::string Str(int value) {
  return std::to_string(value);
}

}  // namespace

LaunchCommand BuildLaunchCommand(const LaunchSpec& spec) {
  if (spec.nodes.empty()) throw UsageError("no active nodes to launch on");
  if (spec.command.empty()) throw UsageError("no command to launch");
  if (spec.ranks_per_node < 1 || spec.ranks < 1)
    throw UsageError("ranks and ranks per node must be at least 1");
  const int nodes = static_cast<int>(spec.nodes.size());
  if (spec.ranks > nodes * spec.ranks_per_node)
    throw UsageError(StrFormat("%d ranks do not fit on %d node(s) x %d rank(s) per node",
                               spec.ranks, nodes, spec.ranks_per_node));
  const int depth = std::max(1, spec.cpus_per_node / spec.ranks_per_node);
  LaunchCommand out;
  out.env = spec.env;
  std::vector<std::string>& argv = out.argv;

  if (spec.scheduler == Scheduler::kSlurm) {
    Append(&argv,
           {"srun", "--nodelist=" + JoinHosts(spec.nodes), "-N", Str(nodes), "-n", Str(spec.ranks),
            "--ntasks-per-node=" + Str(spec.ranks_per_node), "--kill-on-bad-exit=1", "--label"});
    if (spec.oversubscribe) argv.push_back("--overcommit");
    if (spec.mpi == MpiFlavour::kOpenMpi) argv.push_back("--mpi=pmix");
    if (spec.mpi == MpiFlavour::kMpich) argv.push_back("--mpi=pmi2");
    if (!spec.step_name.empty()) argv.push_back("--job-name=" + spec.step_name);
    out.labels = LabelStyle::kColon;
  } else if (spec.mpi == MpiFlavour::kNone) {
    if ((spec.ranks > 1 || nodes > 1) && spec.mpi_chosen_by.empty())
      throw UsageError(StrFormat(
          "%d ranks on %d node(s) need an MPI launcher, and none was found on PATH (install "
          "openmpi-bin or pass --mpi)",
          spec.ranks, nodes));
    if (spec.ranks > 1 || nodes > 1)
      throw UsageError(StrFormat(
          "%s runs the command once, without an MPI launcher, but %d ranks on %d node(s) were "
          "asked for: %s, or ask for one rank (--np 1)",
          spec.mpi_chosen_by.c_str(), spec.ranks, nodes,
          StartsWith(spec.mpi_chosen_by, "--mpi")
              ? "pass --mpi auto, openmpi or mpich to start them through MPI"
              : "unset CRUCIBLE_MPI, or set it to openmpi or mpich, to start them through MPI"));
  } else if (spec.scheduler == Scheduler::kPbs) {
    out.hostfile_path = spec.hostfile_path;
    for (const std::string& node : spec.nodes)
      out.hostfile_contents += spec.mpi == MpiFlavour::kOpenMpi
                                   ? node + " slots=" + Str(spec.ranks_per_node) + "\n"
                                   : node + "\n";
    Append(&argv, {"mpiexec", "--hostfile", spec.hostfile_path, "--np", Str(spec.ranks)});
    if (spec.mpi == MpiFlavour::kOpenMpi) {
      std::string map = "ppr:" + Str(spec.ranks_per_node) + ":node";
      if (depth > 1) map += ":PE=" + Str(depth);
      Append(&argv, {"--map-by", map, "--bind-to", "core", "--tag-output"});
      if (spec.oversubscribe) argv.push_back("--oversubscribe");
      out.labels = LabelStyle::kTagged;
    } else {  // Cray PALS, the mpiexec of PBS systems running MPICH
      Append(&argv, {"--ppn", Str(spec.ranks_per_node), "--cpu-bind", "depth", "--depth",
                     Str(depth), "--label"});
      out.labels = LabelStyle::kColon;
    }
  } else if (spec.mpi == MpiFlavour::kOpenMpi) {
    Append(&argv,
           {spec.mpi_launcher.empty() ? "mpirun" : spec.mpi_launcher, "--np", Str(spec.ranks)});
    if (nodes > 1 || spec.nodes[0] != "localhost") {
      std::string hosts;
      for (const std::string& node : spec.nodes)
        hosts += (hosts.empty() ? "" : ",") + node + ":" + Str(spec.ranks_per_node);
      Append(&argv, {"--host", hosts});
    }
    Append(&argv, {"--oversubscribe", "--bind-to", "none", "--tag-output"});
    out.labels = LabelStyle::kTagged;
  } else {  // local MPICH: Hydra's mpiexec
    Append(&argv,
           {spec.mpi_launcher.empty() ? "mpiexec" : spec.mpi_launcher, "-n", Str(spec.ranks)});
    if (nodes > 1 || spec.nodes[0] != "localhost")
      Append(&argv, {"-hosts", JoinHosts(spec.nodes), "-ppn", Str(spec.ranks_per_node)});
    Append(&argv, {"-prepend-pattern", kHydraLabelPattern});
    out.labels = LabelStyle::kTagged;
  }

  if (spec.mpi == MpiFlavour::kOpenMpi && spec.scheduler != Scheduler::kSlurm) {
    if (spec.as_root) argv.push_back("--allow-run-as-root");
    for (const auto& [key, value] : spec.env) Append(&argv, {"-x", key});
  }
  argv.insert(argv.end(), spec.rank_wrapper.begin(), spec.rank_wrapper.end());
  argv.insert(argv.end(), spec.command.begin(), spec.command.end());
  return out;
}

std::string ShellQuote(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& arg : argv) {
    if (!out.empty()) out += ' ';
    bool plain = !arg.empty();
    for (char c : arg)
      if (!(isalnum(static_cast<unsigned char>(c)) ||
            std::string_view("-_./=:,+@%").find(c) != std::string_view::npos))
        plain = false;
    if (plain) {
      out += arg;
    } else {
      out += '\'';
      for (char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
      out += '\'';
    }
  }
  return out;
}

}  // namespace crucible
