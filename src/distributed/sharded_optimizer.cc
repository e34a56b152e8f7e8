#include "distributed/sharded_optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/error.h"

namespace crucible {

void ShardedOptimizer::MakeFullState() {
  full_ = std::make_unique<OptimizerShard>(config_, table_, 0, table_.total());
  ReleaseFullState();
}

void ShardedOptimizer::ReleaseFullState() {
  if (full_)
    for (const ShardState& state : full_->State()) std::vector<float>().swap(state.values);
}

std::vector<double> ShardedOptimizer::ReduceMetrics() {
  const std::vector<OptimizerMetric> specs = config_.optimizer->metrics();
  if (specs.empty()) return {};
  const std::vector<double>& mine = local_->metric_accumulators();
  Communicator& comm = data_parallel_.comm();
  const size_t ranks = static_cast<size_t>(comm.size()), width = 2 * specs.size();
  std::vector<double> all(ranks * width);
  comm.AllGatherDouble(mine.data(), all.data(), width, "optimizer-metrics all-gather");
  std::vector<double> values(specs.size());
  for (size_t j = 0; j < specs.size(); ++j) {
    double a = all[2 * j], b = all[2 * j + 1];
    for (size_t q = 1; q < ranks; ++q) {  // rank order
      const double x = all[q * width + 2 * j], y = all[q * width + 2 * j + 1];
      if (specs[j].reduce == OptimizerMetric::kMean) {
        a += x;
        b += y;
      } else {
        a = specs[j].reduce == OptimizerMetric::kMin ? std::min(a, x) : std::max(a, x);
      }
    }
    values[j] = specs[j].reduce == OptimizerMetric::kMean ? a / b : a;
  }
  return values;
}

FlatRangeOptimizer::FlatRangeOptimizer(const OptimizerConfig& config, const ParameterTable& table,
                                       DataParallel& data_parallel)
    : ShardedOptimizer(config, table, data_parallel) {
  local_ = std::make_unique<OptimizerShard>(config, table, data_parallel.update_begin(),
                                            data_parallel.update_end());
  if (data_parallel.zero_stage() >= 1 && data_parallel.comm().distributed()) MakeFullState();
}

void FlatRangeOptimizer::Step(float* weights, const float* grads, double lr, int64_t step,
                              size_t base) {
  local_->Step(weights, grads, lr, step, base);
}

void FlatRangeOptimizer::UpdateHessian(float* weights, const float* grads, double lr, int64_t step,
                                       size_t base) {
  local_->UpdateHessian(weights, grads, lr, step, base);
}

void MatrixOwnerOptimizer::UpdateHessian(float*, const float*, double, int64_t, size_t) {
  throw Error(kExitFailure,
              "internal: optimizer " + config_.name +
                  " updates whole matrices and has a Hessian estimate: the owners' Hessian "
                  "update is not implemented");
}

void FlatRangeOptimizer::GatherFullState() {
  if (!full_) return;
  Communicator& comm = data_parallel_.comm();
  const bool leader = comm.rank() == 0;
  const size_t shard = data_parallel_.shard_size(), n_params = table_.total();
  const size_t begin = data_parallel_.update_begin();
  std::vector<ShardState> parts = local_->State(), full = full_->State();
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::vector<float>& part = parts[i].values;  // per element: kWholeMatrix never cuts
    // Rank 0 receives every rank's shard (padded to the shard size) in rank order.
    std::vector<float> mine(shard, 0.0f), all(leader ? data_parallel_.padded_size() : 0);
    if (!part.empty())
      std::copy(part.begin(), part.end(), mine.begin() + (begin - comm.rank() * shard));
    comm.GatherFloatToRoot(mine.data(), all.data(), shard, "optimizer-state gather");
    if (leader) full[i].values.assign(all.begin(), all.begin() + n_params);
  }
}

void FlatRangeOptimizer::ScatterFullState() {
  if (!full_) return;
  std::vector<ShardState> parts = local_->State(), full = full_->State();
  for (size_t i = 0; i < parts.size(); ++i)
    std::copy(full[i].values.begin() + data_parallel_.update_begin(),
              full[i].values.begin() + data_parallel_.update_end(), parts[i].values.begin());
}

std::unique_ptr<ShardedOptimizer> MakeShardedOptimizer(const OptimizerConfig& config,
                                                       const ParameterTable& table,
                                                       DataParallel& data_parallel) {
  // Only a flat range that cuts tensors needs owners: ZeRO-1/3 across ranks.
  if (config.optimizer->shard_mode() == ShardMode::kWholeMatrix &&
      data_parallel.zero_stage() >= 1 && data_parallel.comm().distributed())
    return std::make_unique<MatrixOwnerOptimizer>(config, table, data_parallel);
  return std::make_unique<FlatRangeOptimizer>(config, table, data_parallel);
}

}  // namespace crucible
