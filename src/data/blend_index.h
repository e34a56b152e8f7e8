// The blend index: for every global sample i, which dataset it comes from and that dataset's
// running sample number. Built by a quota method (Balinski & Young): at step n each dataset d has
// taken c_d samples; those with c_d < (n + 1) w_d may take one more without exceeding their upper
// quota, and of those the one whose next sample is due first ((c_d + 1) / w_d, ties to the lower
// index) takes it. Every prefix then satisfies floor(n w_d) <= c_d(n) <= ceil(n w_d): the
// realised mixture is within one sample of the weights for every dataset at every prefix.
// Megatron's largest-deficit loop scans all D datasets per sample (O(N D)) and can stray by more
// than one sample; here the due-first choice is a tournament tree and the "may take one more"
// release is a calendar ring, O(N log D).
//
// The index is prefix-stable by construction (step n depends only on steps before it), so a
// longer run extends, never changes, a shorter one.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace crucible {

// The shares weights[d] / sum(weights). Every weight must be a positive finite number; a sum
// beyond the range of a double is computed on the weights scaled by a power of two (exact, so the
// shares are those of the ratios), and a share below the smallest normal double (its ratio to
// the other weights cannot be represented) is refused. Throws DataError (65) naming where[d]
// (e.g. "list.txt:3"; "weight <d>" when `where` is empty) and what to do.
std::vector<double> BlendShares(const std::vector<double>& weights,
                                const std::vector<std::string>& where = {});

// weights: as BlendShares takes them. Fills dataset_index[0, n) and dataset_sample[0, n).
// `heartbeat`, when set, is called every few million samples with the samples done.
void BuildBlendIndex(const std::vector<double>& weights, int64_t n, uint16_t* dataset_index,
                     int64_t* dataset_sample,
                     const std::function<void(int64_t)>& heartbeat = nullptr);

struct BlendIndex {
  std::vector<uint16_t> dataset_index;
  std::vector<int64_t> dataset_sample;
  int64_t size() const { return static_cast<int64_t>(dataset_index.size()); }
};

// Cached blend index. `key_text` is the full cache key (content checksums, weights, seq_len, seed,
// tokenizer checksum); the file is <cache_dir>/blend-<xxh3 of key>.index and carries the key and
// an xxh3 of its bytes, both checked on every read. A cached index with at least n samples is
// used (its first n, which prefix stability makes the same); otherwise one process builds it
// (an flock on <file>.lock; others wait and then read it), writes it under a temporary name,
// fsyncs and renames it. The flock dies with its holder, however it ends; the holder removes the
// <file>.tmp.<pid> a killed builder left. A corrupt or foreign cache file is rebuilt. Prints
// phase= lines.
// `asked` says where n came from, for errors ("--samples 5000"; "" = "<n> samples"). Before
// anything is allocated, an index that cannot fit is refused: CheckBlendIndexFits, and before
// building, IoError (74) when the cache folder's filesystem has no room for the file.
BlendIndex LoadOrBuildBlendIndex(const std::string& cache_dir, const std::string& key_text,
                                 const std::vector<double>& weights, int64_t n, bool progress,
                                 const std::string& asked = "");

// The same cache for an index another rule builds (the stages' of staged_blend_index.h): `build`
// fills n samples of `datasets` datasets, calling its heartbeat with the samples done. The key
// must name the rule and everything it reads.
using BlendIndexBuilder =
    std::function<void(int64_t n, uint16_t* dataset_index, int64_t* dataset_sample,
                       const std::function<void(int64_t)>& heartbeat)>;
BlendIndex LoadOrBuildIndex(const std::string& cache_dir, const std::string& key_text,
                            size_t datasets, int64_t n, bool progress, const std::string& asked,
                            const BlendIndexBuilder& build);

// Refuses (UsageError, exit 2, naming `asked` and the sizes) an index of n samples whose build or
// read would need more memory than this process can have: 10 bytes a sample, twice that at the
// peak (the serialised copy while it is written, the file's bytes while it is read), against the
// machine's memory and swap, the address-space limit (ulimit -v) and the cgroup's memory.max.
void CheckBlendIndexFits(int64_t n, const std::string& asked);

// The cache file a key maps to (for tests and `data inspect`).
std::string BlendIndexPath(const std::string& cache_dir, const std::string& key_text);

}  // namespace crucible
