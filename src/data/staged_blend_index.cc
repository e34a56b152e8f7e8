#include "data/staged_blend_index.h"

#include <cmath>
#include <limits>
#include <queue>
#include <set>
#include <stdexcept>

#include "common/error.h"
#include "data/blend_index.h"

namespace crucible {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

// The smallest m in [1, n] with L(m) > threshold (strict) or L(m) >= threshold, or n + 1 when
// there is none. L is non-decreasing (its increments are the weights).
int64_t FirstReaching(double from, double to, int64_t n, double threshold, bool strict) {
  auto reaches = [&](int64_t m) {
    const double target = AnnealTarget(from, to, n, m);
    return strict ? target > threshold : target >= threshold;
  };
  int64_t low = 1, high = n + 1;  // the answer lies in [low, high]
  while (low < high) {
    const int64_t middle = low + (high - low) / 2;
    if (reaches(middle))
      high = middle;
    else
      low = middle + 1;
  }
  return low;
}

// The shares of a stage's positive weights, placed over the union (0 elsewhere).
std::vector<double> UnionShares(const std::vector<double>& weights) {
  std::vector<double> positive;
  for (double w : weights)
    if (w > 0) positive.push_back(w);
  const std::vector<double> shares = BlendShares(positive);
  std::vector<double> out(weights.size(), 0.0);
  size_t next = 0;
  for (size_t d = 0; d < weights.size(); ++d)
    if (weights[d] > 0) out[d] = shares[next++];
  return out;
}

}  // namespace

double AnnealTarget(double from, double to, int64_t n, int64_t m) {
  const double x = static_cast<double>(m);
  return x * from + (to - from) * (x * x) / (2.0 * static_cast<double>(n));
}

void BuildAnnealIndex(const std::vector<double>& from, const std::vector<double>& to, int64_t n,
                      uint16_t* dataset_index) {
  const int datasets = static_cast<int>(from.size());
  if (to.size() != from.size() || datasets > 65535)
    throw std::invalid_argument("BuildAnnealIndex: share vectors of different or too many sizes");
  std::vector<int64_t> taken(datasets, 0);
  // Ready datasets by (due time, index); the others by (release slot, index).
  std::set<std::pair<double, int>> ready;
  using Pending = std::pair<int64_t, int>;
  std::priority_queue<Pending, std::vector<Pending>, std::greater<Pending>> pending;
  std::vector<double> due(datasets, kNever);
  // Dataset d's next sample (number taken[d] + 1): released at the first slot s with
  // L(s + 1) > taken, due at the real t with L(t) = taken + 1 (L linear between whole numbers).
  auto schedule = [&](int d) {
    const double count = static_cast<double>(taken[d]);
    const int64_t release = FirstReaching(from[d], to[d], n, count, /*strict=*/true);
    const int64_t m = FirstReaching(from[d], to[d], n, count + 1, /*strict=*/false);
    if (m > n) {
      due[d] = kNever;
    } else {
      const double before = AnnealTarget(from[d], to[d], n, m - 1);
      const double step = AnnealTarget(from[d], to[d], n, m) - before;
      due[d] = static_cast<double>(m - 1) + (step > 0 ? (count + 1 - before) / step : 0.0);
    }
    if (release <= n) pending.push({release - 1, d});
  };
  for (int d = 0; d < datasets; ++d)
    if (from[d] > 0 || to[d] > 0) schedule(d);
  for (int64_t slot = 0; slot < n; ++slot) {
    while (!pending.empty() && pending.top().first <= slot) {
      ready.insert({due[pending.top().second], pending.top().second});
      pending.pop();
    }
    if (ready.empty()) {
      // Only reachable through rounding (the targets of a slot add up to slightly under one):
      // the next dataset to be released takes the slot. Deterministic like the rest.
      if (pending.empty()) throw Error(kExitFailure, "blend: internal error: no dataset is due");
      ready.insert({due[pending.top().second], pending.top().second});
      pending.pop();
    }
    const int d = ready.begin()->second;
    ready.erase(ready.begin());
    dataset_index[slot] = static_cast<uint16_t>(d);
    ++taken[d];
    schedule(d);
  }
}

void BuildStagedBlendIndex(const std::vector<StageMixture>& stages, uint16_t* dataset_index,
                           int64_t* dataset_sample, const std::function<void(int64_t)>& heartbeat) {
  if (stages.empty()) return;
  const size_t datasets = stages.front().weights.size();
  if (datasets == 0 || datasets > 65535)
    throw DataError("blend: the stages name " + std::to_string(datasets) +
                    " datasets together; a blend needs 1 to 65535");
  std::vector<int64_t> taken(datasets, 0);  // each dataset's samples since the run's start
  std::vector<double> previous;
  int64_t at = 0;
  for (size_t k = 0; k < stages.size(); ++k) {
    const StageMixture& stage = stages[k];
    if (stage.weights.size() != datasets || stage.anneal_samples < 0 ||
        stage.anneal_samples > stage.samples || (k == 0 && stage.anneal_samples > 0))
      throw std::invalid_argument("BuildStagedBlendIndex: malformed stage");
    const std::vector<double> shares = UnionShares(stage.weights);
    const int64_t anneal = stage.anneal_samples;
    if (anneal > 0) BuildAnnealIndex(previous, shares, anneal, dataset_index + at);
    for (int64_t i = at; i < at + anneal; ++i) dataset_sample[i] = taken[dataset_index[i]]++;
    // The steady part: the quota method on the stage's own datasets, mapped onto the union.
    std::vector<double> positive;
    std::vector<uint16_t> union_of;
    for (size_t d = 0; d < datasets; ++d) {
      if (stage.weights[d] <= 0) continue;
      positive.push_back(stage.weights[d]);
      union_of.push_back(static_cast<uint16_t>(d));
    }
    const int64_t first = at + anneal, count = stage.samples - anneal;
    BuildBlendIndex(positive, count, dataset_index + first, dataset_sample + first,
                    [&](int64_t done) {
                      if (heartbeat) heartbeat(first + done);
                    });
    for (int64_t i = first; i < first + count; ++i) {
      const uint16_t d = union_of[dataset_index[i]];
      dataset_index[i] = d;
      dataset_sample[i] = taken[d]++;
    }
    at += stage.samples;
    previous = shares;
  }
}

}  // namespace crucible
