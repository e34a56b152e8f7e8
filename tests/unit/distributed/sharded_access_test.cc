// ZeRO-3's gather buffers (ShardedAccess) on one rank, where a gather is a copy from the shard:
// which unit a gather evicts, that units still cached are not gathered again, and that a buffer
// in use or being filled by a prefetch is never taken.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "distributed/param_access.h"

namespace crucible {
namespace {

// An embedding, `layers` decoder layers and a tail, of different sizes.
ParameterTable ToyTable(int layers) {
  ParameterTable table;
  table.Add("embed", {4, 3}, ParamKind::kEmbedding, -1);
  table.EndUnit();
  for (int l = 0; l < layers; ++l) {
    table.Add("layer" + std::to_string(l) + ".norm", {3}, ParamKind::kNorm, l);
    table.Add("layer" + std::to_string(l) + ".proj", {2, 3}, ParamKind::kLinear, l);
    table.EndUnit();
  }
  table.Add("norm", {3}, ParamKind::kNorm, -1);
  table.Add("head", {4, 3}, ParamKind::kHead, -1);
  table.EndUnit();
  return table;
}

class ShardedAccessTest : public ::testing::Test {
 protected:
  explicit ShardedAccessTest(int layers = 3)
      : table_(ToyTable(layers)),
        comm_(Communicator::OneRank()),
        data_parallel_(*comm_, table_.total(), 3),
        weights_(data_parallel_.shard_size()) {
    for (size_t i = 0; i < weights_.size(); ++i) weights_[i] = static_cast<float>(i);
    access_ = std::make_unique<ShardedAccess>(table_, data_parallel_, weights_.data(),
                                              /*overlap=*/true, nullptr);
    access_->BeginStep();
  }

  // Acquires `unit`, checks that it holds the unit's weights, and returns how many gathers that
  // started (0: it was cached or already being gathered).
  int64_t Acquire(int unit) {
    const int64_t before = access_->gathers_started();
    const float* weights = access_->AcquireWeights(unit);
    held_[unit] = weights;
    ExpectHolds(unit);
    return access_->gathers_started() - before;
  }
  int64_t Prefetch(int unit) {
    const int64_t before = access_->gathers_started();
    access_->Prefetch(unit);
    return access_->gathers_started() - before;
  }
  void Release(int unit) { access_->ReleaseWeights(unit); }
  // The pointer the unit was acquired at still holds its weights.
  void ExpectHolds(int unit) {
    const ParamUnit& u = table_.units()[unit];
    for (size_t i = u.begin; i < u.end; ++i)
      ASSERT_EQ(held_[unit][i - u.begin], weights_[i]) << "unit " << unit << " element " << i;
  }

  ParameterTable table_;
  std::unique_ptr<Communicator> comm_;
  DataParallel data_parallel_;
  std::vector<float> weights_;
  std::unique_ptr<ShardedAccess> access_;
  std::map<int, const float*> held_;
};

TEST_F(ShardedAccessTest, ATiedModelsStepGathersTheLastLayerTheTailAndTheEmbeddingOnce) {
  // The order of model/llama.cc with tied embeddings and 3 layers (units 1-3, tail 4).
  const int tail = table_.tail_unit();
  EXPECT_EQ(Acquire(0), 1);
  EXPECT_EQ(Prefetch(1), 1);
  for (int unit = 1; unit <= 3; ++unit) {
    EXPECT_EQ(Acquire(unit), 0) << unit;  // prefetched
    EXPECT_EQ(Prefetch(unit < 3 ? unit + 1 : tail), 1) << unit;
    Release(unit);
  }
  EXPECT_EQ(Acquire(tail), 0);
  Release(tail);
  Release(0);
  // Backward: the tail, the embedding (the head's weights) and the last layer are still cached.
  EXPECT_EQ(Acquire(tail), 0);
  EXPECT_EQ(Acquire(0), 0);
  EXPECT_EQ(Prefetch(3), 0);
  Release(tail);
  for (int unit = 3; unit >= 1; --unit) {
    EXPECT_EQ(Acquire(unit), 0) << unit;
    if (unit > 1) {
      EXPECT_EQ(Prefetch(unit - 1), 1) << unit;
    }
    ExpectHolds(0);  // the held embedding was never taken
    Release(unit);
  }
  Release(0);
  EXPECT_EQ(access_->gathers_started(), 5 + 2);
  // A new step's parameters differ: everything is gathered again.
  access_->BeginStep();
  EXPECT_EQ(Acquire(tail), 1);
}

TEST_F(ShardedAccessTest, AGatherEvictsTheLeastRecentlyUsedUnit) {
  for (int unit = 0; unit < 3; ++unit) {
    EXPECT_EQ(Acquire(unit), 1);
    Release(unit);
  }
  EXPECT_EQ(Acquire(3), 1);  // evicts unit 0
  Release(3);
  EXPECT_EQ(Acquire(1), 0);
  Release(1);
  EXPECT_EQ(Acquire(0), 1);  // evicts unit 2, now the least recently used
  Release(0);
  EXPECT_EQ(Acquire(3), 0);
  Release(3);
  EXPECT_EQ(Acquire(1), 0);
  Release(1);
  EXPECT_EQ(Acquire(2), 1);
  Release(2);
}

TEST_F(ShardedAccessTest, BuffersInUseAreNeverEvicted) {
  EXPECT_EQ(Acquire(0), 1);
  EXPECT_EQ(Prefetch(1), 1);
  EXPECT_EQ(Acquire(1), 0);
  EXPECT_EQ(Prefetch(2), 1);
  // Two buffers in use, the third being filled: a further prefetch is dropped, not a victim.
  EXPECT_EQ(Prefetch(3), 0);
  EXPECT_EQ(Acquire(2), 0);
  ExpectHolds(0);
  ExpectHolds(1);
  // Every buffer in use: nothing may be evicted.
  EXPECT_THROW(access_->AcquireWeights(3), Error);
  Release(1);
  EXPECT_EQ(Acquire(3), 1);  // takes unit 1's buffer, the only one free
  ExpectHolds(0);
  ExpectHolds(2);
}

TEST_F(ShardedAccessTest, APrefetchedUnitIsNotEvictedWhileAnotherBufferIsFree) {
  EXPECT_EQ(Prefetch(1), 1);
  EXPECT_EQ(Acquire(2), 1);
  Release(2);
  EXPECT_EQ(Acquire(3), 1);
  Release(3);
  // Unit 1's prefetch is the least recent use, but its buffer is still being filled: unit 2 goes.
  EXPECT_EQ(Acquire(table_.tail_unit()), 1);
  Release(table_.tail_unit());
  EXPECT_EQ(Acquire(1), 0);
  Release(1);
  EXPECT_EQ(Acquire(3), 0);
  Release(3);
  EXPECT_EQ(Acquire(2), 1);
}

TEST_F(ShardedAccessTest, TheShardsGradientIsTheSumOfTheUnitsGradients) {
  // Two micro-batches: each unit's gradient is its flat indices scaled by the micro-batch.
  for (int micro_batch = 1; micro_batch <= 2; ++micro_batch) {
    for (int unit = table_.tail_unit(); unit >= 0; --unit) {
      const ParamUnit& u = table_.units()[unit];
      float* grads = access_->Gradients(unit);
      for (size_t i = u.begin; i < u.end; ++i)
        grads[i - u.begin] = static_cast<float>(micro_batch) * static_cast<float>(i) / 8;
      access_->GradientsReady(unit);
    }
  }
  std::vector<float> grad_shard(data_parallel_.shard_size(), -1.0f);
  access_->FinishStep(grad_shard.data());
  for (size_t i = 0; i < table_.total(); ++i)
    ASSERT_EQ(grad_shard[i], 3.0f * static_cast<float>(i) / 8) << i;
}

}  // namespace
}  // namespace crucible
