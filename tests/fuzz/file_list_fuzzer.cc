// libFuzzer target: a blendcorpus file list's text, through ParseFileList, BlendShares and
// BuildBlendIndex, as `crucible data blend` and `crucible train` take it: either entries that
// keep their promises (a positive finite weight, a prefix, a corpus, "list:line") and a blend
// index that keeps the quota method's (blend_check.h), or a crucible::Error; never a crash, a
// hang, an out-of-bounds access or another exception.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "blend_check.h"
#include "common/error.h"
#include "data/file_list.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const std::vector<crucible::FileListEntry> entries =
        crucible::ParseFileList(text, "fuzz/list.txt");
    if (entries.empty() || entries.size() > 65535) __builtin_trap();
    std::vector<double> weights;
    for (const auto& e : entries) {
      if (!(e.weight > 0) || !std::isfinite(e.weight)) __builtin_trap();
      if (e.prefix.rfind("fuzz/", 0) != 0 && e.prefix.rfind("/", 0) != 0) __builtin_trap();
      if (e.where.rfind("fuzz/list.txt:", 0) != 0) __builtin_trap();
      weights.push_back(e.weight);
    }
    crucible::fuzz::CheckBlendIndex(weights, 1000);
  } catch (const crucible::Error&) {
  }
  return 0;
}
