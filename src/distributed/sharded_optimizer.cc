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
  Communicator& comm = data_parallel_.batch();  // every rank that updates something
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

Communicator::Blocks ShardedOptimizer::GatherToRoot(const std::vector<float>& mine,
                                                    const std::vector<size_t>& counts,
                                                    std::vector<float>* all) {
  Communicator& comm = data_parallel_.comm();
  std::vector<size_t> send(static_cast<size_t>(comm.size()), 0), receive = send;
  send[0] = mine.size();
  if (comm.rank() == 0) receive = counts;
  const Communicator::Blocks receive_blocks = Communicator::Blocks::Packed(std::move(receive));
  all->assign(receive_blocks.total(), 0.0f);
  comm.AllToAllV(mine.data(), Communicator::Blocks::Packed(std::move(send)), all->data(),
                 receive_blocks, "optimizer-state gather");
  return receive_blocks;
}

namespace {

// The elements of [range.begin, range.end) whose tensors carry `spec` (a per-element spec).
size_t CarriedIn(const StateSpec& spec, const ParameterTable& table, Range range) {
  size_t count = 0;
  for (const ParamInfo& p : table.params()) {
    const size_t b = std::max(range.begin, p.offset), e = std::min(range.end, p.offset + p.numel);
    if (spec.Carries(p) && b < e) count += e - b;
  }
  return count;
}

}  // namespace

// The ranges are consecutive and ascending, so the carrying elements of every rank's range, in
// rank order, are the full layout (the carrying tensors concatenated in table order).
void ShardedOptimizer::GatherRangeState(const ShardState& part, const ShardState& full) {
  const ShardLayout& layout = data_parallel_.layout();
  std::vector<size_t> counts;
  for (size_t q = 0; q < static_cast<size_t>(layout.ranks()); ++q)
    counts.push_back(CarriedIn(part.spec, table_, layout.Owned(q)));
  GatherToRoot(part.values, counts, &full.values);
}

void ShardedOptimizer::ScatterRangeState(const ShardState& full, const ShardState& part) {
  const size_t at = CarriedIn(part.spec, table_, {0, data_parallel_.update_begin()});
  std::copy(full.values.begin() + at, full.values.begin() + at + part.values.size(),
            part.values.begin());
}

void FlatRangeOptimizer::GatherFullState() {
  if (!full_) return;
  std::vector<ShardState> parts = local_->State(), full = full_->State();
  // Per element: a kWholeMatrix optimizer has a flat range only where it cuts no tensor.
  for (size_t i = 0; i < parts.size(); ++i) GatherRangeState(parts[i], full[i]);
}

void FlatRangeOptimizer::ScatterFullState() {
  if (!full_) return;
  std::vector<ShardState> parts = local_->State(), full = full_->State();
  for (size_t i = 0; i < parts.size(); ++i) ScatterRangeState(full[i], parts[i]);
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
