#include "train/rank_agreement.h"

#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "common/error.h"
#include "common/hash.h"
#include "common/strings.h"
#include "crucible_version.h"

namespace crucible {
namespace {

// "crucible 0.1.0 (binary xxh3 <32 hex digits>)": the version, and the bits of the executable
// (two builds of one version can differ in their kernels, hence in the training bits).
std::string ThisBinary() {
  std::string hash;
  try {
    hash = HashFileHex("/proc/self/exe");
  } catch (const Error&) {
    hash = "unknown";  // no /proc: the version alone is compared
  }
  return StrFormat("crucible %s (binary xxh3 %s)", CRUCIBLE_VERSION, hash.c_str());
}

[[noreturn]] void Stop(const Communicator& comm, const std::string& rank0_message,
                       const char* what) {
  if (comm.rank() == 0) throw UsageError(rank0_message);
  throw UsageError(
      StrFormat("rank %d: stopped: the ranks %s (rank 0 names the difference)", comm.rank(), what));
}

}  // namespace

std::string NodeLocalPathsAsPattern(const std::string& text) {
  const char* pattern = std::getenv("CRUCIBLE_NODE_LOCAL");
  const char* dir = std::getenv("CRUCIBLE_NODE_LOCAL_DIR");
  const std::string_view from = dir ? dir : "";
  if (!pattern || from.empty() || from == pattern) return text;
  std::string out;
  size_t at = 0;
  for (size_t hit; (hit = text.find(from, at)) != std::string::npos; at = hit + from.size()) {
    const size_t end = hit + from.size();
    const bool whole =
        end == text.size() || text[end] == '/' || text[end] == '"' || text[end] == '\'';
    out.append(text, at, hit - at).append(whole ? std::string_view(pattern) : from);
  }
  return out.append(text, at, std::string::npos);
}

std::string DescribeConfigDifference(const std::string& mine, const std::string& theirs,
                                     int their_rank) {
  const Config a = Config::Parse(mine, "rank 0's config");
  const Config b = Config::Parse(theirs, StrFormat("rank %d's config", their_rank));
  const std::vector<std::string> keys = a.Diff(b);
  if (keys.empty()) return "";
  const std::string& key = keys.front();
  std::string others;  // the other differing keys, by name
  for (size_t i = 1; i < keys.size() && i <= 4; ++i) others += (i > 1 ? ", " : "") + keys[i];
  if (keys.size() > 5) others += ", ...";
  return StrFormat(
      "the ranks got different configs: %s is %s on rank 0 but %s on rank %d%s (every rank must "
      "get the same config file and --set overrides)",
      key.c_str(), FormatConfigValue(a.Value(key)).c_str(), FormatConfigValue(b.Value(key)).c_str(),
      their_rank, others.empty() ? "" : ("; other keys that differ: " + others).c_str());
}

void CheckRanksAgree(const Config& config, const std::string& resume_mode, Communicator& comm) {
  if (comm.size() == 1) return;
  const std::vector<std::string> binaries = comm.AllGatherString(ThisBinary(), "binary check");
  for (int r = 1; r < comm.size(); ++r)
    if (binaries[r] != binaries[0])
      Stop(comm,
           StrFormat("rank %d runs %s but rank 0 runs %s: start every rank with the same crucible "
                     "binary",
                     r, binaries[r].c_str(), binaries[0].c_str()),
           "run different crucible binaries");

  std::string toml = NodeLocalPathsAsPattern(config.ToToml());
  const uint64_t mine[2] = {Hash64(toml.data(), toml.size()),
                            Hash64(resume_mode.data(), resume_mode.size())};
  std::vector<uint64_t> all(2 * comm.size());
  comm.AllGatherU64(mine, all.data(), 2, "config check");
  for (int r = 1; r < comm.size(); ++r) {
    if (all[2 * r] != all[0]) {
      std::string theirs = toml;
      comm.BroadcastString(&theirs, r, "config check");  // rank r's config to everyone
      Stop(comm, DescribeConfigDifference(toml, theirs, r), "got different configs");
    }
    if (all[2 * r + 1] != all[1]) {
      std::string theirs = resume_mode;
      comm.BroadcastString(&theirs, r, "config check");
      Stop(comm,
           StrFormat("the ranks got different --resume: %s on rank 0 but %s on rank %d",
                     resume_mode.c_str(), theirs.c_str(), r),
           "got different --resume");
    }
  }
}

}  // namespace crucible
