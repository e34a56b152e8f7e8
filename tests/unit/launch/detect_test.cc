#include "launch/detect.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "common/files.h"
#include "launch/rank_environment.h"

namespace crucible {
namespace {

TEST(Detect, LocalWithoutSchedulerVariables) {
  Allocation a = DetectAllocation({{"PATH", "/usr/bin"}}, "");
  EXPECT_EQ(a.scheduler, Scheduler::kLocal);
  EXPECT_EQ(a.nodes, std::vector<std::string>{"localhost"});
}

TEST(Detect, SlurmExpandsTheNodeList) {
  Allocation a = DetectAllocation(
      {{"SLURM_JOB_ID", "42"}, {"SLURM_JOB_NODELIST", "n[1-4]"}, {"SLURM_NTASKS_PER_NODE", "2"}},
      "");
  EXPECT_EQ(a.scheduler, Scheduler::kSlurm);
  EXPECT_EQ(a.job_id, "42");
  EXPECT_EQ(a.nodes, (std::vector<std::string>{"n1", "n2", "n3", "n4"}));
  EXPECT_EQ(a.slots_per_node, 2);
}

TEST(Detect, PbsWinsAndCountsSlotsFromTheNodeFile) {
  const std::string nodefile = testing::TempDir() + "/pbs_nodefile";
  std::ofstream(nodefile) << "x1.hsn\nx1.hsn\nx1.hsn\nx1.hsn\nx2.hsn\nx2.hsn\nx2.hsn\nx2.hsn\n";
  Allocation a = DetectAllocation({{"PBS_JOBID", "7.pbs01"},
                                   {"PBS_NODEFILE", nodefile},
                                   {"SLURM_JOB_ID", "1"},
                                   {"SLURM_JOB_NODELIST", "n1"}},
                                  "");
  EXPECT_EQ(a.scheduler, Scheduler::kPbs);
  EXPECT_EQ(a.job_id, "7.pbs01");
  EXPECT_EQ(a.nodes, (std::vector<std::string>{"x1.hsn", "x2.hsn"}));
  EXPECT_EQ(a.slots_per_node, 4);
}

TEST(Detect, OverrideAndHostfile) {
  const std::string hostfile = testing::TempDir() + "/hosts";
  std::ofstream(hostfile) << "a\nb\n";
  Allocation a = DetectAllocation(
      {{"CRUCIBLE_SCHEDULER", "local"}, {"SLURM_JOB_ID", "1"}, {"SLURM_JOB_NODELIST", "n1"}},
      hostfile);
  EXPECT_EQ(a.scheduler, Scheduler::kLocal);
  EXPECT_EQ(a.nodes, (std::vector<std::string>{"a", "b"}));
  EXPECT_THROW(DetectAllocation({{"CRUCIBLE_SCHEDULER", "slurm"}}, ""), Error);
  EXPECT_THROW(DetectAllocation({{"CRUCIBLE_SCHEDULER", "lsf"}}, ""), Error);
  EXPECT_THROW(DetectAllocation({}, testing::TempDir() + "/no-such-hostfile"), Error);
}

TEST(Detect, TheMostRanksANodeRunsAreItsSlotsOrItsCpus) {
  const Environment slurm = {{"SLURM_JOB_ID", "42"}, {"SLURM_JOB_NODELIST", "n[1-3]"}};
  Environment env = slurm;
  env["SLURM_NTASKS_PER_NODE"] = "2";
  env["SLURM_JOB_CPUS_PER_NODE"] = "8(x3)";
  Allocation a = DetectAllocation(env, "");
  EXPECT_EQ(a.max_ranks_per_node, 2);
  EXPECT_EQ(a.max_ranks_source, "SLURM_NTASKS_PER_NODE=2");
  env = slurm;
  env["SLURM_JOB_CPUS_PER_NODE"] = "8(x2),4";
  a = DetectAllocation(env, "");
  EXPECT_EQ(a.max_ranks_per_node, 4);  // the smallest node
  EXPECT_EQ(a.max_ranks_source, "SLURM_JOB_CPUS_PER_NODE=8(x2),4");
  EXPECT_EQ(a.slots_per_node, 0);  // CPUs bound the ranks, they do not set their default
  EXPECT_EQ(DetectAllocation(slurm, "").max_ranks_per_node, 0);

  const std::string nodefile = testing::TempDir() + "/pbs_nodefile_slots";
  std::ofstream(nodefile) << "x1\nx1\nx1\nx2\nx2\nx2\n";
  a = DetectAllocation({{"PBS_JOBID", "7"}, {"PBS_NODEFILE", nodefile}}, "");
  EXPECT_EQ(a.max_ranks_per_node, 3);
  EXPECT_EQ(a.max_ranks_source, "PBS_NODEFILE=" + nodefile);

  const std::string hostfile = testing::TempDir() + "/hosts_slots";
  std::ofstream(hostfile) << "# hosts\na slots=4\nb\tslots=2 max_slots=8\n";
  a = DetectAllocation({}, hostfile);
  EXPECT_EQ(a.max_ranks_per_node, 2);
  EXPECT_EQ(a.max_ranks_source, "--hostfile " + hostfile);
  std::ofstream(hostfile) << "a:3\nb:5\na:1\n";
  EXPECT_EQ(DetectAllocation({}, hostfile).max_ranks_per_node, 4);  // a: 3 + 1
  std::ofstream(hostfile) << "a slots=4\nb\n";  // b's slots are its cores, unknown here
  EXPECT_EQ(DetectAllocation({}, hostfile).max_ranks_per_node, 0);

  cpu_set_t cpus;
  ASSERT_EQ(sched_getaffinity(0, sizeof(cpus), &cpus), 0);
  a = DetectAllocation({}, "");
  EXPECT_EQ(a.max_ranks_per_node, CPU_COUNT(&cpus));
  EXPECT_NE(a.max_ranks_source.find("CPUs"), std::string::npos) << a.max_ranks_source;
}

void Touch(const std::string& path, const std::string& contents = "") {
  MakeDirectories(ParentDirectory(path));
  std::ofstream(path) << contents;
}

TEST(Detect, AcceleratorsFromWhatTheNodeExposes) {
  const std::string root = testing::TempDir() + "/fake-root";
  EXPECT_EQ(DetectAccelerator(root + "-empty").kind, AcceleratorKind::kCpu);
  Touch(root + "/nv/dev/nvidia0");
  Touch(root + "/nv/dev/nvidia1");
  Touch(root + "/nv/dev/nvidiactl");
  Accelerator nv = DetectAccelerator(root + "/nv");
  EXPECT_EQ(nv.kind, AcceleratorKind::kNvidia);
  EXPECT_EQ(nv.count, 2);
  Touch(root + "/amd/dev/kfd");
  Touch(root + "/amd/sys/class/kfd/kfd/topology/nodes/0/properties",
        "cpu_cores_count 64\nsimd_count 0\n");
  Touch(root + "/amd/sys/class/kfd/kfd/topology/nodes/1/properties", "simd_count 440\n");
  Accelerator amd = DetectAccelerator(root + "/amd");
  EXPECT_EQ(amd.kind, AcceleratorKind::kAmd);
  EXPECT_EQ(amd.count, 1);
  Touch(root + "/xpu/sys/class/drm/card0/device/vendor", "0x8086\n");
  Touch(root + "/xpu/sys/class/drm/card0/device/class", "0x038000\n");
  Touch(root + "/xpu/sys/class/drm/card1/device/vendor", "0x8086\n");
  Touch(root + "/xpu/sys/class/drm/card1/device/class", "0x030000\n");  // integrated graphics
  Accelerator xpu = DetectAccelerator(root + "/xpu");
  EXPECT_EQ(xpu.kind, AcceleratorKind::kIntelXpu);
  EXPECT_EQ(xpu.count, 1);
}

TEST(Detect, MpiFlavourFromVersionText) {
  EXPECT_EQ(
      MpiFlavourFromVersion(
          "mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/"),
      MpiFlavour::kOpenMpi);
  EXPECT_EQ(MpiFlavourFromVersion(
                "HYDRA build details:\n    Version:                                 4.0.2"),
            MpiFlavour::kMpich);
  EXPECT_EQ(MpiFlavourFromVersion("Intel(R) MPI Library for Linux* OS, Version 2021.10"),
            MpiFlavour::kMpich);
  EXPECT_EQ(MpiFlavourFromVersion("something else"), MpiFlavour::kNone);
  EXPECT_EQ(DetectMpiFlavour({{"PATH", testing::TempDir() + "/no-mpi-here"}}), MpiFlavour::kNone);
}

// An executable file at `path` (its content is never run: the names decide).
void Executable(const std::string& path) {
  std::ofstream(path) << "#!/bin/sh\nexit 1\n";
  chmod(path.c_str(), 0755);
}

TEST(Detect, LocalMpiLauncherPicksTheFlavoursOwnWhenBothAreInstalled) {
  // Debian with Open MPI and MPICH: mpirun/mpiexec lead (through alternatives) to one of them.
  const std::string root = testing::TempDir() + "/mpi_both";
  std::filesystem::remove_all(root);
  for (const char* dir :
       {"/openmpi", "/mpich", "/bin_openmpi", "/bin_mpich", "/bin_only_hydra", "/bin_none"})
    MakeDirectories(root + dir);
  Executable(root + "/openmpi/orterun");
  Executable(root + "/mpich/mpiexec.hydra");
  for (const char* dir : {"/bin_openmpi", "/bin_mpich"}) {
    Executable(root + dir + "/mpirun.openmpi");
    Executable(root + dir + "/mpiexec.mpich");
  }
  const std::string default_openmpi = root + "/bin_openmpi", default_mpich = root + "/bin_mpich";
  for (const char* name : {"/mpirun", "/mpiexec"}) {
    ASSERT_EQ(symlink((root + "/openmpi/orterun").c_str(), (default_openmpi + name).c_str()), 0);
    ASSERT_EQ(symlink((root + "/mpich/mpiexec.hydra").c_str(), (default_mpich + name).c_str()), 0);
  }
  EXPECT_EQ(LocalMpiLauncher(MpiFlavour::kMpich, {{"PATH", default_openmpi}}), "mpiexec.mpich");
  EXPECT_EQ(LocalMpiLauncher(MpiFlavour::kOpenMpi, {{"PATH", default_openmpi}}), "mpirun");
  EXPECT_EQ(LocalMpiLauncher(MpiFlavour::kMpich, {{"PATH", default_mpich}}), "mpiexec");
  EXPECT_EQ(LocalMpiLauncher(MpiFlavour::kOpenMpi, {{"PATH", default_mpich}}), "mpirun.openmpi");
  // Only Hydra's own name, and no MPI at all: the generic names (which then fail to start).
  ASSERT_EQ(
      symlink((root + "/openmpi/orterun").c_str(), (root + "/bin_only_hydra/mpiexec").c_str()), 0);
  Executable(root + "/bin_only_hydra/mpiexec.hydra");
  EXPECT_EQ(LocalMpiLauncher(MpiFlavour::kMpich, {{"PATH", root + "/bin_only_hydra"}}),
            "mpiexec.hydra");
  EXPECT_EQ(LocalMpiLauncher(MpiFlavour::kMpich, {{"PATH", root + "/bin_none"}}), "mpiexec");
  EXPECT_EQ(LocalMpiLauncher(MpiFlavour::kOpenMpi, {{"PATH", root + "/bin_none"}}), "mpirun");
  EXPECT_EQ(LocalMpiLauncher(MpiFlavour::kNone, {{"PATH", default_openmpi}}), "");
}

TEST(Detect, TimeLeftFromSchedulerOutput) {
  // scontrol show job -o, trimmed; EndTime is local time.
  std::tm tm{};
  strptime("2026-11-29T10:35:39", "%Y-%m-%dT%H:%M:%S", &tm);
  tm.tm_isdst = -1;
  const std::time_t end = std::mktime(&tm);
  const std::string running =
      "JobId=3 JobName=job.sh JobState=RUNNING Reason=None TimeLimit=00:01:00 "
      "StartTime=2026-11-29T10:34:21 EndTime=2026-11-29T10:35:39 Command=/tmp/wt/job.sh";
  EXPECT_DOUBLE_EQ(*SlurmTimeLeft(running, end - 42), 42.0);
  EXPECT_EQ(*SlurmTimeLeft("JobState=COMPLETING Reason=TimeLimit TimeLimit=00:01:00", end), 0.0);
  EXPECT_FALSE(
      SlurmTimeLeft("JobState=RUNNING Reason=None TimeLimit=UNLIMITED EndTime=Unknown", end));
  EXPECT_EQ(*PbsTimeLeft("Job Id: 7.pbs01\n    Resource_List.walltime = 01:00:00\n"
                         "    resources_used.walltime = 00:59:10\n"),
            50.0);
  EXPECT_FALSE(PbsTimeLeft("Job Id: 7.pbs01\n"));
  EXPECT_TRUE(IsBadNodeState("down*"));
  EXPECT_TRUE(IsBadNodeState("drained"));
  EXPECT_FALSE(IsBadNodeState("allocated"));
  EXPECT_FALSE(IsBadNodeState("mixed"));
}

TEST(RankEnvironment, SameNamesWhateverStartedTheRank) {
  RankIdentity ompi = RankIdentityFromEnvironment({{"OMPI_COMM_WORLD_RANK", "3"},
                                                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                                   {"OMPI_COMM_WORLD_SIZE", "4"},
                                                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}},
                                                  "Node7.cluster");
  EXPECT_EQ(ompi.rank, 3);
  EXPECT_EQ(ompi.local_rank, 1);
  EXPECT_EQ(ompi.world_size, 4);
  EXPECT_EQ(ompi.local_world_size, 2);
  EXPECT_EQ(ompi.node, "node7");
  RankIdentity srun = RankIdentityFromEnvironment({{"SLURM_PROCID", "4"},
                                                   {"SLURM_STEP_ID", "0"},
                                                   {"SLURM_LOCALID", "0"},
                                                   {"SLURM_NTASKS", "5"},
                                                   {"SLURM_NODEID", "2"},
                                                   {"SLURM_TASKS_PER_NODE", "2(x2),1"},
                                                   {"SLURMD_NODENAME", "n4"}},
                                                  "vm");
  EXPECT_EQ(srun.rank, 4);
  EXPECT_EQ(srun.world_size, 5);
  EXPECT_EQ(srun.local_world_size, 1);
  EXPECT_EQ(srun.node, "n4");
  RankIdentity hydra = RankIdentityFromEnvironment(
      {{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}},
      "h");
  EXPECT_EQ(hydra.rank, 1);
  EXPECT_EQ(hydra.local_world_size, 2);
  RankIdentity parsed;
  ASSERT_TRUE(ParseRankAnnouncement(RankAnnouncement(srun, 99), &parsed));
  EXPECT_EQ(parsed.rank, 4);
  EXPECT_EQ(parsed.node, "n4");
}

}  // namespace
}  // namespace crucible
