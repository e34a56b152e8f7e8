// Helpers for the data tests: a scratch folder, a byte-level encoder standing in for the BPE
// tokenizer (id = byte value, EOS = 256), and shards made from lists of documents.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "common/files.h"
#include "data/prepare.h"

namespace crucible::testing {

class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "crucible-data-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  std::string operator/(const std::string& name) const { return JoinPath(path_, name); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline TokenEncoder ByteEncoder(int64_t vocab_size = 257) {
  TokenEncoder encoder;
  encoder.encode = [](std::string_view text) {
    return std::vector<uint32_t>(reinterpret_cast<const uint8_t*>(text.data()),
                                 reinterpret_cast<const uint8_t*>(text.data()) + text.size());
  };
  encoder.vocab_size = vocab_size;
  encoder.eos_id = 256;
  encoder.checksum = "bytes-v1";
  return encoder;
}

// Writes the documents as a jsonl file and prepares prefix from it with the byte encoder.
inline PrepareResult MakeShard(const std::string& prefix, const std::vector<std::string>& docs) {
  std::string jsonl;
  for (const auto& d : docs) {
    std::string escaped;
    for (char c : d) {
      if (c == '"' || c == '\\') escaped += '\\';
      escaped += c;
    }
    jsonl += "{\"text\": \"" + escaped + "\"}\n";
  }
  AtomicWriteFile(prefix + ".source.jsonl", jsonl);
  PrepareOptions options;
  options.inputs = {prefix + ".source.jsonl"};
  options.output_prefix = prefix;
  options.progress = false;
  return PrepareShard(options, ByteEncoder());
}

// Documents of dataset d: its letter ('a' + d) repeated, then the document number, of varied
// lengths; no other dataset uses that letter.
inline std::vector<std::string> LetterDocs(int dataset, int count, uint64_t seed) {
  std::vector<std::string> docs;
  uint64_t x = seed * 2654435761u + 12345;
  for (int i = 0; i < count; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    docs.push_back(std::string(3 + (x >> 33) % 60, static_cast<char>('a' + dataset)) + " " +
                   std::to_string(i));
  }
  return docs;
}

}  // namespace crucible::testing
