// The manifest of a prepared shard, prefix.manifest.json, written last by `crucible data
// prepare`: the content checksum (xxh3-128) and size of the .bin and .idx, token and document
// counts, the tokenizer's checksum and the input files it was made from. A shard without a
// manifest, or whose files no longer match it, is not used. The blend cache is keyed by the
// manifests' content checksums, never by paths.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace crucible {

struct FileChecksum {
  std::string path;  // as written: the shard files by name (relative to the manifest)
  int64_t bytes = 0;
  std::string xxh3_128;
};

struct ShardManifest {
  FileChecksum bin, idx;
  std::string dtype;  // DtypeName
  int64_t documents = 0;
  int64_t tokens = 0;
  int64_t max_token = -1;
  std::string tokenizer_checksum;
  int64_t vocab_size = 0;
  int64_t eos_id = -1;
  std::vector<FileChecksum> sources;
  // xxh3-128 of the .bin and .idx checksums: what names this shard's content.
  std::string content_checksum;
};

std::string ManifestPath(const std::string& prefix);
std::string ContentChecksum(const std::string& bin_xxh3, const std::string& idx_xxh3);

// Writes prefix.manifest.json atomically.
void WriteManifest(const std::string& prefix, const ShardManifest& manifest);
// Reads prefix.manifest.json. Throws DataError when it is missing (the shard was never
// completed by prepare) or malformed; the message names the file.
ShardManifest ReadManifest(const std::string& prefix);

// Describes an existing .bin/.idx pair (one written by Megatron's preprocess_data.py, say) so it
// can be blended: hashes both files, counts sequences and tokens, finds the largest id (which
// must be below vocab_size). The caller writes it with WriteManifest.
ShardManifest DescribeShard(const std::string& prefix, const std::string& tokenizer_checksum,
                            int64_t vocab_size, int64_t eos_id);

// Re-hashes prefix.bin and prefix.idx and compares them with the manifest; returns one line per
// problem (missing, truncated, size or checksum changed), empty when the shard is intact.
std::vector<std::string> VerifyShard(const std::string& prefix, const ShardManifest& manifest);
// Size-only check (cheap, done on open): same as VerifyShard for missing files and sizes.
std::vector<std::string> CheckShardSizes(const std::string& prefix, const ShardManifest& manifest);

}  // namespace crucible
