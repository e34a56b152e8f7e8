// blendcorpus-style file lists: one dataset per line, `weight prefix corpus`, where prefix names
// a prepared shard (prefix.bin, prefix.idx, prefix.manifest.json; a trailing .bin or .idx is
// accepted and dropped) and corpus groups shards for reporting (defaults to the shard's file
// name). Blank lines and lines starting with '#' are skipped. Relative prefixes are relative to
// the file list's folder. Weights are positive finite numbers; BlendShares (blend_index.h)
// normalises them to sum to one.
#pragma once

#include <string>
#include <vector>

namespace crucible {

struct FileListEntry {
  double weight = 0;   // as written
  std::string prefix;  // resolved path prefix of the shard
  std::string corpus;
  std::string where;  // "list:line", for error messages
};

// Parses a file list. Throws DataError (exit 65) naming the list and line for a malformed line,
// a weight that is not a positive finite number, or an empty list; UsageError if the list itself
// is missing.
std::vector<FileListEntry> ReadFileList(const std::string& path);
// The same on the list's text; `path` names it in errors and anchors relative prefixes.
std::vector<FileListEntry> ParseFileList(const std::string& text, const std::string& path);

}  // namespace crucible
