#include "data/manifest.h"

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/files.h"
#include "common/hash.h"
#include "common/strings.h"
#include "data/indexed_dataset.h"

namespace crucible {
namespace {

constexpr const char* kFormat = "crucible-shard-manifest";

nlohmann::json FileToJson(const FileChecksum& file) {
  return {{"path", file.path}, {"bytes", file.bytes}, {"xxh3_128", file.xxh3_128}};
}

FileChecksum FileFromJson(const nlohmann::json& j) {
  return {j.at("path").get<std::string>(), j.at("bytes").get<int64_t>(),
          j.at("xxh3_128").get<std::string>()};
}

int64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

}  // namespace

std::string ManifestPath(const std::string& prefix) {
  return prefix + ".manifest.json";
}

std::string ContentChecksum(const std::string& bin_xxh3, const std::string& idx_xxh3) {
  StreamHasher hasher;
  const std::string text = "bin:" + bin_xxh3 + " idx:" + idx_xxh3;
  hasher.Update(text.data(), text.size());
  return hasher.HexDigest128();
}

void WriteManifest(const std::string& prefix, const ShardManifest& m) {
  nlohmann::json sources = nlohmann::json::array();
  for (const auto& s : m.sources) sources.push_back(FileToJson(s));
  nlohmann::json j = {
      {"format", kFormat},
      {"version", 1},
      {"content_checksum", m.content_checksum},
      {"bin", FileToJson(m.bin)},
      {"idx", FileToJson(m.idx)},
      {"dtype", m.dtype},
      {"documents", m.documents},
      {"tokens", m.tokens},
      {"max_token", m.max_token},
      {"tokenizer",
       {{"checksum", m.tokenizer_checksum}, {"vocab_size", m.vocab_size}, {"eos_id", m.eos_id}}},
      {"sources", sources}};
  AtomicWriteFile(ManifestPath(prefix), j.dump(2) + "\n");
}

ShardManifest ReadManifest(const std::string& prefix) {
  const std::string path = ManifestPath(prefix);
  if (!FileExists(path))
    throw DataError(path + ": no manifest: " + prefix +
                    " was not completed by `crucible data prepare` (or is not a prepared shard)");
  ShardManifest m;
  try {
    nlohmann::json j = nlohmann::json::parse(ReadConfigFile(path));
    if (j.at("format").get<std::string>() != kFormat || j.at("version").get<int>() != 1)
      throw DataError(path + ": not a crucible shard manifest (format/version)");
    m.content_checksum = j.at("content_checksum").get<std::string>();
    m.bin = FileFromJson(j.at("bin"));
    m.idx = FileFromJson(j.at("idx"));
    m.dtype = j.at("dtype").get<std::string>();
    m.documents = j.at("documents").get<int64_t>();
    m.tokens = j.at("tokens").get<int64_t>();
    m.max_token = j.at("max_token").get<int64_t>();
    const auto& t = j.at("tokenizer");
    m.tokenizer_checksum = t.at("checksum").get<std::string>();
    m.vocab_size = t.at("vocab_size").get<int64_t>();
    m.eos_id = t.at("eos_id").get<int64_t>();
    for (const auto& s : j.at("sources")) m.sources.push_back(FileFromJson(s));
  } catch (const nlohmann::json::exception& e) {
    throw DataError(path + ": malformed manifest: " + e.what());
  }
  if (m.content_checksum != ContentChecksum(m.bin.xxh3_128, m.idx.xxh3_128))
    throw DataError(path + ": content_checksum does not match the bin/idx checksums (edited?)");
  return m;
}

ShardManifest DescribeShard(const std::string& prefix, const std::string& tokenizer_checksum,
                            int64_t vocab_size, int64_t eos_id) {
  ShardManifest m;
  {
    IndexedDataset data(prefix);
    m.dtype = DtypeName(data.dtype());
    m.documents = data.document_count();  // Megatron's documents, which may span sequences
    m.tokens = data.total_tokens();
    m.max_token = data.MaxToken();
  }
  if (m.max_token >= vocab_size)
    throw DataError(
        StrFormat("%s: token id %lld does not fit the tokenizer's vocabulary of %lld "
                  "(vocabulary overflow)",
                  BinPath(prefix).c_str(), (long long)m.max_token, (long long)vocab_size));
  const std::string base = prefix.substr(prefix.find_last_of('/') + 1);
  m.bin = {base + ".bin", FileSize(BinPath(prefix)), HashFileHex(BinPath(prefix))};
  m.idx = {base + ".idx", FileSize(IdxPath(prefix)), HashFileHex(IdxPath(prefix))};
  m.content_checksum = ContentChecksum(m.bin.xxh3_128, m.idx.xxh3_128);
  m.tokenizer_checksum = tokenizer_checksum;
  m.vocab_size = vocab_size;
  m.eos_id = eos_id;
  return m;
}

std::vector<std::string> CheckShardSizes(const std::string& prefix, const ShardManifest& m) {
  std::vector<std::string> problems;
  for (const auto& [path, file] : {std::pair{BinPath(prefix), &m.bin}, {IdxPath(prefix), &m.idx}}) {
    const int64_t size = FileSize(path);
    if (size < 0) {
      problems.push_back(path + ": missing (the manifest lists it)");
    } else if (size != file->bytes) {
      problems.push_back(StrFormat("%s: %s: %lld bytes, the manifest says %lld", path.c_str(),
                                   size < file->bytes ? "truncated" : "changed after prepare",
                                   (long long)size, (long long)file->bytes));
    }
  }
  return problems;
}

std::vector<std::string> VerifyShard(const std::string& prefix, const ShardManifest& m) {
  std::vector<std::string> problems = CheckShardSizes(prefix, m);
  if (!problems.empty()) return problems;
  for (const auto& [path, file] : {std::pair{BinPath(prefix), &m.bin}, {IdxPath(prefix), &m.idx}}) {
    const std::string actual = HashFileHex(path);
    if (actual != file->xxh3_128)
      problems.push_back(
          StrFormat("%s: corrupted or changed after prepare: xxh3 %s, the manifest "
                    "says %s",
                    path.c_str(), actual.c_str(), file->xxh3_128.c_str()));
  }
  return problems;
}

}  // namespace crucible
