#include "data/batch_schedule.h"

#include <algorithm>
#include <stdexcept>

namespace crucible {

BatchSchedule::BatchSchedule(std::vector<BatchStage> stages) : stages_(std::move(stages)) {
  if (stages_.empty() || stages_[0].first_step != 1)
    throw std::invalid_argument("batch schedule: the first stage must start at step 1");
  for (size_t i = 0; i < stages_.size(); ++i) {
    if (stages_[i].global_batch < 1)
      throw std::invalid_argument("batch schedule: a stage's global batch must be positive");
    if (i > 0 && stages_[i].first_step <= stages_[i - 1].first_step)
      throw std::invalid_argument("batch schedule: stages must start at increasing steps");
  }
}

const BatchStage& BatchSchedule::StageOf(int64_t step) const {
  size_t i = 0;
  while (i + 1 < stages_.size() && stages_[i + 1].first_step <= step) ++i;
  return stages_[i];
}

int64_t BatchSchedule::SamplesBefore(int64_t step) const {
  int64_t samples = 0;
  for (size_t i = 0; i < stages_.size() && stages_[i].first_step < step; ++i) {
    const int64_t end = i + 1 < stages_.size() ? std::min(step, stages_[i + 1].first_step) : step;
    samples += (end - stages_[i].first_step) * stages_[i].global_batch;
  }
  return samples;
}

int64_t BatchSchedule::MaxGlobalBatch() const {
  int64_t largest = 0;
  for (const BatchStage& s : stages_) largest = std::max(largest, s.global_batch);
  return largest;
}

}  // namespace crucible
