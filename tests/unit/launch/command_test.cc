// Full argv of every scheduler x MPI flavour.
#include "launch/command.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "common/error.h"

namespace crucible {
namespace {

using Argv = std::vector<std::string>;

LaunchSpec Spec(Scheduler scheduler, MpiFlavour mpi) {
  LaunchSpec spec;
  spec.scheduler = scheduler;
  spec.mpi = mpi;
  spec.nodes = {"n1", "n3", "n4"};
  spec.ranks_per_node = 2;
  spec.ranks = 6;
  spec.cpus_per_node = 8;
  spec.hostfile_path = "/run/launch/hostfile-2";
  spec.step_name = "crucible-77";
  spec.env = {{"CRUCIBLE_ATTEMPT", "2"}, {"CRUCIBLE_RUN_DIR", "/run"}};
  spec.rank_wrapper = {"/bin/crucible", "launch-rank", "--"};
  spec.command = {"crucible", "train", "--config", "a b.toml"};
  return spec;
}

const Argv kTail = {"/bin/crucible", "launch-rank", "--",      "crucible",
                    "train",         "--config",    "a b.toml"};

Argv With(Argv head) {
  head.insert(head.end(), kTail.begin(), kTail.end());
  return head;
}

TEST(LaunchCommand, SlurmOpenMpiUsesSrunWithExplicitNodeList) {
  LaunchCommand c = BuildLaunchCommand(Spec(Scheduler::kSlurm, MpiFlavour::kOpenMpi));
  EXPECT_EQ(c.argv,
            With({"srun", "--nodelist=n1,n3,n4", "-N", "3", "-n", "6", "--ntasks-per-node=2",
                  "--kill-on-bad-exit=1", "--label", "--mpi=pmix", "--job-name=crucible-77"}));
  EXPECT_EQ(c.labels, LabelStyle::kColon);
  EXPECT_EQ(c.env.at("CRUCIBLE_ATTEMPT"), "2");
  EXPECT_TRUE(c.hostfile_path.empty());
}

TEST(LaunchCommand, SlurmMpichUsesPmi2) {
  LaunchCommand c = BuildLaunchCommand(Spec(Scheduler::kSlurm, MpiFlavour::kMpich));
  EXPECT_EQ(c.argv,
            With({"srun", "--nodelist=n1,n3,n4", "-N", "3", "-n", "6", "--ntasks-per-node=2",
                  "--kill-on-bad-exit=1", "--label", "--mpi=pmi2", "--job-name=crucible-77"}));
}

TEST(LaunchCommand, SlurmWithoutMpiLeavesThePluginToTheSite) {
  LaunchCommand c = BuildLaunchCommand(Spec(Scheduler::kSlurm, MpiFlavour::kNone));
  EXPECT_EQ(c.argv,
            With({"srun", "--nodelist=n1,n3,n4", "-N", "3", "-n", "6", "--ntasks-per-node=2",
                  "--kill-on-bad-exit=1", "--label", "--job-name=crucible-77"}));
}

TEST(LaunchCommand, PbsOpenMpiWritesHostfileAndBindsCores) {
  LaunchSpec spec = Spec(Scheduler::kPbs, MpiFlavour::kOpenMpi);
  spec.as_root = true;
  LaunchCommand c = BuildLaunchCommand(spec);
  EXPECT_EQ(c.argv,
            With({"mpiexec", "--hostfile", "/run/launch/hostfile-2", "--np", "6", "--map-by",
                  "ppr:2:node:PE=4", "--bind-to", "core", "--tag-output", "--allow-run-as-root",
                  "-x", "CRUCIBLE_ATTEMPT", "-x", "CRUCIBLE_RUN_DIR"}));
  EXPECT_EQ(c.hostfile_path, "/run/launch/hostfile-2");
  EXPECT_EQ(c.hostfile_contents, "n1 slots=2\nn3 slots=2\nn4 slots=2\n");
  EXPECT_EQ(c.labels, LabelStyle::kTagged);
}

TEST(LaunchCommand, PbsMpichUsesPalsOptions) {
  LaunchCommand c = BuildLaunchCommand(Spec(Scheduler::kPbs, MpiFlavour::kMpich));
  EXPECT_EQ(c.argv, With({"mpiexec", "--hostfile", "/run/launch/hostfile-2", "--np", "6", "--ppn",
                          "2", "--cpu-bind", "depth", "--depth", "4", "--label"}));
  EXPECT_EQ(c.hostfile_contents, "n1\nn3\nn4\n");
  EXPECT_EQ(c.labels, LabelStyle::kColon);
}

TEST(LaunchCommand, LocalOpenMpiRunsAsRootWithHosts) {
  LaunchSpec spec = Spec(Scheduler::kLocal, MpiFlavour::kOpenMpi);
  spec.as_root = true;
  LaunchCommand c = BuildLaunchCommand(spec);
  EXPECT_EQ(c.argv, With({"mpirun", "--np", "6", "--host", "n1:2,n3:2,n4:2", "--oversubscribe",
                          "--bind-to", "none", "--tag-output", "--allow-run-as-root", "-x",
                          "CRUCIBLE_ATTEMPT", "-x", "CRUCIBLE_RUN_DIR"}));
}

TEST(LaunchCommand, LocalOpenMpiOnThisHostOnly) {
  LaunchSpec spec = Spec(Scheduler::kLocal, MpiFlavour::kOpenMpi);
  spec.nodes = {"localhost"};
  spec.ranks = 2;
  LaunchCommand c = BuildLaunchCommand(spec);
  EXPECT_EQ(c.argv, With({"mpirun", "--np", "2", "--oversubscribe", "--bind-to", "none",
                          "--tag-output", "-x", "CRUCIBLE_ATTEMPT", "-x", "CRUCIBLE_RUN_DIR"}));
}

TEST(LaunchCommand, LocalMpichUsesHydra) {
  LaunchCommand c = BuildLaunchCommand(Spec(Scheduler::kLocal, MpiFlavour::kMpich));
  EXPECT_EQ(c.argv, With({"mpiexec", "-n", "6", "-hosts", "n1,n3,n4", "-ppn", "2",
                          "-prepend-pattern", "[%g,%r]<hydra>:"}));
  EXPECT_EQ(c.labels, LabelStyle::kTagged);
}

TEST(LaunchCommand, LocalRunsTheChosenMpiLauncher) {
  LaunchSpec mpich = Spec(Scheduler::kLocal, MpiFlavour::kMpich);
  mpich.nodes = {"localhost"};
  mpich.ranks = 2;
  mpich.mpi_launcher = "mpiexec.mpich";
  EXPECT_EQ(BuildLaunchCommand(mpich).argv,
            With({"mpiexec.mpich", "-n", "2", "-prepend-pattern", "[%g,%r]<hydra>:"}));
  LaunchSpec openmpi = Spec(Scheduler::kLocal, MpiFlavour::kOpenMpi);
  openmpi.nodes = {"localhost"};
  openmpi.ranks = 2;
  openmpi.mpi_launcher = "mpirun.openmpi";
  EXPECT_EQ(BuildLaunchCommand(openmpi).argv,
            With({"mpirun.openmpi", "--np", "2", "--oversubscribe", "--bind-to", "none",
                  "--tag-output", "-x", "CRUCIBLE_ATTEMPT", "-x", "CRUCIBLE_RUN_DIR"}));
}

TEST(LaunchCommand, LocalWithoutMpiRunsOneRankDirectly) {
  LaunchSpec spec = Spec(Scheduler::kLocal, MpiFlavour::kNone);
  spec.nodes = {"localhost"};
  spec.ranks = 1;
  LaunchCommand c = BuildLaunchCommand(spec);
  EXPECT_EQ(c.argv, kTail);
  EXPECT_EQ(c.labels, LabelStyle::kNone);
}

TEST(LaunchCommand, RejectsLayoutsNoLauncherCanRun) {
  LaunchSpec spec = Spec(Scheduler::kLocal, MpiFlavour::kNone);
  EXPECT_THROW(BuildLaunchCommand(spec), Error);  // 6 ranks, no MPI
  spec = Spec(Scheduler::kSlurm, MpiFlavour::kOpenMpi);
  spec.ranks = 7;  // 3 nodes x 2
  EXPECT_THROW(BuildLaunchCommand(spec), Error);
  spec = Spec(Scheduler::kSlurm, MpiFlavour::kOpenMpi);
  spec.command.clear();
  EXPECT_THROW(BuildLaunchCommand(spec), Error);
}

std::string RefusalOf(const LaunchSpec& spec) {
  try {
    BuildLaunchCommand(spec);
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    return e.what();
  }
  ADD_FAILURE() << "the spec was accepted";
  return "";
}

TEST(LaunchCommand, NoMpiChosenSaysWhatThatMeansAndWhatToDo) {
  LaunchSpec spec = Spec(Scheduler::kLocal, MpiFlavour::kNone);
  spec.nodes = {"localhost"};
  spec.ranks = 2;
  spec.mpi_chosen_by = "--mpi none";
  const std::string chosen = RefusalOf(spec);
  EXPECT_NE(chosen.find("--mpi none runs the command once, without an MPI launcher"),
            std::string::npos)
      << chosen;
  EXPECT_NE(chosen.find("2 ranks"), std::string::npos) << chosen;
  EXPECT_NE(chosen.find("--mpi auto, openmpi or mpich"), std::string::npos) << chosen;
  EXPECT_EQ(chosen.find("found on PATH"), std::string::npos) << chosen;
  spec.mpi_chosen_by.clear();  // none detected
  EXPECT_NE(RefusalOf(spec).find("none was found on PATH"), std::string::npos);
}

TEST(LaunchCommand, OversubscribeAsksEachLauncherThatLimitsRanksToSlots) {
  auto has = [](const LaunchSpec& spec, const std::string& flag) {
    const Argv argv = BuildLaunchCommand(spec).argv;
    return std::count(argv.begin(), argv.end(), flag);
  };
  LaunchSpec slurm = Spec(Scheduler::kSlurm, MpiFlavour::kOpenMpi);
  LaunchSpec pbs = Spec(Scheduler::kPbs, MpiFlavour::kOpenMpi);
  EXPECT_EQ(has(slurm, "--overcommit"), 0);
  EXPECT_EQ(has(pbs, "--oversubscribe"), 0);
  slurm.oversubscribe = pbs.oversubscribe = true;
  EXPECT_EQ(has(slurm, "--overcommit"), 1);
  EXPECT_EQ(has(pbs, "--oversubscribe"), 1);
  // Local Open MPI always oversubscribes (mpirun counts cores, not the job's slots).
  LaunchSpec local = Spec(Scheduler::kLocal, MpiFlavour::kOpenMpi);
  EXPECT_EQ(has(local, "--oversubscribe"), 1);
  local.oversubscribe = true;
  EXPECT_EQ(has(local, "--oversubscribe"), 1);
}

TEST(LaunchCommand, ArgumentsStayArgvNotShell) {
  LaunchSpec spec = Spec(Scheduler::kSlurm, MpiFlavour::kOpenMpi);
  spec.command = {"echo", "$(rm -rf /)", "a;b", "it's"};
  LaunchCommand c = BuildLaunchCommand(spec);
  EXPECT_EQ(Argv(c.argv.end() - 4, c.argv.end()), spec.command);
  EXPECT_EQ(ShellQuote({"echo", "$(rm -rf /)", "it's", "plain"}),
            "echo '$(rm -rf /)' 'it'\\''s' plain");
}

}  // namespace
}  // namespace crucible
