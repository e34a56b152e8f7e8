// The byte stream `crucible yeet` moves (stage/yeet.h): the files some node lacks, back to back
// in manifest order, read from the sources on rank 0 and written under a node's staged tree on
// every rank, each file hashed as it is written (XXH3 streaming state) and checked against the
// manifest, so nothing is read back. Both transports carry this stream: the MPI broadcast
// (distributed/stream_broadcast.h) and Slurm's sbcast (SbcastStream).
#pragma once

#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "stage/manifest.h"

namespace crucible {

// Writes the files `needed` (indices into `manifest`) as their bytes arrive, under `root`; only
// those in `mine` are written (the others pass by). The first problem (a file that cannot be
// written, a hash that differs) goes to *failure and stops the writing; the stream is still
// consumed to its end.
class StreamWriter {
 public:
  StreamWriter(const Manifest& manifest, const std::vector<size_t>& needed,
               const std::set<size_t>& mine, const std::string& root, std::string* failure);
  ~StreamWriter() { Close(); }
  uint64_t verified_bytes() const { return verified_; }

  void Consume(const char* data, size_t size);
  void Finish();  // after the last byte: the empty files at the end, and the last close

 private:
  void SkipEmpty();  // empty files take no stream bytes: create them as they come up
  void Check(const ManifestEntry& entry);
  void Open();
  void WriteAll(const char* data, size_t size, const ManifestEntry& entry);
  void Close();

  const Manifest& manifest_;
  const std::vector<size_t>& needed_;
  const std::set<size_t>& mine_;
  std::string root_;
  std::string* failure_;
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state_;
  size_t next_ = 0;  // position in needed_
  uint64_t offset_ = 0;
  uint64_t verified_ = 0;
  int fd_ = -1;
};

// Reads the files `needed` from their sources one after another (rank 0); IoError when a source
// shrinks or cannot be read.
class StreamReader {
 public:
  StreamReader(const Manifest& manifest, const std::vector<size_t>& needed)
      : manifest_(manifest), needed_(needed) {}
  ~StreamReader();
  void Produce(char* data, size_t size);

 private:
  const Manifest& manifest_;
  const std::vector<size_t>& needed_;
  size_t next_ = 0;
  uint64_t offset_ = 0;
  int fd_ = -1;
};

// The sbcast transport: rank 0 packs the stream (`total` bytes) into one file beside the
// node-local staged path (Pack), Slurm's sbcast copies it to `staged` on every node of the job
// (Broadcast), and each rank feeds it to its StreamWriter (Unpack).
struct SbcastStream {
  const Manifest& source;
  const std::vector<size_t>& needed;
  uint64_t total;
  size_t chunk_bytes;
  std::string staged;  // the same path on every node (SbcastStagingPath)
  std::string pack() const { return staged + ".pack"; }

  void Pack();
  void Broadcast();  // UsageError when sbcast is not installed, IoError when it fails
  void RemovePack();
  void Unpack(StreamWriter* writer);
};

}  // namespace crucible
