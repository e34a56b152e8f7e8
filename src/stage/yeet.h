// `crucible yeet SRC... --to DIR`: stage a job's files on every node of the allocation
// (docs/launch.md, "Staging files on every node").
//
// The driver (RunYeet, on the launch node) starts one `crucible yeet-rank` per node through the
// same launch commands as `crucible launch` (srun / mpiexec / mpirun). Rank 0 reads the sources
// from the shared filesystem; every rank reports the manifest of what its DIR already holds; the
// files some node lacks are sent once, as one pipelined chunked broadcast (or, with the sbcast
// transport, as one file landed on every node by Slurm's sbcast). Each node builds
// DIR.partial-<id> (unchanged files hard-linked from its DIR, the rest hashed as they are
// written), checks every file against the manifest, unpacks the archives, and swaps the tree in
// by rename. Hashes are remembered in WORK_DIR/cache (HashCache), so a re-run reads only what
// changed. Each rank leaves "done <node>
// <manifest hash>" (or "failed <node> <reason>") in the driver's status folder, so the driver
// knows per node even when the MPI job dies. Nodes that did not finish are retried one by one
// (a job on that node alone, reading the sources itself), then the success floor is applied.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "launch/environment.h"

namespace crucible {

// Exit code of a yeet whose successful nodes fall short of the floor.
inline constexpr int kExitYeetFloor = 1;

struct YeetOptions {
  std::vector<std::string> sources;
  std::string destination;  // may hold %N (the node's name)
  std::string nodes;        // a host list ("n[1-3]"); empty: the allocation's nodes
  std::string hostfile;
  std::vector<std::string> exclude_files;  // hosts to leave out (crucible launch's format)
  std::string mpi = "auto";
  std::string transport = "mpi";  // how the bytes travel: "mpi" (broadcast) or "sbcast" (Slurm)
  int retries = 2;
  double backoff_seconds = 2;  // before retry k: backoff x 2^(k-1), at most 60 s
  std::optional<double> min_success_fraction;
  std::optional<int> min_success_nodes;
  std::string work_dir = "runs/yeet";  // status folders and logs, on the shared filesystem
  std::string failed_hosts;            // default: WORK_DIR/failed_hosts.txt
  std::string summary;                 // JSON summary; empty: none
  double timeout_seconds = 600;        // a silent job is killed after this long
  size_t chunk_bytes = size_t{4} << 20;
  std::string crucible_path;  // empty: this executable
};

struct YeetResult {
  int exit_code = 0;
  std::vector<std::string> nodes_ok, nodes_failed;
  std::string failed_hosts_path;
};

// Throws UsageError (exit 2) for bad options, DataError (65) for an unsafe archive.
YeetResult RunYeet(const YeetOptions& options, const Environment& env);

// The rank side (crucible yeet-rank): one per node.
struct YeetRankOptions {
  std::vector<std::string> sources;  // absolute
  std::string destination;           // with %N unexpanded
  std::string status_dir;         // each rank writes "done|failed <node> ..." to STATUS_DIR/<node>
  std::string stats_path;         // rank 0's byte counts and phase times (JSON); empty: none
  std::string transport = "mpi";  // or "sbcast" (Slurm only)
  std::string cache_dir;          // shared folder of remembered hashes (HashCache); empty: none
  double started_at = 0;  // when the driver started the job (epoch seconds); 0: no launch phase
  std::string yeet_id;
  int attempt = 1;
  size_t chunk_bytes = size_t{4} << 20;
  double timeout_seconds = 600;
};
int RunYeetRank(const YeetRankOptions& options);

// The test switch CRUCIBLE_YEET_FAIL ("n2:1,n3:always"): whether `node`'s rank fails on try
// `attempt` (1-based). Throws UsageError for a malformed value.
bool YeetFailureInjected(const std::string& spec, const std::string& node, int attempt);

}  // namespace crucible
