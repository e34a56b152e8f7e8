// How many global samples each optimizer step reads: a constant global batch, or the stages of
// a batch-size ramp ([training] batch_ramp, resolved by train/training_config.h). Step s reads
// global samples [SamplesBefore(s), SamplesBefore(s) + GlobalBatch(s)): the samples consumed
// accumulate across stages, so which tokens a step trains on stays a pure function of the
// sample index, and a resume point is (step, SamplesBefore(step + 1)).
#pragma once

#include <cstdint>
#include <vector>

namespace crucible {

struct BatchStage {
  int64_t first_step = 1;    // the stage's steps are [first_step, the next stage's first_step)
  int64_t global_batch = 0;  // samples per step over every rank
};

class BatchSchedule {
 public:
  BatchSchedule() : BatchSchedule(1) {}
  explicit BatchSchedule(int64_t global_batch) : stages_{{1, global_batch}} {}
  // The first stage starts at step 1; first steps strictly increase, batches are positive
  // (std::invalid_argument otherwise: the config check states the rule to the user).
  explicit BatchSchedule(std::vector<BatchStage> stages);

  int64_t GlobalBatch(int64_t step) const { return StageOf(step).global_batch; }
  // Samples steps [1, step) read together.
  int64_t SamplesBefore(int64_t step) const;
  int64_t MaxGlobalBatch() const;
  const BatchStage& StageOf(int64_t step) const;
  const std::vector<BatchStage>& stages() const { return stages_; }
  bool constant() const { return stages_.size() == 1; }

 private:
  std::vector<BatchStage> stages_;
};

}  // namespace crucible
