// A mixture of experts' load over a training step, and the dead-expert detector.
//
// Each micro-batch's routing (Model::ExpertLoads) is added up over the step, then summed over the
// data-parallel ranks (integers: exact in any order), so every rank layout reports the same
// figures. Per routed layer: the fewest and the most token slots an expert received, as a share of
// the mean (1 = a perfect balance), and the coefficient of variation (population standard
// deviation over the mean) of the experts' loads. They go to metrics.jsonl as
// "expert_load": [{"layer", "min", "max", "cv"}...] and to the progress line as the largest CV
// of any layer (load_cv=).
//
// The detector: an expert that receives no token for [debug] dead_expert_steps consecutive steps
// is named in one warning line (layer, expert, steps), again only after it has received tokens.
// A silent bug of the frozen-parameter kind: a dead expert's weights stop learning while the
// loss looks fine.
#pragma once

#include <cstdint>
#include <vector>

#include "model/model.h"

namespace crucible {

class Communicator;

struct ExpertLoadSummary {
  int layer = -1;
  double min = 0, max = 0, cv = 0;
};

class ExpertLoadMeter {
 public:
  // `dead_steps` 0: no detector. `leader`: this rank logs the warnings.
  ExpertLoadMeter(int64_t dead_steps, bool leader) : dead_steps_(dead_steps), leader_(leader) {}
  void BeginStep();
  void Add(const std::vector<ExpertLoad>& loads);
  // Sums the step's loads over `data_parallel` (every rank calls it), runs the detector and
  // returns each routed layer's summary (empty for a model without routed experts; no
  // collective then either, as every rank's model is the same).
  std::vector<ExpertLoadSummary> FinishStep(Communicator& data_parallel, int64_t step);
  // The step's summed loads, per routed layer and expert (after FinishStep).
  const std::vector<ExpertLoad>& loads() const { return loads_; }

 private:
  int64_t dead_steps_;
  bool leader_;
  std::vector<ExpertLoad> loads_;
  std::vector<std::vector<int64_t>> idle_steps_;  // per layer and expert
};

}  // namespace crucible
