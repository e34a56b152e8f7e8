// The data loader on a source it can watch: which samples each batch holds, the loss weights a
// weighted source gives, where reading stops, and a failure of the background read.
#include "data/loader.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <string>

#include "common/error.h"

namespace crucible {
namespace {

constexpr int64_t kSeqLen = 4;

// Sample i holds tokens 100 i, 100 i + 1, ...; weights i + t / 10 when weighted; reading sample
// `fail_at` throws a DataError. Counts the samples read.
class CountingSource : public TokenSource {
 public:
  explicit CountingSource(bool weighted, int64_t fail_at = -1)
      : weighted_(weighted), fail_at_(fail_at) {}
  void Sample(int64_t index, int32_t* tokens) const override {
    if (index == fail_at_) throw DataError("sample " + std::to_string(index) + " is damaged");
    ++reads;
    for (int64_t t = 0; t <= kSeqLen; ++t) tokens[t] = static_cast<int32_t>(100 * index + t);
  }
  bool weighted() const override { return weighted_; }
  void SampleWeights(int64_t index, float* weights) const override {
    for (int64_t t = 0; t < kSeqLen; ++t) weights[t] = static_cast<float>(index) + t / 10.0f;
  }
  std::string Describe() const override { return "counting"; }
  mutable std::atomic<int64_t> reads{0};

 private:
  bool weighted_;
  int64_t fail_at_;
};

TEST(DataLoader, ABatchIsTheRankSliceAsInputsAndTargets) {
  CountingSource source(false);
  DataLoader loader(source, kSeqLen, 6, 1, 3, 12);  // rank 1 of 3, from sample 12
  const Batch& batch = loader.Next();
  EXPECT_EQ(batch.first_sample, 14);
  EXPECT_EQ(batch.samples, 2);
  EXPECT_TRUE(batch.loss_weights.empty());
  EXPECT_EQ(batch.loss_weights_at(1), nullptr);
  EXPECT_EQ(batch.inputs_at(1)[0], 1500);  // sample 15
  EXPECT_EQ(batch.inputs_at(1)[kSeqLen - 1], 1503);
  EXPECT_EQ(batch.targets_at(1)[0], 1501);
  EXPECT_EQ(batch.targets_at(1)[kSeqLen - 1], 1504);
  EXPECT_EQ(loader.consumed_samples(), 18);
  EXPECT_EQ(loader.Next().first_sample, 20);
}

TEST(DataLoader, AWeightedSourceGivesOneWeightPerTarget) {
  CountingSource source(true);
  DataLoader loader(source, kSeqLen, 2, 0, 1, 0);
  const Batch& batch = loader.Next();
  ASSERT_EQ(batch.loss_weights.size(), 2u * kSeqLen);
  EXPECT_FLOAT_EQ(batch.loss_weights_at(1)[0], 1.0f);
  EXPECT_FLOAT_EQ(batch.loss_weights_at(1)[3], 1.3f);
  EXPECT_FLOAT_EQ(batch.loss_weights_at(0)[2], 0.2f);
}

TEST(DataLoader, ReadsNothingAtOrPastTheEnd) {
  CountingSource source(false);
  {
    DataLoader loader(source, kSeqLen, 4, 0, 2, 0, 8);  // two batches of 4, this rank reads 2
    loader.Next();
    loader.Next();
    EXPECT_THROW(loader.Next(), std::logic_error);
  }
  EXPECT_EQ(source.reads.load(), 4);  // no prefetch of a third batch
}

TEST(DataLoader, AFailedReadIsRethrownByTheNextThatWantsIt) {
  CountingSource source(false, 5);
  DataLoader loader(source, kSeqLen, 4, 0, 1, 0);
  EXPECT_EQ(loader.Next().first_sample, 0);  // the batch with sample 5 is read meanwhile
  try {
    loader.Next();
    FAIL() << "the damaged sample was not reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitBadData);
    EXPECT_STREQ(e.what(), "sample 5 is damaged");
  }
}

}  // namespace
}  // namespace crucible
