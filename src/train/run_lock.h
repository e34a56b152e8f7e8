// The exclusive lock on a folder a run writes, held by rank 0 of `crucible train` from before it
// writes or replaces anything in the folder until it has written the last file, so two runs can
// never share one folder (checkpoints saved twice, metrics.jsonl interleaved and cut). The run
// directory is locked, and so is the checkpoint folder (checkpoint.folder, which may lie outside
// the run directory: two runs with different job.dump_folder must not save into one).
//
// The lock is flock(2) on <folder>/train.lock: the kernel releases it when its holder exits or
// dies, however it dies, so a later run never waits for a dead one (the launcher's retries start
// the next attempt after the previous job is gone). The file records who holds the lock, as one
// JSON line (host, pid, start time), for the message of a refused run; a record left by a holder
// that died without clearing it is stale, and the next run takes it over and says so. The
// filesystem must support flock (local disks, NFSv4, Lustre mounted with -o flock); where it does
// not, the run warns and goes on without the lock.
#pragma once

#include <string>

namespace crucible {

class RunLock {
 public:
  // Takes the lock of `folder` (which must exist). Throws UsageError naming the folder, the
  // holder and `key`, the config key that gives this run another folder, when another process
  // holds it.
  explicit RunLock(const std::string& folder, const std::string& key = "job.dump_folder");
  // Clears the record and releases the lock.
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace crucible
