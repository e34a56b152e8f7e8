#include "data/blended_dataset.h"

#include <algorithm>
#include <cmath>
#include <list>
#include <map>
#include <mutex>
#include <numeric>

#include "common/error.h"
#include "common/files.h"
#include "common/log.h"
#include "common/philox.h"
#include "common/strings.h"
#include "common/timer.h"
#include "data/blend_index.h"
#include "data/indexed_dataset.h"
#include "data/staged_blend_index.h"

namespace crucible {
namespace {

constexpr uint64_t kDocumentOrderSalt = 0x646f632d6f726465ULL;  // "doc-orde"
constexpr uint64_t kShuffleSalt = 0x73687566666c6521ULL;        // "shuffle!"

uint64_t Stream(int dataset, int64_t epoch) {
  return (static_cast<uint64_t>(dataset) << 40) |
         (static_cast<uint64_t>(epoch) & ((1ULL << 40) - 1));
}

// One epoch of a shard: its sequences in shuffled order and where each starts in the
// concatenation.
struct EpochTable {
  int64_t epoch = -1;
  std::vector<int64_t> order;
  std::vector<int64_t> start;  // order.size() + 1 entries
};

struct ShardReader {
  std::unique_ptr<IndexedDataset> data;
  std::once_flag verified;
  std::mutex mutex;
  std::list<std::shared_ptr<const EpochTable>> epochs;  // most recently used first
};

}  // namespace

uint64_t ShufflePosition(uint64_t position, uint64_t size, uint64_t seed, uint64_t stream) {
  if (size <= 1) return 0;
  int bits = 64 - __builtin_clzll(size - 1);
  const int half = (bits + 1) / 2;
  const uint64_t mask = (half >= 64) ? ~0ULL : ((1ULL << half) - 1);
  const std::array<uint32_t, 2> key = {static_cast<uint32_t>(seed ^ kShuffleSalt),
                                       static_cast<uint32_t>((seed ^ kShuffleSalt) >> 32)};
  uint64_t x = position;
  do {
    uint64_t left = x >> half, right = x & mask;
    for (uint32_t round = 0; round < 6; ++round) {
      PhiloxBlock block =
          Philox4x32({static_cast<uint32_t>(right), round, static_cast<uint32_t>(stream),
                      static_cast<uint32_t>(stream >> 32)},
                     key);
      const uint64_t f = ((static_cast<uint64_t>(block[1]) << 32) | block[0]) & mask;
      const uint64_t next_right = left ^ f;
      left = right;
      right = next_right;
    }
    x = (left << half) | right;
  } while (x >= size);
  return x;
}

struct BlendedDataset::State {
  BlendOptions options;
  std::vector<BlendedShard> shards;
  std::vector<std::unique_ptr<ShardReader>> readers;
  std::vector<BlendStage> stages;
  BlendIndex index;
  std::string key, path;

  std::shared_ptr<const EpochTable> Epoch(int d, int64_t epoch) const {
    ShardReader& reader = *readers[d];
    std::lock_guard<std::mutex> lock(reader.mutex);
    for (auto it = reader.epochs.begin(); it != reader.epochs.end(); ++it) {
      if ((*it)->epoch == epoch) {
        auto table = *it;
        reader.epochs.erase(it);
        reader.epochs.push_front(table);
        return table;
      }
    }
    auto table = std::make_shared<EpochTable>();
    const IndexedDataset& data = *reader.data;
    const int64_t sequences = data.sequence_count();
    table->epoch = epoch;
    table->order.resize(sequences);
    std::iota(table->order.begin(), table->order.end(), int64_t{0});
    Philox rng(options.seed ^ kDocumentOrderSalt, Stream(d, epoch));
    for (int64_t i = sequences - 1; i > 0; --i)
      std::swap(table->order[i], table->order[rng.NextBelow(static_cast<uint64_t>(i) + 1)]);
    table->start.resize(sequences + 1);
    int64_t offset = 0;
    for (int64_t i = 0; i < sequences; ++i) {
      table->start[i] = offset;
      offset += data.sequence_length(table->order[i]);
    }
    table->start[sequences] = offset;
    reader.epochs.push_front(table);
    if (reader.epochs.size() > 3) reader.epochs.pop_back();
    return table;
  }
};

BlendedDataset::BlendedDataset(std::unique_ptr<State> state) : state_(std::move(state)) {}
BlendedDataset::~BlendedDataset() = default;

namespace {

// Opens and checks one shard of a file list: its files against the manifest, the dtype, the
// tokenizer (the first shard's sets `tokenizer` when the run names none), the vocabulary and its
// size against seq_len. Errors name the list line.
std::pair<BlendedShard, std::unique_ptr<ShardReader>> OpenShard(const FileListEntry& entry,
                                                                const BlendOptions& options,
                                                                std::string* tokenizer,
                                                                std::string* tokenizer_source) {
  const std::string& where = entry.where;
  for (const std::string& file : {BinPath(entry.prefix), IdxPath(entry.prefix)}) {
    const std::string missing = StatFailure(file);
    if (!missing.empty()) throw DataError(where + ": " + file + ": " + missing);
  }
  if (!FileExists(ManifestPath(entry.prefix)))
    throw DataError(where + ": " + entry.prefix + ": unknown corpus file: no " +
                    ManifestPath(entry.prefix) + " (make shards with `crucible data prepare`)");
  BlendedShard shard;
  shard.entry = entry;
  auto reader = std::make_unique<ShardReader>();
  try {
    shard.manifest = ReadManifest(entry.prefix);
    std::vector<std::string> problems = CheckShardSizes(entry.prefix, shard.manifest);
    if (!problems.empty()) throw DataError(problems.front() + " (stale or truncated shard)");
    reader->data = std::make_unique<IndexedDataset>(entry.prefix);
  } catch (const Error& e) {
    throw Error(e.exit_code(), where + ": " + e.what());
  }
  const IndexedDataset& data = *reader->data;
  const ShardManifest& m = shard.manifest;
  if (DtypeName(data.dtype()) != m.dtype)
    throw DataError(StrFormat("%s: %s: dtype mismatch: the index holds %s, the manifest says %s",
                              where.c_str(), IdxPath(entry.prefix).c_str(), DtypeName(data.dtype()),
                              m.dtype.c_str()));
  if (data.total_tokens() != m.tokens || data.document_count() != m.documents)
    throw DataError(
        StrFormat("%s: %s: holds %lld tokens in %lld documents, the manifest says %lld "
                  "in %lld (stale shard)",
                  where.c_str(), IdxPath(entry.prefix).c_str(), (long long)data.total_tokens(),
                  (long long)data.document_count(), (long long)m.tokens, (long long)m.documents));
  if (tokenizer->empty()) {
    *tokenizer = m.tokenizer_checksum;
    *tokenizer_source = where;
  } else if (m.tokenizer_checksum != *tokenizer) {
    throw DataError(StrFormat("%s: %s was tokenized with tokenizer %s, but %s is %s", where.c_str(),
                              entry.prefix.c_str(), m.tokenizer_checksum.c_str(),
                              tokenizer_source->c_str(), tokenizer->c_str()));
  }
  if (options.vocab_size > 0 && m.max_token >= options.vocab_size)
    throw DataError(
        StrFormat("%s: %s: token id %lld does not fit the model's vocab_size %lld "
                  "(vocabulary overflow)",
                  where.c_str(), entry.prefix.c_str(), (long long)m.max_token,
                  (long long)options.vocab_size));
  shard.samples_per_epoch = (data.total_tokens() - 1) / options.seq_len;
  if (shard.samples_per_epoch < 1)
    throw DataError(StrFormat("%s: %s: empty corpus: %lld tokens, fewer than seq_len + 1 = %llu",
                              where.c_str(), entry.prefix.c_str(), (long long)data.total_tokens(),
                              (unsigned long long)options.seq_len + 1));
  return {std::move(shard), std::move(reader)};
}

// A file list's entries and their shares (exit 65 naming the line for a bad weight).
std::vector<double> EntryShares(const std::vector<FileListEntry>& entries) {
  std::vector<double> weights;
  std::vector<std::string> lines;
  for (const auto& e : entries) {
    weights.push_back(e.weight);
    lines.push_back(e.where);
  }
  return BlendShares(weights, lines);
}

std::string CacheFolder(const BlendOptions& options, const std::string& list) {
  return options.cache_dir.empty() ? JoinPath(ParentDirectory(list), ".crucible-cache")
                                   : options.cache_dir;
}

// A stage's file list lines, each with the index of the list it came from (0 for `file_list`): a
// blend of blends' lines reweighted to weight of its list x (weight / its list's sum). Errors as
// ReadFileList's, after the stage's name.
std::vector<std::pair<FileListEntry, size_t>> StageLines(const BlendStageOptions& stage) {
  std::vector<std::pair<FileListEntry, size_t>> lines;
  try {
    if (stage.blends.empty()) {
      for (FileListEntry& entry : ReadFileList(stage.file_list))
        lines.emplace_back(std::move(entry), 0);
      return lines;
    }
    for (size_t k = 0; k < stage.blends.size(); ++k) {
      std::vector<FileListEntry> entries = ReadFileList(stage.blends[k].list);
      double sum = 0;
      for (const FileListEntry& entry : entries) sum += entry.weight;
      if (!std::isfinite(sum))
        throw DataError(stage.blends[k].list + ": the weights add up to " + FormatValue(sum) +
                        "; write them smaller");
      for (FileListEntry& entry : entries) {
        entry.weight = stage.blends[k].weight * (entry.weight / sum);
        lines.emplace_back(std::move(entry), k);
      }
    }
  } catch (const Error& e) {
    throw Error(e.exit_code(), stage.where + ": " + e.what());
  }
  return lines;
}

}  // namespace

std::unique_ptr<BlendedDataset> BlendedDataset::Open(const BlendOptions& options) {
  if (options.seq_len < 1) throw UsageError("blend: seq_len must be at least 1");
  // Before any shard is opened: an index that cannot fit is refused at once.
  CheckBlendIndexFits(options.num_samples, options.samples_from);
  if (!options.stages.empty()) return OpenStaged(options);
  auto state = std::make_unique<State>();
  state->options = options;
  std::vector<FileListEntry> entries = ReadFileList(options.file_list);
  const std::vector<double> shares = EntryShares(entries);
  std::string tokenizer = options.tokenizer_checksum;
  std::string tokenizer_source = "the run's tokenizer";
  for (size_t d = 0; d < entries.size(); ++d) {
    auto [shard, reader] = OpenShard(entries[d], options, &tokenizer, &tokenizer_source);
    shard.share = shares[d];
    state->shards.push_back(std::move(shard));
    state->readers.push_back(std::move(reader));
  }

  std::string key =
      StrFormat("crucible-blend v1\nseq_len=%lld seed=%llu tokenizer=%s\n",
                (long long)options.seq_len, (unsigned long long)options.seed, tokenizer.c_str());
  std::vector<double> weights;
  for (const auto& shard : state->shards) {
    key += StrFormat("weight=%s content=%s\n", FormatDouble(shard.entry.weight).c_str(),
                     shard.manifest.content_checksum.c_str());
    weights.push_back(shard.entry.weight);
  }
  const std::string cache_dir = CacheFolder(options, options.file_list);
  state->key = key;
  state->path = BlendIndexPath(cache_dir, key);
  state->index = LoadOrBuildBlendIndex(cache_dir, key, weights, options.num_samples,
                                       options.progress, options.samples_from);
  return std::unique_ptr<BlendedDataset>(new BlendedDataset(std::move(state)));
}

std::unique_ptr<BlendedDataset> BlendedDataset::OpenStaged(const BlendOptions& options) {
  auto state = std::make_unique<State>();
  state->options = options;
  std::string tokenizer = options.tokenizer_checksum;
  std::string tokenizer_source = "the run's tokenizer";
  std::map<std::string, int> dataset_of_content;  // a shard is one dataset wherever it appears
  int64_t total = 0;
  for (const BlendStageOptions& stage_options : options.stages) {
    BlendStage stage;
    stage.options = stage_options;
    stage.first_sample = total;
    total += stage_options.samples;
    std::map<int, size_t> entry_of;                         // this stage's datasets: their entries
    std::map<std::pair<int, size_t>, std::string> line_of;  // (dataset, list): its line there
    for (auto& [entry, list] : StageLines(stage_options)) {
      auto [shard, reader] = OpenShard(entry, options, &tokenizer, &tokenizer_source);
      const std::string content = shard.manifest.content_checksum;
      auto [it, added] =
          dataset_of_content.emplace(content, static_cast<int>(state->shards.size()));
      if (added) {
        state->shards.push_back(std::move(shard));
        state->readers.push_back(std::move(reader));
      }
      const int d = it->second;
      if (auto [seen, first_in_list] = line_of.emplace(std::pair(d, list), entry.where);
          !first_in_list)
        throw DataError(entry.where + ": " + entry.prefix + " holds the same shard (content " +
                        content + ") as " + seen->second +
                        "; a stage lists each shard once: put the weights together on one line");
      if (auto seen = entry_of.find(d); seen != entry_of.end()) {
        stage.entries[seen->second].weight += entry.weight;  // two lists of a blend of blends
        continue;
      }
      entry_of[d] = stage.entries.size();
      stage.entries.push_back(std::move(entry));
      stage.datasets.push_back(d);
    }
    stage.shares = EntryShares(stage.entries);  // per entry now; per dataset once all are known
    state->stages.push_back(std::move(stage));
  }
  if (total != options.num_samples)
    throw Error(kExitFailure, StrFormat("blend: the stages hold %lld samples, %lld were asked for",
                                        (long long)total, (long long)options.num_samples));
  if (state->shards.size() > 65535)
    throw DataError(
        StrFormat("blend: the stages name %zu shards together; a blend takes at most "
                  "65535",
                  state->shards.size()));

  // The cache key: the rule, and everything the index is a function of (the datasets' contents
  // in order, each stage's samples, anneal and weights), never a path.
  std::string key =
      StrFormat("crucible-staged-blend v1\nseq_len=%lld seed=%llu tokenizer=%s\n",
                (long long)options.seq_len, (unsigned long long)options.seed, tokenizer.c_str());
  for (const auto& shard : state->shards)
    key += "dataset content=" + shard.manifest.content_checksum + "\n";
  std::vector<StageMixture> mixtures;
  for (BlendStage& stage : state->stages) {
    key += StrFormat("stage samples=%lld anneal=%lld\n", (long long)stage.options.samples,
                     (long long)stage.options.anneal_samples);
    StageMixture mixture;
    mixture.samples = stage.options.samples;
    mixture.anneal_samples = stage.options.anneal_samples;
    mixture.weights.assign(state->shards.size(), 0.0);
    std::vector<double> shares(state->shards.size(), 0.0);
    for (size_t i = 0; i < stage.entries.size(); ++i) {
      const int d = stage.datasets[i];
      key += StrFormat("weight=%s dataset=%d\n", FormatDouble(stage.entries[i].weight).c_str(), d);
      mixture.weights[d] = stage.entries[i].weight;
      shares[d] = stage.shares[i];
    }
    stage.shares = shares;
    mixtures.push_back(std::move(mixture));
  }
  const BlendStageOptions& first = options.stages.front();
  const std::string cache_dir =
      CacheFolder(options, first.blends.empty() ? first.file_list : first.blends.front().list);
  state->key = key;
  state->path = BlendIndexPath(cache_dir, key);
  state->index =
      LoadOrBuildIndex(cache_dir, key, state->shards.size(), options.num_samples, options.progress,
                       options.samples_from,
                       [&mixtures](int64_t n, uint16_t* dataset_index, int64_t* dataset_sample,
                                   const std::function<void(int64_t)>& heartbeat) {
                         (void)n;  // the stages' samples, checked above
                         BuildStagedBlendIndex(mixtures, dataset_index, dataset_sample, heartbeat);
                       });
  return std::unique_ptr<BlendedDataset>(new BlendedDataset(std::move(state)));
}

SampleOrigin BlendedDataset::Origin(int64_t index) const {
  if (index < 0 || index >= size())
    throw Error(kExitFailure, StrFormat("blend: sample %lld is outside the index of %lld samples",
                                        (long long)index, (long long)size()));
  SampleOrigin origin;
  origin.dataset = state_->index.dataset_index[index];
  origin.position = state_->index.dataset_sample[index];
  const BlendedShard& shard = state_->shards[origin.dataset];
  origin.epoch = origin.position / shard.samples_per_epoch;
  origin.window = static_cast<int64_t>(
      ShufflePosition(static_cast<uint64_t>(origin.position % shard.samples_per_epoch),
                      static_cast<uint64_t>(shard.samples_per_epoch), state_->options.seed,
                      Stream(origin.dataset, origin.epoch)));
  return origin;
}

void BlendedDataset::Sample(int64_t index, int32_t* tokens) const {
  const SampleOrigin origin = Origin(index);
  const int d = origin.dataset;
  ShardReader& reader = *state_->readers[d];
  std::call_once(reader.verified, [&] {
    const BlendedShard& shard = state_->shards[d];
    Timer timer;
    std::vector<std::string> problems = VerifyShard(shard.entry.prefix, shard.manifest);
    if (!problems.empty()) throw DataError(shard.entry.where + ": " + problems.front());
    if (state_->options.progress)
      PrintLine(StrFormat("phase=verify shard=%s status=ok mb=%.1f seconds=%.3f",
                          shard.entry.prefix.c_str(), shard.manifest.bin.bytes / 1e6,
                          timer.Seconds()));
  });
  const std::shared_ptr<const EpochTable> table = state_->Epoch(d, origin.epoch);
  const int64_t seq_len = state_->options.seq_len;
  const int64_t offset = origin.window * seq_len;
  int64_t i =
      std::upper_bound(table->start.begin(), table->start.end(), offset) - table->start.begin() - 1;
  int64_t within = offset - table->start[i];
  int64_t remaining = seq_len + 1;
  const IndexedDataset& data = *reader.data;
  while (remaining > 0) {
    const int64_t sequence = table->order[i];
    const int64_t take = std::min(remaining, data.sequence_length(sequence) - within);
    data.ReadTokens(sequence, within, take, tokens);
    tokens += take;
    remaining -= take;
    within = 0;
    ++i;
  }
}

std::string BlendedDataset::Describe() const {
  return StrFormat("blend(%s, %zu datasets, %lld samples, index %s)",
                   state_->options.file_list.c_str(), state_->shards.size(), (long long)size(),
                   state_->path.c_str());
}

int64_t BlendedDataset::size() const {
  return state_->index.size();
}
int64_t BlendedDataset::seq_len() const {
  return state_->options.seq_len;
}
const std::vector<BlendedShard>& BlendedDataset::shards() const {
  return state_->shards;
}
const std::vector<BlendStage>& BlendedDataset::stages() const {
  return state_->stages;
}
const std::string& BlendedDataset::cache_key() const {
  return state_->key;
}
const std::string& BlendedDataset::cache_path() const {
  return state_->path;
}

}  // namespace crucible
