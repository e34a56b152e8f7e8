// BatchSchedule (data/batch_schedule.h) and the DataLoader over one: each step reads the next
// GlobalBatch(step) samples, whatever step the loader starts at.
#include "data/batch_schedule.h"

#include <gtest/gtest.h>

#include <stdexcept>

#include "data/loader.h"
#include "data/token_source.h"

namespace crucible {
namespace {

TEST(BatchSchedule, SamplesAccumulateAcrossStages) {
  const BatchSchedule s({{1, 4}, {3, 8}, {6, 16}});
  EXPECT_EQ(s.GlobalBatch(1), 4);
  EXPECT_EQ(s.GlobalBatch(2), 4);
  EXPECT_EQ(s.GlobalBatch(3), 8);
  EXPECT_EQ(s.GlobalBatch(100), 16);
  EXPECT_EQ(s.SamplesBefore(1), 0);
  EXPECT_EQ(s.SamplesBefore(3), 8);
  EXPECT_EQ(s.SamplesBefore(6), 8 + 24);
  EXPECT_EQ(s.SamplesBefore(8), 8 + 24 + 32);
  EXPECT_EQ(s.MaxGlobalBatch(), 16);
  EXPECT_EQ(BatchSchedule(6).SamplesBefore(5), 24);
  EXPECT_THROW(BatchSchedule({{2, 4}}), std::invalid_argument);
  EXPECT_THROW(BatchSchedule({{1, 4}, {1, 8}}), std::invalid_argument);
  EXPECT_THROW(BatchSchedule({{1, 0}}), std::invalid_argument);
}

TEST(BatchSchedule, ALoaderReadsEachStepsBatchFromAnyStartingStep) {
  const auto source = MakeSyntheticSource(0, 64, 8);
  const BatchSchedule s({{1, 2}, {3, 4}});
  for (int64_t first = 1; first <= 4; ++first) {
    DataLoader loader(*source, 8, s, /*rank=*/1, /*world=*/2, first, 5);
    for (int64_t step = first; step <= 5; ++step) {
      const Batch& b = loader.Next();
      EXPECT_EQ(b.samples, s.GlobalBatch(step) / 2);
      EXPECT_EQ(b.first_sample, s.SamplesBefore(step) + b.samples);  // rank 1's half
      EXPECT_EQ(loader.consumed_samples(), s.SamplesBefore(step + 1));
    }
    EXPECT_THROW(loader.Next(), std::logic_error);  // never past the last step
  }
}

}  // namespace
}  // namespace crucible
