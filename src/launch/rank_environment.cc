#include "launch/rank_environment.h"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/strings.h"
#include "launch/hostlist.h"

namespace crucible {
namespace {

int GetInt(const Environment& env, const char* key, int fallback) {
  auto it = env.find(key);
  if (it == env.end() || it->second.empty()) return fallback;
  char* end = nullptr;
  long value = std::strtol(it->second.c_str(), &end, 10);
  return *end == '\0' ? static_cast<int>(value) : fallback;
}

// SLURM_TASKS_PER_NODE ("2(x3),1") entry for node `index`.
int SlurmTasksOnNode(const std::string& text, int index) {
  int position = 0;
  for (const std::string& item : Split(text, ',')) {
    int count = std::atoi(item.c_str());
    int repeat = 1;
    size_t x = item.find("(x");
    if (x != std::string::npos) repeat = std::atoi(item.c_str() + x + 2);
    if (index < position + repeat) return count;
    position += repeat;
  }
  return -1;
}

}  // namespace

RankIdentity RankIdentityFromEnvironment(const Environment& env, const std::string& hostname) {
  RankIdentity id;
  if (env.count("OMPI_COMM_WORLD_RANK")) {  // Open MPI's mpirun (also under PBS)
    id.rank = GetInt(env, "OMPI_COMM_WORLD_RANK", 0);
    id.local_rank = GetInt(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0);
    id.world_size = GetInt(env, "OMPI_COMM_WORLD_SIZE", 1);
    id.local_world_size = GetInt(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  } else if (env.count("PALS_RANKID")) {  // Cray PALS
    id.rank = GetInt(env, "PALS_RANKID", 0);
    id.local_rank = GetInt(env, "PALS_LOCAL_RANKID", 0);
    id.world_size = GetInt(env, "PMI_SIZE", 1);
    id.local_world_size = GetInt(env, "PALS_LOCAL_SIZE", GetInt(env, "MPI_LOCALNRANKS", 1));
  } else if (env.count("PMI_RANK")) {  // MPICH Hydra
    id.rank = GetInt(env, "PMI_RANK", 0);
    id.local_rank = GetInt(env, "MPI_LOCALRANKID", 0);
    id.world_size = GetInt(env, "PMI_SIZE", 1);
    id.local_world_size = GetInt(env, "MPI_LOCALNRANKS", 1);
  } else if (env.count("SLURM_PROCID") && env.count("SLURM_STEP_ID")) {  // srun
    id.rank = GetInt(env, "SLURM_PROCID", 0);
    id.local_rank = GetInt(env, "SLURM_LOCALID", 0);
    id.world_size = GetInt(env, "SLURM_NTASKS", GetInt(env, "SLURM_NPROCS", 1));
    auto tasks = env.find("SLURM_TASKS_PER_NODE");
    int on_node =
        tasks == env.end() ? -1 : SlurmTasksOnNode(tasks->second, GetInt(env, "SLURM_NODEID", 0));
    id.local_world_size = on_node > 0 ? on_node : 1;
  } else if (env.count("PMIX_RANK")) {
    id.rank = GetInt(env, "PMIX_RANK", 0);
  }
  auto slurm_node = env.find("SLURMD_NODENAME");
  id.node = slurm_node != env.end() && !slurm_node->second.empty() ? slurm_node->second
                                                                   : NormalizeHost(hostname);
  return id;
}

std::string RankAnnouncement(const RankIdentity& id, int pid) {
  return StrFormat("crucible-rank: rank=%d local_rank=%d world=%d node=%s pid=%d", id.rank,
                   id.local_rank, id.world_size, id.node.c_str(), pid);
}

bool ParseRankAnnouncement(std::string_view line, RankIdentity* id) {
  if (!StartsWith(line, "crucible-rank: ")) return false;
  bool has_rank = false, has_node = false;
  for (const std::string& field : Split(line.substr(15), ' ')) {
    size_t equals = field.find('=');
    if (equals == std::string::npos) continue;
    std::string key = field.substr(0, equals), value = field.substr(equals + 1);
    if (key == "rank") has_rank = true, id->rank = std::atoi(value.c_str());
    if (key == "local_rank") id->local_rank = std::atoi(value.c_str());
    if (key == "world") id->world_size = std::atoi(value.c_str());
    if (key == "node") has_node = true, id->node = value;
    if (key == "pid") id->pid = std::atoi(value.c_str());
  }
  return has_rank && has_node;
}

std::string ExpandNodeName(const std::string& pattern, const std::string& node) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char next = i + 1 < pattern.size() ? pattern[i + 1] : '\0';
    if (pattern[i] == '%' && (next == 'N' || next == '%')) {
      out += next == 'N' ? node : "%";
      ++i;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

int ExecRank(const std::vector<std::string>& command) {
  if (command.empty()) {
    std::fprintf(stderr, "crucible launch-rank: error: no command after --\n");
    return 2;
  }
  char hostname[256] = {0};
  gethostname(hostname, sizeof(hostname) - 1);
  const RankIdentity id = RankIdentityFromEnvironment(CurrentEnvironment(), hostname);
  auto set = [](const char* key, const std::string& value) { setenv(key, value.c_str(), 1); };
  for (const char* prefix : {"CRUCIBLE_", ""}) {
    const std::string p = prefix;
    set((p + "RANK").c_str(), std::to_string(id.rank));
    set((p + "LOCAL_RANK").c_str(), std::to_string(id.local_rank));
    set((p + "WORLD_SIZE").c_str(), std::to_string(id.world_size));
    set((p + "LOCAL_WORLD_SIZE").c_str(), std::to_string(id.local_world_size));
  }
  set("CRUCIBLE_NODE", id.node);
  // Die with the parent that started this rank, even a SIGKILLed one. If it died before the
  // request took effect (we were re-parented already), stop here.
  const pid_t parent = getppid();
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) {
    std::fprintf(stderr,
                 "crucible launch-rank: error: the process that started this rank (pid %d) "
                 "has exited\n",
                 static_cast<int>(parent));
    return 1;
  }
  std::string announcement = RankAnnouncement(id, getpid()) + "\n";
  ssize_t ignored = write(2, announcement.data(), announcement.size());
  (void)ignored;
  std::vector<std::string> expanded = command;
  const char* expand = std::getenv("CRUCIBLE_EXPAND_NODE_NAME");
  if (expand && std::string(expand) == "1") {
    for (std::string& arg : expanded) arg = ExpandNodeName(arg, id.node);
    // This node's folder of the staged files, for the trainer's config check.
    if (const char* pattern = std::getenv("CRUCIBLE_NODE_LOCAL"))
      setenv("CRUCIBLE_NODE_LOCAL_DIR", ExpandNodeName(pattern, id.node).c_str(), 1);
  }
  std::vector<char*> args;
  for (const std::string& arg : expanded) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  execvp(args[0], args.data());
  const int error = errno;
  std::fprintf(stderr, "crucible launch-rank: error: cannot run %s: %s\n", command[0].c_str(),
               std::strerror(error));
  return error == ENOENT ? 127 : 126;
}

}  // namespace crucible
