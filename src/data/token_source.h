// Where the trainer's token sequences come from. A source defines sample i for every global
// sample index i as a pure function of (its content, seed, i): the rank layout, the thread count
// and where a run resumed never change which tokens sample i holds, nor their loss weights.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "data/batch_schedule.h"

namespace crucible {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // Writes seq_len + 1 tokens of global sample `index` (inputs are the first seq_len, targets
  // the last seq_len).
  virtual void Sample(int64_t index, int32_t* tokens) const = 0;
  // Whether the source weighs its targets (SFT masks, RL objectives); a pre-training source
  // weighs every target 1 and says false.
  virtual bool weighted() const { return false; }
  // The seq_len loss weights of sample `index`'s targets (any finite value; 0 drops a target
  // from the loss). Called only when weighted().
  virtual void SampleWeights(int64_t index, float* weights) const;
  // Whether a sample may hold several documents packed one after another (SFT packing): then
  // SamplePositions gives each input token's position in its document (0 where one starts), and
  // the model keeps attention inside each document (model/model.h ForwardOptions::positions).
  virtual bool packed() const { return false; }
  // The seq_len positions of sample `index`'s inputs. Called only when packed().
  virtual void SamplePositions(int64_t index, int32_t* positions) const;
  // How many of sample `index`'s seq_len inputs are padding (no document's token); 0 for a
  // source that never pads.
  virtual int64_t SamplePadding(int64_t /*index*/) const { return 0; }
  // Whether SamplePadding can be non-zero (the trainer then reports the padding share).
  virtual bool pads() const { return false; }
  // Sample, SampleWeights (when weighted()) and SamplePositions (when packed()) of one index in
  // one call: what a batch reads. The default makes the three calls; a source that lays a
  // sample out once for all three (SFT) overrides it.
  virtual void SampleAll(int64_t index, int32_t* tokens, float* weights, int32_t* positions) const;
  virtual std::string Describe() const = 0;
};

// Seeded uniform random tokens in [0, vocab_size): for benchmarks and tests.
std::unique_ptr<TokenSource> MakeSyntheticSource(uint64_t seed, int64_t vocab_size,
                                                 int64_t seq_len);
// A flat file of uint16 or uint32 token ids; sample i is the window of seq_len + 1 tokens that
// starts at token (i mod windows) * seq_len. Every id is checked against vocab_size on open.
std::unique_ptr<TokenSource> MakeTokenFileSource(const std::string& path, const std::string& dtype,
                                                 int64_t vocab_size, int64_t seq_len);
// From [training] dataset / dataset_path / token_dtype / data_cache_dir, [model] tokenizer_path
// and [debug] seed, for a run of `steps` steps whose global batches `batches` gives, of samples
// of seq_len + 1 tokens. dataset = "blend" reads a blendcorpus file list of prepared shards and
// indexes batches.SamplesBefore(steps + 1) samples, every sample the run reads (see
// blended_dataset.h and docs/data.md).
// dataset = "sft" reads a .jsonl file of conversations, one per sample (sft/sft_source.h).
// With [[data.stages]] (data/stages.h) the blend is the stages' (each stage's list for its
// steps, BlendOptions::stages): training.dataset must be "blend" and dataset_path empty, and
// `steps` is the stages' total.
std::unique_ptr<TokenSource> MakeTokenSource(const Config& config, int64_t vocab_size,
                                             int64_t seq_len, int64_t steps,
                                             const BatchSchedule& batches);
struct DataStage;
// UsageError unless a config with `stages` reads them as a blend (above); nothing without stages.
void CheckStagedDataset(const Config& config, const std::vector<DataStage>& stages);

}  // namespace crucible
