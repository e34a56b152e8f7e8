// The realised mixture of each stage of a staged blend (`crucible data inspect --config`, and the
// tests of the promise in staged_blend_index.h): per stage and dataset, what the index took
// against the weights, and the worst deviation at any prefix, computed exactly in O(N + D) (a
// deviation c(n) - target(n) only falls between the dataset's own samples, since the target
// never decreases, so it is extreme just before and just after each of them, and at the ends).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/blended_dataset.h"

namespace crucible {

struct StageDatasetMixture {
  int dataset = 0;     // of BlendedDataset::shards()
  std::string corpus;  // as the stage's list names it (the previous stage's for one annealed out)
  double weight = 0;   // the stage's share; 0 for a dataset only the previous stage lists
  double previous_weight = 0;   // the previous stage's share: where the anneal starts
  int64_t anneal_taken = 0;     // samples in the anneal
  double anneal_max_error = 0;  // max over the anneal's prefixes n of |c(n) - L(n)| (the
                                // cumulative interpolated target)
  int64_t taken = 0;            // samples after the anneal
  double max_error = 0;         // max over the prefixes m after the anneal of |c(m) - m x weight|
};

struct StageMixtureReport {
  int stage = 0;  // from 1
  std::string name;
  int64_t first_sample = 0, samples = 0, anneal_samples = 0;
  std::vector<StageDatasetMixture> datasets;  // the stage's list in order, then any annealed out
};

// Of every stage of `blend` (empty when it is not staged).
std::vector<StageMixtureReport> RealisedStageMixtures(const BlendedDataset& blend);

}  // namespace crucible
