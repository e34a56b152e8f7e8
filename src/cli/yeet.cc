// crucible yeet SRC... --to DIR [options]   (docs/launch.md, "Staging files on every node")
// crucible yeet-rank [options] -- SOURCES...   (hidden: one node's side, started by yeet)
#include "stage/yeet.h"

#include <memory>

#include "cli/command.h"
#include "launch/environment.h"

namespace crucible {
namespace {

// The options `crucible yeet` and `crucible launch --yeet` share.
CommandRun SetupYeet(CLI::App& app) {
  auto o = std::make_shared<YeetOptions>();
  app.add_option("sources", o->sources, "files, folders and archives to stage")->required();
  app.add_option("--to", o->destination,
                 "absolute destination on every node; %N becomes the node's name "
                 "(SLURMD_NODENAME, else the short host name), e.g. /tmp/job-%N")
      ->required();
  app.add_option("--nodes", o->nodes,
                 "host list to stage on, e.g. n[1-4] (default: the allocation's nodes)");
  app.add_option("--hostfile", o->hostfile, "file of hosts to use instead of the allocation's");
  app.add_option("--exclude-file", o->exclude_files,
                 "file of hosts to leave out, one per line (failed_hosts.txt, bad_nodes.txt); "
                 "repeatable");
  app.add_option("--mpi", o->mpi, "MPI flavour: auto, openmpi or mpich (default auto)")
      ->check(CLI::IsMember({"auto", "openmpi", "mpich"}));
  app.add_option("--transport", o->transport,
                 "how the files travel: mpi (a pipelined broadcast between the nodes' ranks) or "
                 "sbcast (Slurm's sbcast; only inside a Slurm allocation) (default mpi)")
      ->check(CLI::IsMember({"mpi", "sbcast"}));
  app.add_option("--retries", o->retries,
                 "retry each node that did not finish up to N times, alone (default 2)");
  app.add_option("--backoff", o->backoff_seconds,
                 "pause before the first retry, doubling each time, at most 60 s (default 2 s)");
  app.add_option("--min-success-fraction", o->min_success_fraction,
                 "succeed when at least this fraction of the nodes is staged (default: all)");
  app.add_option("--min-success-nodes", o->min_success_nodes,
                 "succeed when at least N nodes are staged (default: all)");
  app.add_option("--work-dir", o->work_dir,
                 "shared folder for status files and logs (default runs/yeet)");
  app.add_option("--failed-hosts", o->failed_hosts,
                 "where the failed hosts are written, one per line (default "
                 "WORK_DIR/failed_hosts.txt); crucible launch --exclude-file takes it");
  app.add_option("--summary", o->summary, "write a JSON summary (bytes, nodes, phase times)");
  app.add_option("--timeout", o->timeout_seconds,
                 "kill a staging job that stays silent this long (default 600 s)");
  app.add_option("--chunk-bytes", o->chunk_bytes, "broadcast chunk size (default 4194304)");
  app.footer(
      "Every node ends with an identical tree under DIR: SRC's base name for each source,\n"
      "archives (.tar, .tar.gz, .tgz, .tar.zst) also unpacked into DIR/<name without extension>/.\n"
      "Only files some node lacks are sent (content hashes). Exit: 0 when the success floor is\n"
      "met, 1 when fewer nodes were staged (the failed hosts are in the file), 2 for bad usage,\n"
      "65 for an unsafe archive. Test switch: CRUCIBLE_YEET_FAIL=n2:1,n3:always. See\n"
      "docs/launch.md.");
  return [o]() { return RunYeet(*o, CurrentEnvironment()).exit_code; };
}

CommandRun SetupYeetRank(CLI::App& app) {
  auto o = std::make_shared<YeetRankOptions>();
  app.group("");  // internal: not listed in crucible --help
  app.add_option("sources", o->sources, "absolute sources, after --")->required();
  app.add_option("--to", o->destination, "destination, %N unexpanded")->required();
  app.add_option("--status-dir", o->status_dir, "shared status folder")->required();
  app.add_option("--id", o->yeet_id, "job id (names DIR.partial-<id>)")->required();
  app.add_option("--attempt", o->attempt, "try number of this node (1: the broadcast)");
  app.add_option("--stats", o->stats_path, "rank 0's statistics (JSON)");
  app.add_option("--chunk-bytes", o->chunk_bytes, "broadcast chunk size");
  app.add_option("--timeout", o->timeout_seconds, "collective deadline");
  app.add_option("--transport", o->transport, "mpi or sbcast");
  app.add_option("--cache-dir", o->cache_dir, "shared folder of remembered hashes");
  app.add_option("--started-at", o->started_at, "when the driver started the job (epoch s)");
  return [o]() { return RunYeetRank(*o); };
}

CommandRegistrar yeet_registrar(
    "yeet", "stage files on every node of the allocation: crucible yeet SRC... --to DIR",
    SetupYeet);
CommandRegistrar yeet_rank_registrar("yeet-rank", "one node's side of crucible yeet",
                                     SetupYeetRank);

}  // namespace
}  // namespace crucible
