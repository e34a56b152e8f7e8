// `crucible data prepare`: text or jsonl files -> one Megatron .bin/.idx shard with a manifest.
// Each document is encoded (in parallel, in batches, output in input order) and followed by
// EOS. The shard is written under temporary names and renamed; the manifest is written last, and
// an older manifest of the same prefix is removed first, so an interrupted prepare never leaves
// a shard that looks complete.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "data/manifest.h"

namespace crucible {

// What prepare needs from a tokenizer; Encode must be safe to call from several threads.
struct TokenEncoder {
  std::function<std::vector<uint32_t>(std::string_view)> encode;
  int64_t vocab_size = 0;
  int64_t eos_id = -1;
  std::string checksum;
};

struct PrepareOptions {
  std::vector<std::string> inputs;
  std::string output_prefix;
  std::string format = "auto";      // auto (by extension: .jsonl/.json are jsonl), text, jsonl
  std::string json_field = "text";  // jsonl: the field holding a document's text
  std::string split = "file";       // text: a document is a file, a paragraph or a line
  bool progress = true;             // phase= lines on stdout (and a bar when stderr is a tty)
};

struct PrepareResult {
  ShardManifest manifest;
  int64_t input_bytes = 0;
  int64_t skipped_empty = 0;
  double seconds = 0;
};

// Throws DataError (exit 65) for unreadable or malformed input (naming file and line), an empty
// corpus, or a token id outside the vocabulary; nothing is left under the output prefix then.
PrepareResult PrepareShard(const PrepareOptions& options, const TokenEncoder& encoder);

}  // namespace crucible
