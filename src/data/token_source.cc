#include "data/token_source.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>

#include "common/error.h"
#include "common/files.h"
#include "common/philox.h"
#include "common/strings.h"
#include "data/blended_dataset.h"
#include "data/stages.h"
#include "sft/sft_source.h"
#include "tokenizer/tokenizer.h"

namespace crucible {
namespace {

class SyntheticSource : public TokenSource {
 public:
  SyntheticSource(uint64_t seed, int64_t vocab, int64_t seq_len)
      : seed_(seed), vocab_(vocab), seq_len_(seq_len) {}
  void Sample(int64_t index, int32_t* tokens) const override {
    Philox rng(seed_ ^ 0x5eedda7aULL, static_cast<uint64_t>(index));
    for (int64_t t = 0; t <= seq_len_; ++t)
      tokens[t] = static_cast<int32_t>(rng.NextBelow(static_cast<uint64_t>(vocab_)));
  }
  std::string Describe() const override {
    return StrFormat("synthetic(seed=%llu, vocab=%lld)", (unsigned long long)seed_,
                     (long long)vocab_);
  }

 private:
  uint64_t seed_;
  int64_t vocab_, seq_len_;
};

class TokenFileSource : public TokenSource {
 public:
  TokenFileSource(const std::string& path, const std::string& dtype, int64_t vocab, int64_t seq_len)
      : path_(path), seq_len_(seq_len) {
    if (dtype == "uint16") {
      width_ = 2;
    } else if (dtype == "uint32") {
      width_ = 4;
    } else {
      throw UsageError("training.token_dtype: expected uint16 or uint32, got '" + dtype + "'");
    }
    if (path.empty()) throw UsageError("training.dataset_path: empty; name the token file to read");
    if (!FileExists(path))
      throw UsageError(path + ": token file not found (training.dataset_path)");
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) ThrowErrno("cannot open token file " + path);
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      throw DataError(path + ": not a regular file (training.dataset_path)");
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ % width_ != 0) {
      ::close(fd);
      throw DataError(StrFormat("%s: size %zu is not a multiple of %d bytes (token_dtype %s)",
                                path.c_str(), size_, width_, dtype.c_str()));
    }
    count_ = static_cast<int64_t>(size_ / width_);
    if (count_ < seq_len + 1) {
      ::close(fd);
      throw DataError(StrFormat("%s: holds %lld tokens, fewer than seq_len + 1 = %lld",
                                path.c_str(), (long long)count_, (long long)(seq_len + 1)));
    }
    void* map = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) ThrowErrno("cannot map token file " + path);
    data_ = static_cast<const uint8_t*>(map);
    windows_ = (count_ - 1) / seq_len;
    // Every id must fit the model's vocabulary.
    int64_t first_bad = -1;
    for (int64_t i = 0; i < count_ && first_bad < 0; ++i)
      if (static_cast<int64_t>(At(i)) >= vocab) first_bad = i;
    if (first_bad >= 0) {
      uint32_t bad = At(first_bad);
      ::munmap(const_cast<uint8_t*>(data_), size_);
      throw DataError(
          StrFormat("%s: token %u at position %lld is outside the vocabulary [0, %lld) "
                    "(check token_dtype and model.vocab_size)",
                    path.c_str(), bad, (long long)first_bad, (long long)vocab));
    }
  }
  ~TokenFileSource() override { ::munmap(const_cast<uint8_t*>(data_), size_); }

  void Sample(int64_t index, int32_t* tokens) const override {
    int64_t start = (index % windows_) * seq_len_;
    for (int64_t t = 0; t <= seq_len_; ++t) tokens[t] = static_cast<int32_t>(At(start + t));
  }
  std::string Describe() const override {
    return StrFormat("tokens(%s, %lld tokens, %lld windows)", path_.c_str(), (long long)count_,
                     (long long)windows_);
  }

 private:
  uint32_t At(int64_t i) const {
    if (width_ == 2) {
      uint16_t v;
      std::memcpy(&v, data_ + 2 * i, 2);
      return v;
    }
    uint32_t v;
    std::memcpy(&v, data_ + 4 * i, 4);
    return v;
  }
  std::string path_;
  int64_t seq_len_;
  int width_ = 2;
  size_t size_ = 0;
  int64_t count_ = 0, windows_ = 0;
  const uint8_t* data_ = nullptr;
};

}  // namespace

std::unique_ptr<TokenSource> MakeSyntheticSource(uint64_t seed, int64_t vocab_size,
                                                 int64_t seq_len) {
  return std::make_unique<SyntheticSource>(seed, vocab_size, seq_len);
}

void TokenSource::SampleWeights(int64_t, float*) const {
  throw std::logic_error(Describe() + " has no loss weights");
}

void TokenSource::SampleAll(int64_t index, int32_t* tokens, float* weights,
                            int32_t* positions) const {
  Sample(index, tokens);
  if (weighted()) SampleWeights(index, weights);
  if (packed()) SamplePositions(index, positions);
}

void TokenSource::SamplePositions(int64_t, int32_t*) const {
  throw std::logic_error(Describe() + " does not pack documents");
}

std::unique_ptr<TokenSource> MakeTokenFileSource(const std::string& path, const std::string& dtype,
                                                 int64_t vocab_size, int64_t seq_len) {
  return std::make_unique<TokenFileSource>(path, dtype, vocab_size, seq_len);
}

void CheckStagedDataset(const Config& config, const std::vector<DataStage>& stages) {
  if (stages.empty()) return;
  const std::string& kind = config.String("training.dataset");
  if (kind != "blend")
    throw UsageError(
        "[[data.stages]] reads a blend file list per stage, but training.dataset = \"" + kind +
        "\": set training.dataset = \"blend\"");
  if (const std::string& path = config.String("training.dataset_path"); !path.empty())
    throw UsageError("training.dataset_path = \"" + path +
                     "\" and [[data.stages]] both name the data; with stages each stage's list "
                     "is the data: remove training.dataset_path");
}

std::unique_ptr<TokenSource> MakeTokenSource(const Config& config, int64_t vocab_size,
                                             int64_t seq_len, int64_t steps,
                                             const BatchSchedule& batches) {
  const std::string& kind = config.String("training.dataset");
  const std::vector<DataStage> stages = ResolvedDataStages(config, batches, seq_len);
  CheckStagedDataset(config, stages);
  if (kind == "synthetic")
    return MakeSyntheticSource(static_cast<uint64_t>(config.Int("debug.seed")), vocab_size,
                               seq_len);
  if (kind == "tokens")
    return MakeTokenFileSource(config.String("training.dataset_path"),
                               config.String("training.token_dtype"), vocab_size, seq_len);
  if (kind == "blend") {
    BlendOptions options;
    options.file_list = config.String("training.dataset_path");
    if (options.file_list.empty() && stages.empty())
      throw UsageError("training.dataset_path: empty; name the blendcorpus file list to read");
    for (const DataStage& stage : stages) {
      BlendStageOptions o;
      o.name = stage.name;
      o.file_list = stage.list;
      o.blends = stage.blends;
      o.where = stage.where;
      const int64_t before = batches.SamplesBefore(stage.first_step);
      o.samples = batches.SamplesBefore(stage.last_step() + 1) - before;
      o.anneal_samples = batches.SamplesBefore(stage.first_step + stage.anneal_steps) - before;
      options.stages.push_back(o);
    }
    options.seq_len = seq_len;
    options.seed = static_cast<uint64_t>(config.Int("debug.seed"));
    // Every sample the run reads (the memory check has bounded it to a 64-bit count).
    options.num_samples = batches.SamplesBefore(steps + 1);
    options.samples_from =
        !stages.empty() ? StrFormat("the %zu stages of data.stages (%lld steps, %lld samples)",
                                    stages.size(), (long long)steps, (long long)options.num_samples)
        : batches.constant()
            ? StrFormat("training.steps x global batch (%lld x %lld = %lld samples)",
                        (long long)steps, (long long)batches.GlobalBatch(1),
                        (long long)options.num_samples)
            : StrFormat("training.steps %lld of training.batch_ramp (%lld samples)",
                        (long long)steps, (long long)options.num_samples);
    options.cache_dir = config.String("training.data_cache_dir");
    options.vocab_size = vocab_size;
    const std::string& tokenizer_path = config.String("model.tokenizer_path");
    if (!tokenizer_path.empty()) {
      const Tokenizer tokenizer = Tokenizer::Load(tokenizer_path);
      options.tokenizer_checksum = tokenizer.Checksum();
    }
    return BlendedDataset::Open(options);
  }
  if (kind == "sft") return MakeSftSource(config, vocab_size, seq_len);
  throw UsageError("training.dataset: unknown dataset '" + kind +
                   "' (choose synthetic, tokens, blend or sft)");
}

}  // namespace crucible
