#include "train/expert_load.h"

#include <algorithm>
#include <cmath>

#include "common/log.h"
#include "common/strings.h"
#include "distributed/communicator.h"

namespace crucible {

void ExpertLoadMeter::BeginStep() {
  for (ExpertLoad& layer : loads_) std::fill(layer.tokens.begin(), layer.tokens.end(), 0);
}

void ExpertLoadMeter::Add(const std::vector<ExpertLoad>& loads) {
  if (loads_.empty()) loads_ = loads;
  else
    for (size_t l = 0; l < loads.size(); ++l)
      for (size_t e = 0; e < loads[l].tokens.size(); ++e)
        loads_[l].tokens[e] += loads[l].tokens[e];
}

std::vector<ExpertLoadSummary> ExpertLoadMeter::FinishStep(Communicator& data_parallel,
                                                           int64_t step) {
  std::vector<ExpertLoadSummary> summaries;
  if (loads_.empty()) return summaries;
  std::vector<int64_t> flat;
  for (const ExpertLoad& layer : loads_) flat.insert(flat.end(), layer.tokens.begin(), layer.tokens.end());
  data_parallel.AllReduceInt64(flat.data(), flat.size(), "expert-load all-reduce");
  size_t at = 0;
  idle_steps_.resize(loads_.size());
  for (size_t l = 0; l < loads_.size(); ++l) {
    std::vector<int64_t>& tokens = loads_[l].tokens;
    std::copy_n(flat.data() + at, tokens.size(), tokens.data());
    at += tokens.size();
    const double E = static_cast<double>(tokens.size());
    double sum = 0, squares = 0;
    for (int64_t t : tokens) sum += static_cast<double>(t);
    const double mean = sum / E;
    for (int64_t t : tokens) squares += (static_cast<double>(t) - mean) * (static_cast<double>(t) - mean);
    ExpertLoadSummary& s = summaries.emplace_back();
    s.layer = loads_[l].layer;
    const auto [lo, hi] = std::minmax_element(tokens.begin(), tokens.end());
    s.min = mean > 0 ? static_cast<double>(*lo) / mean : 0;
    s.max = mean > 0 ? static_cast<double>(*hi) / mean : 0;
    s.cv = mean > 0 ? std::sqrt(squares / E) / mean : 0;
    std::vector<int64_t>& idle = idle_steps_[l];
    idle.resize(tokens.size(), 0);
    for (size_t e = 0; e < tokens.size(); ++e) {
      idle[e] = tokens[e] == 0 ? idle[e] + 1 : 0;
      if (dead_steps_ > 0 && idle[e] == dead_steps_ && leader_)
        LogWarn(StrFormat(
            "dead expert: layer %d expert %zu received no token for %lld steps (step %lld); its "
            "weights do not learn (check the router, its balance bias and "
            "model.bias_update_speed)",
            s.layer, e, (long long)dead_steps_, (long long)step));
    }
  }
  return summaries;
}

}  // namespace crucible
