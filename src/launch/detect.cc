#include "launch/detect.h"

#include <dirent.h>
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"
#include "launch/hostlist.h"
#include "launch/process.h"

namespace crucible {
namespace {

std::string Get(const Environment& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() ? "" : it->second;
}

std::vector<std::string> ListDirectory(const std::string& path) {
  std::vector<std::string> names;
  DIR* dir = opendir(path.c_str());
  if (!dir) return names;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') names.push_back(entry->d_name);
  }
  closedir(dir);
  return names;
}

std::string ReadSmallFile(const std::string& path) {
  try {
    return Trim(ReadConfigFile(path));
  } catch (const Error&) {
    return "";
  }
}

bool IsNumber(std::string_view text) {
  if (text.empty()) return false;
  for (char c : text)
    if (c < '0' || c > '9') return false;
  return true;
}

// A count of slots or CPUs: 1 to 1000000, else 0 (not a count).
int SmallCount(std::string_view text) {
  if (!IsNumber(text) || text.size() > 7) return 0;
  const int count = std::stoi(std::string(text));
  return count <= 1000000 ? count : 0;
}

// SLURM_JOB_CPUS_PER_NODE ("72(x2),36"): the CPUs of the smallest node; 0 when unreadable.
int LeastSlurmCpus(std::string_view value) {
  int least = 0;
  for (const std::string& entry : Split(value, ',')) {
    const int cpus = SmallCount(entry.substr(0, entry.find('(')));
    if (cpus == 0) return 0;
    least = least == 0 ? cpus : std::min(least, cpus);
  }
  return least;
}

// A hostfile's slots per node, as Open MPI ("host slots=N") or Hydra ("host:N") writes them,
// summed over a host's lines: the smallest host's. 0 when a line states no count (a bare host
// name means its cores to Open MPI, unknown here).
int LeastHostFileSlots(const std::string& text) {
  std::vector<std::pair<std::string, int>> slots;  // in file order
  for (const std::string& raw : Split(text, '\n')) {
    const std::string line = Trim(raw.substr(0, raw.find('#')));
    if (line.empty()) continue;
    const size_t end = line.find_first_of(" \t:");
    const std::string host = line.substr(0, end);
    int count = 0;
    if (end != std::string::npos && line[end] == ':') {
      count = SmallCount(Trim(line.substr(end + 1)));
    } else {
      std::string fields = line;
      std::replace(fields.begin(), fields.end(), '\t', ' ');
      for (const std::string& field : Split(fields, ' '))
        if (StartsWith(field, "slots=")) count = SmallCount(field.substr(6));
    }
    if (count == 0) return 0;
    auto it =
        std::find_if(slots.begin(), slots.end(), [&](const auto& s) { return s.first == host; });
    if (it == slots.end())
      slots.emplace_back(host, count);
    else
      it->second += count;
  }
  int least = 0;
  for (const auto& [host, count] : slots) least = least == 0 ? count : std::min(least, count);
  return least;
}

// The CPUs this process may run on (what `nproc` prints).
int LocalCpuCount() {
  cpu_set_t cpus;
  if (sched_getaffinity(0, sizeof(cpus), &cpus) == 0) return CPU_COUNT(&cpus);
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 0;
}

// "HH:MM:SS" (or "MM:SS", or plain seconds) -> seconds.
std::optional<double> ParseClock(std::string_view text) {
  double total = 0;
  for (const std::string& part : Split(Trim(text), ':')) {
    if (!IsNumber(part)) return std::nullopt;
    total = total * 60 + std::stod(part);
  }
  return total;
}

// The value of "Key=value" in scontrol's one-line output ("" if absent).
std::string ScontrolField(std::string_view text, const std::string& key) {
  const std::string needle = key + "=";
  size_t pos = 0;
  while ((pos = text.find(needle, pos)) != std::string_view::npos) {
    if (pos == 0 || text[pos - 1] == ' ' || text[pos - 1] == '\n') {
      size_t start = pos + needle.size();
      size_t end = text.find_first_of(" \n", start);
      return std::string(text.substr(start, end == std::string_view::npos ? end : end - start));
    }
    pos += needle.size();
  }
  return "";
}

}  // namespace

const char* SchedulerName(Scheduler scheduler) {
  switch (scheduler) {
    case Scheduler::kSlurm:
      return "slurm";
    case Scheduler::kPbs:
      return "pbs";
    default:
      return "local";
  }
}

const char* MpiFlavourName(MpiFlavour flavour) {
  switch (flavour) {
    case MpiFlavour::kOpenMpi:
      return "openmpi";
    case MpiFlavour::kMpich:
      return "mpich";
    default:
      return "none";
  }
}

const char* AcceleratorName(AcceleratorKind kind) {
  switch (kind) {
    case AcceleratorKind::kNvidia:
      return "nvidia";
    case AcceleratorKind::kAmd:
      return "amd";
    case AcceleratorKind::kIntelXpu:
      return "xpu";
    default:
      return "cpu";
  }
}

Scheduler ParseScheduler(const std::string& name) {
  if (name == "local") return Scheduler::kLocal;
  if (name == "slurm") return Scheduler::kSlurm;
  if (name == "pbs") return Scheduler::kPbs;
  throw UsageError("unknown scheduler '" + name + "' (expected local, slurm or pbs)");
}

MpiFlavour ParseMpiFlavour(const std::string& name) {
  if (name == "openmpi") return MpiFlavour::kOpenMpi;
  if (name == "mpich") return MpiFlavour::kMpich;
  if (name == "none") return MpiFlavour::kNone;
  throw UsageError("unknown MPI flavour '" + name + "' (expected openmpi, mpich or none)");
}

Allocation DetectAllocation(const Environment& env, const std::string& hostfile) {
  Allocation allocation;
  const std::string forced = Get(env, "CRUCIBLE_SCHEDULER");
  const bool pbs_vars = !Get(env, "PBS_JOBID").empty() && !Get(env, "PBS_NODEFILE").empty();
  const std::string slurm_nodelist = !Get(env, "SLURM_JOB_NODELIST").empty()
                                         ? Get(env, "SLURM_JOB_NODELIST")
                                         : Get(env, "SLURM_NODELIST");
  const bool slurm_vars = !Get(env, "SLURM_JOB_ID").empty() && !slurm_nodelist.empty();
  if (!forced.empty()) {
    allocation.scheduler = ParseScheduler(forced);
  } else if (pbs_vars) {
    allocation.scheduler = Scheduler::kPbs;
  } else if (slurm_vars) {
    allocation.scheduler = Scheduler::kSlurm;
  }

  if (allocation.scheduler == Scheduler::kPbs) {
    if (!pbs_vars && hostfile.empty())
      throw UsageError("CRUCIBLE_SCHEDULER=pbs but PBS_JOBID or PBS_NODEFILE is not set");
    allocation.job_id = Get(env, "PBS_JOBID");
    const std::string nodefile = Get(env, "PBS_NODEFILE");
    if (hostfile.empty()) {
      allocation.nodes = ReadHostFile(nodefile);
      allocation.source = "PBS_NODEFILE=" + nodefile;
      // PBS lists a host once per MPI slot (mpiprocs): count the first host's lines.
      int slots = 0;
      for (const std::string& line : Split(ReadFile(nodefile), '\n'))
        if (NormalizeHost(Trim(line)) == NormalizeHost(allocation.nodes[0])) ++slots;
      allocation.slots_per_node = slots;
      allocation.max_ranks_per_node = slots;
      allocation.max_ranks_source = allocation.source;
    }
  } else if (allocation.scheduler == Scheduler::kSlurm) {
    if (!slurm_vars && hostfile.empty())
      throw UsageError(
          "CRUCIBLE_SCHEDULER=slurm but SLURM_JOB_ID or SLURM_JOB_NODELIST is not set");
    allocation.job_id = Get(env, "SLURM_JOB_ID");
    if (hostfile.empty()) {
      allocation.nodes = ExpandHostList(slurm_nodelist);
      allocation.source = "SLURM_JOB_NODELIST=" + slurm_nodelist;
      const std::string per_node = Get(env, "SLURM_NTASKS_PER_NODE");
      const std::string cpus = Get(env, "SLURM_JOB_CPUS_PER_NODE");
      if (SmallCount(per_node) > 0) {
        allocation.slots_per_node = SmallCount(per_node);
        allocation.max_ranks_per_node = allocation.slots_per_node;
        allocation.max_ranks_source = "SLURM_NTASKS_PER_NODE=" + per_node;
      } else if (LeastSlurmCpus(cpus) > 0) {
        allocation.max_ranks_per_node = LeastSlurmCpus(cpus);
        allocation.max_ranks_source = "SLURM_JOB_CPUS_PER_NODE=" + cpus;
      }
    }
  } else if (hostfile.empty()) {
    allocation.nodes = {"localhost"};
    allocation.source = "local";
    allocation.max_ranks_per_node = LocalCpuCount();
    allocation.max_ranks_source = StrFormat("this machine's %d CPUs", LocalCpuCount());
  }
  if (!hostfile.empty()) {
    allocation.nodes = ReadHostFile(hostfile);
    allocation.source = "--hostfile " + hostfile;
    allocation.max_ranks_per_node = LeastHostFileSlots(ReadConfigFile(hostfile));
    allocation.max_ranks_source = allocation.max_ranks_per_node > 0 ? allocation.source : "";
  }
  if (allocation.nodes.empty()) throw UsageError("the allocation has no nodes");
  return allocation;
}

Accelerator DetectAccelerator(const std::string& root) {
  const std::string base = root == "/" ? "" : root;
  Accelerator accelerator;
  int nvidia = 0;
  for (const std::string& name : ListDirectory(base + "/dev"))
    if (StartsWith(name, "nvidia") && IsNumber(name.substr(6))) ++nvidia;
  if (nvidia > 0) return {AcceleratorKind::kNvidia, nvidia};

  if (FileExists(base + "/dev/kfd")) {
    int amd = 0;
    const std::string nodes = base + "/sys/class/kfd/kfd/topology/nodes";
    for (const std::string& node : ListDirectory(nodes)) {
      for (const std::string& line :
           Split(ReadSmallFile(nodes + "/" + node + "/properties"), '\n')) {
        if (StartsWith(line, "simd_count ") && Trim(line.substr(11)) != "0") ++amd;
      }
    }
    if (amd > 0) return {AcceleratorKind::kAmd, amd};
  }

  int xpu = 0;
  const std::string drm = base + "/sys/class/drm";
  for (const std::string& card : ListDirectory(drm)) {
    if (!StartsWith(card, "card") || !IsNumber(card.substr(4))) continue;  // not connectors
    const std::string device = drm + "/" + card + "/device";
    if (ReadSmallFile(device + "/vendor") == "0x8086" &&
        StartsWith(ReadSmallFile(device + "/class"), "0x0380"))
      ++xpu;
  }
  if (xpu > 0) return {AcceleratorKind::kIntelXpu, xpu};
  return accelerator;
}

MpiFlavour MpiFlavourFromVersion(std::string_view version_text) {
  if (version_text.find("Open MPI") != std::string_view::npos ||
      version_text.find("OpenRTE") != std::string_view::npos ||
      version_text.find("prterun") != std::string_view::npos)
    return MpiFlavour::kOpenMpi;
  if (version_text.find("HYDRA") != std::string_view::npos ||
      version_text.find("MPICH") != std::string_view::npos ||
      version_text.find("Intel(R) MPI") != std::string_view::npos ||
      version_text.find("PALS") != std::string_view::npos)
    return MpiFlavour::kMpich;
  return MpiFlavour::kNone;
}

MpiFlavour DetectMpiFlavour(const Environment& env) {
  std::string launcher = FindExecutable("mpirun", env);
  if (launcher.empty()) launcher = FindExecutable("mpiexec", env);
  if (launcher.empty()) return MpiFlavour::kNone;
  return MpiFlavourOfLauncher(launcher);
}

MpiFlavour MpiFlavourOfLauncher(const std::string& launcher) {
  char resolved[PATH_MAX];
  const std::string real = realpath(launcher.c_str(), resolved) ? resolved : launcher;
  const std::string name = real.substr(real.rfind('/') + 1);
  const std::string folder = ParentDirectory(real);
  if (name.find("openmpi") != std::string::npos || name == "orterun" || name == "prterun" ||
      FileExists(JoinPath(folder, "ompi_info")))
    return MpiFlavour::kOpenMpi;
  if (name.find("mpich") != std::string::npos || name.find("hydra") != std::string::npos ||
      FileExists(JoinPath(folder, "hydra_pmi_proxy")))
    return MpiFlavour::kMpich;
  return MpiFlavourFromVersion(RunCapture({launcher, "--version"}, 5.0).output);
}

std::string LocalMpiLauncher(MpiFlavour flavour, const Environment& env) {
  if (flavour == MpiFlavour::kNone) return "";
  const bool openmpi = flavour == MpiFlavour::kOpenMpi;
  const std::string generic = openmpi ? "mpirun" : "mpiexec";
  const std::string on_path = FindExecutable(generic, env);
  // Keep the generic name unless it is missing or positively the other MPI.
  if (!on_path.empty()) {
    const MpiFlavour found = MpiFlavourOfLauncher(on_path);
    if (found == flavour || found == MpiFlavour::kNone) return generic;
  }
  const std::vector<std::string> own =
      openmpi ? std::vector<std::string>{"mpirun.openmpi"}
              : std::vector<std::string>{"mpiexec.mpich", "mpiexec.hydra"};
  for (const std::string& name : own)
    if (!FindExecutable(name, env).empty()) return name;
  return generic;
}

std::optional<double> SlurmTimeLeft(std::string_view text, std::time_t now) {
  if (ScontrolField(text, "Reason") == "TimeLimit" || ScontrolField(text, "JobState") == "TIMEOUT")
    return 0.0;
  const std::string limit = ScontrolField(text, "TimeLimit");
  if (limit.empty() || limit == "UNLIMITED") return std::nullopt;
  const std::string end = ScontrolField(text, "EndTime");
  std::tm tm{};
  if (end.empty() || !strptime(end.c_str(), "%Y-%m-%dT%H:%M:%S", &tm)) return std::nullopt;
  tm.tm_isdst = -1;
  const std::time_t end_time = std::mktime(&tm);
  return std::max(0.0, std::difftime(end_time, now));
}

std::optional<double> PbsTimeLeft(std::string_view text) {
  std::optional<double> limit, used;
  for (const std::string& raw : Split(text, '\n')) {
    std::string line = Trim(raw);
    size_t equals = line.find('=');
    if (equals == std::string::npos) continue;
    std::string key = Trim(line.substr(0, equals)), value = Trim(line.substr(equals + 1));
    if (key == "Resource_List.walltime") limit = ParseClock(value);
    if (key == "resources_used.walltime") used = ParseClock(value);
  }
  if (!limit) return std::nullopt;
  return std::max(0.0, *limit - used.value_or(0.0));
}

std::optional<double> QueryTimeLeft(const Allocation& allocation) {
  if (allocation.job_id.empty()) return std::nullopt;
  if (allocation.scheduler == Scheduler::kSlurm) {
    CaptureResult r = RunCapture({"scontrol", "show", "job", "-o", allocation.job_id}, 10.0);
    if (r.exit_code != 0) return std::nullopt;
    return SlurmTimeLeft(r.output, std::time(nullptr));
  }
  if (allocation.scheduler == Scheduler::kPbs) {
    CaptureResult r = RunCapture({"qstat", "-f", allocation.job_id}, 10.0);
    if (r.exit_code != 0) return std::nullopt;
    return PbsTimeLeft(r.output);
  }
  return std::nullopt;
}

bool IsBadNodeState(std::string_view state) {
  for (const char* bad : {"down", "drain", "fail", "not_responding", "*"})
    if (state.find(bad) != std::string_view::npos) return true;
  return false;
}

std::map<std::string, std::string> QueryNodeStates(const Allocation& allocation,
                                                   const std::vector<std::string>& nodes) {
  std::map<std::string, std::string> states;
  if (allocation.scheduler != Scheduler::kSlurm || nodes.empty()) return states;
  CaptureResult r = RunCapture({"sinfo", "-h", "-N", "-n", JoinHosts(nodes), "-o", "%N %T"}, 10.0);
  if (r.exit_code != 0) return states;
  for (const std::string& line : Split(r.output, '\n')) {
    std::vector<std::string> fields = Split(Trim(line), ' ');
    if (fields.size() >= 2) states[fields[0]] = fields.back();
  }
  return states;
}

std::string QueryBatchScript(const Allocation& allocation) {
  if (allocation.scheduler != Scheduler::kSlurm || allocation.job_id.empty()) return "";
  CaptureResult r = RunCapture({"scontrol", "show", "job", "-o", allocation.job_id}, 10.0);
  if (r.exit_code != 0) return "";
  return ScontrolField(r.output, "Command");
}

}  // namespace crucible
