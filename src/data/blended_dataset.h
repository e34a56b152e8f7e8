// A weighted blend of prepared shards, as `crucible train` reads it ([training] dataset = "blend",
// dataset_path = a blendcorpus file list) and `crucible data blend|inspect` report on it.
//
// Sample i of the blend is a pure function of (shards' content, weights, seq_len, seed, i):
//  - the blend index (blend_index.h) says dataset d and its running number p;
//  - dataset d's samples come in epochs of S_d = floor((tokens_d - 1) / seq_len) samples; epoch e
//    concatenates the shard's sequences (documents, each ending in EOS) in an order shuffled by
//    Philox(seed, d, e) and cuts it into windows of seq_len + 1 tokens that overlap by one;
//  - within epoch e, position p mod S_d is mapped to a window through a Philox-keyed Feistel
//    permutation of [0, S_d) (cycle-walking), so the shuffle needs no table and is prefix-stable.
// Nothing depends on the rank layout, the number of samples asked for, or where a run resumed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/file_list.h"
#include "data/manifest.h"
#include "data/token_source.h"

namespace crucible {

// One file list of a blend of blends and its weight (a stage's `blends`, data/stages.h).
struct WeightedFileList {
  std::string list;
  double weight = 0;  // positive, finite; relative to the other lists' (normalised to sum to one)
};

// One stage of a staged blend (data/stages.h, staged_blend_index.h), in samples.
struct BlendStageOptions {
  std::string name;
  std::string file_list;  // the stage's list; only a description when `blends` is not empty
  std::string where;      // names the stage in errors
  int64_t samples = 0;
  int64_t anneal_samples = 0;  // its first this many anneal from the previous stage's mixture
  // A blend of blends: the union of the lists' lines, each weighted
  //   weight of its list x (its weight / the sum of its list's weights);
  // a shard that several lists name is one dataset with their weights added (a list that names
  // it twice is refused, as one `file_list` is). Empty: file_list is the stage's data.
  std::vector<WeightedFileList> blends;
};

struct BlendOptions {
  std::string file_list;  // unused when `stages` is not empty
  // A run in stages: the datasets of every stage's list together (a shard is one dataset
  // wherever it appears, by its content checksum), indexed by staged_blend_index.h; the stages'
  // samples must add up to num_samples.
  std::vector<BlendStageOptions> stages;
  int64_t seq_len = 0;
  uint64_t seed = 0;
  int64_t num_samples = 0;   // how many global samples to index
  std::string samples_from;  // where num_samples came from, for errors ("--samples 5000")
  std::string cache_dir;     // "" = <file list folder>/.crucible-cache
  // The checksum of the tokenizer the run uses ("" = take the shards', which must agree).
  std::string tokenizer_checksum;
  int64_t vocab_size = 0;  // the model's; 0 = do not check token ids against it
  bool progress = true;
};

struct BlendedShard {
  FileListEntry entry;  // in a staged blend, of the first stage that lists it
  ShardManifest manifest;
  double share = 0;  // normalised weight (a staged blend: see BlendStage::shares)
  int64_t samples_per_epoch = 0;
};

// A stage of a staged blend as it was opened.
struct BlendStage {
  BlendStageOptions options;
  int64_t first_sample = 0;  // the stage's samples are [first_sample, + options.samples)
  // Its file list's lines; of a blend of blends, one per dataset (a shard several lists name:
  // the first line naming it, with the weights added), each line's weight the combined one.
  std::vector<FileListEntry> entries;
  std::vector<int> datasets;   // the dataset (of shards()) of each entry
  std::vector<double> shares;  // per dataset of shards(): 0 where it does not list it
};

// Which dataset and which of its samples a global sample is.
struct SampleOrigin {
  int dataset = 0;
  int64_t position = 0;  // the dataset's running sample number
  int64_t epoch = 0;
  int64_t window = 0;  // window in the epoch's concatenation
};

class BlendedDataset : public TokenSource {
 public:
  // Reads the file list (with options.stages, every stage's) and every manifest, opens the
  // shards, checks them (sizes against the manifests, dtype, token ids against vocab_size and
  // the tokenizer checksum), and loads or builds the cached blend index (a staged blend's:
  // staged_blend_index.h). Errors name the list line and the file; bad data exits 65.
  static std::unique_ptr<BlendedDataset> Open(const BlendOptions& options);
  ~BlendedDataset() override;

  // Writes seq_len + 1 tokens of global sample `index` (< size()). The first sample drawn from a
  // shard verifies its .bin/.idx checksums against the manifest (once per process).
  void Sample(int64_t index, int32_t* tokens) const override;
  std::string Describe() const override;

  SampleOrigin Origin(int64_t index) const;
  int64_t size() const;
  int64_t seq_len() const;
  const std::vector<BlendedShard>& shards() const;
  // The stages of a staged blend; empty for one file list.
  const std::vector<BlendStage>& stages() const;
  // The cache key text (what the index depends on) and the cache file.
  const std::string& cache_key() const;
  const std::string& cache_path() const;

  struct State;

 private:
  explicit BlendedDataset(std::unique_ptr<State> state);
  static std::unique_ptr<BlendedDataset> OpenStaged(const BlendOptions& options);
  std::unique_ptr<State> state_;
};

// The Feistel permutation used for the in-epoch shuffle: a bijection of [0, size) for each
// (seed, stream). Exposed for tests.
uint64_t ShufflePosition(uint64_t position, uint64_t size, uint64_t seed, uint64_t stream);

}  // namespace crucible
