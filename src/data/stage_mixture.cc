#include "data/stage_mixture.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "data/staged_blend_index.h"

namespace crucible {

std::vector<StageMixtureReport> RealisedStageMixtures(const BlendedDataset& blend) {
  std::vector<StageMixtureReport> reports;
  const std::vector<BlendStage>& stages = blend.stages();
  for (size_t k = 0; k < stages.size(); ++k) {
    const BlendStage& stage = stages[k];
    StageMixtureReport report;
    report.stage = static_cast<int>(k + 1);
    report.name = stage.options.name;
    report.first_sample = stage.first_sample;
    report.samples = stage.options.samples;
    report.anneal_samples = stage.options.anneal_samples;
    const std::vector<double> no_previous(stage.shares.size(), 0.0);
    const std::vector<double>& previous = k > 0 ? stages[k - 1].shares : no_previous;
    std::map<int, size_t> row_of;  // dataset -> its row
    auto add_row = [&](int d, const std::string& corpus) {
      if (row_of.count(d)) return;
      row_of[d] = report.datasets.size();
      StageDatasetMixture row;
      row.dataset = d;
      row.corpus = corpus;
      row.weight = stage.shares[d];
      row.previous_weight = previous[d];
      report.datasets.push_back(row);
    };
    for (size_t i = 0; i < stage.entries.size(); ++i)
      add_row(stage.datasets[i], stage.entries[i].corpus);
    if (report.anneal_samples > 0)
      for (size_t i = 0; i < stages[k - 1].entries.size(); ++i)
        add_row(stages[k - 1].datasets[i], stages[k - 1].entries[i].corpus);
    const int64_t anneal = report.anneal_samples;
    // The target of the first n samples of a part: the interpolated one in the anneal, n x the
    // weight after it.
    auto target = [&](const StageDatasetMixture& row, bool in_anneal, int64_t n) {
      return in_anneal ? AnnealTarget(row.previous_weight, row.weight, anneal, n)
                       : static_cast<double>(n) * row.weight;
    };
    auto error = [&](StageDatasetMixture& row, bool in_anneal, int64_t count, int64_t n) {
      const double deviation = std::abs(static_cast<double>(count) - target(row, in_anneal, n));
      double& worst = in_anneal ? row.anneal_max_error : row.max_error;
      worst = std::max(worst, deviation);
    };
    for (int64_t i = 0; i < report.samples; ++i) {
      const bool in_anneal = i < anneal;
      const int64_t n = in_anneal ? i : i - anneal;  // samples of the part before this one
      auto it = row_of.find(blend.Origin(report.first_sample + i).dataset);
      if (it == row_of.end()) continue;  // cannot happen: the index draws from these only
      StageDatasetMixture& row = report.datasets[it->second];
      int64_t& count = in_anneal ? row.anneal_taken : row.taken;
      error(row, in_anneal, count, n);
      ++count;
      error(row, in_anneal, count, n + 1);
    }
    for (StageDatasetMixture& row : report.datasets) {
      if (anneal > 0) error(row, true, row.anneal_taken, anneal);
      error(row, false, row.taken, report.samples - anneal);
    }
    reports.push_back(std::move(report));
  }
  return reports;
}

}  // namespace crucible
