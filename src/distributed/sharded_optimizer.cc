#include "distributed/sharded_optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace crucible {

void ShardedOptimizer::MakeFullState() {
  full_ = std::make_unique<OptimizerShard>(config_, table_, 0, table_.total());
  ReleaseFullState();
}

std::vector<std::pair<std::string, double>> ShardedOptimizer::Diagnostics() {
  std::vector<std::pair<std::string, double>> out;
  std::vector<double> mine;
  for (const ShardState& state : local_->State()) {
    if (!state.spec.diagnostic) continue;
    double largest = -std::numeric_limits<double>::infinity();
    for (float value : state.values)
      largest = std::isnan(value) || std::isnan(largest) ? std::nan("")
                                                         : std::max<double>(largest, value);
    out.emplace_back(state.spec.name, largest);
    mine.push_back(largest);
  }
  if (mine.empty()) return out;
  Communicator& comm = data_parallel_.comm();
  std::vector<double> all(mine.size() * comm.size());
  comm.AllGatherDouble(mine.data(), all.data(), mine.size(), "optimizer diagnostics");
  for (size_t i = 0; i < out.size(); ++i) {
    double largest = -std::numeric_limits<double>::infinity();
    for (int r = 0; r < comm.size(); ++r) {
      const double value = all[r * mine.size() + i];
      largest = std::isnan(value) || std::isnan(largest) ? std::nan("") : std::max(largest, value);
    }
    out[i].second = largest;
  }
  return out;
}

void ShardedOptimizer::ReleaseFullState() {
  if (full_)
    for (const ShardState& state : full_->State()) std::vector<float>().swap(state.values);
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
