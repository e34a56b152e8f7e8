// MatrixOwnerOptimizer (distributed/sharded_optimizer.h): whole-matrix updates under ZeRO-1/3,
// each kWholeMatrix tensor by its owner rank, the kElementwise ones (an optimizer that mixes the
// modes) in the flat range of this rank.
#include <algorithm>
#include <span>

#include "common/error.h"
#include "distributed/sharded_optimizer.h"
#include "optim/matrix_owners.h"

namespace crucible {
namespace {

// Calls fn(owned, full, count) for each tensor of `tensors` (ascending) that carries `spec`,
// with where its state lies in their owner's buffer (OptimizerShard's tensor layout) and in the
// full one (`full`: the layout over [0, n)), and how many floats it has.
template <typename Fn>
void ForEachTensorState(const StateSpec& spec, const FullStateLayout& full,
                        const ParameterTable& table, const std::vector<size_t>& tensors, Fn fn) {
  size_t owned = 0;
  for (size_t t : tensors) {
    const size_t count = spec.FloatsOf(table.params()[t]);
    if (count == 0) continue;
    fn(owned, full.offsets[t], count);
    owned += count;
  }
}

}  // namespace

MatrixOwnerOptimizer::MatrixOwnerOptimizer(const OptimizerConfig& config,
                                           const ParameterTable& table, DataParallel& data_parallel)
    : ShardedOptimizer(config, table, data_parallel),
      owners_(AssignMatrixOwners(table, data_parallel.comm().size(), WholeTensors(config, table))) {
  if (config.optimizer->shard_mode() != ShardMode::kWholeMatrix || data_parallel.zero_stage() == 0)
    throw Error(kExitFailure,
                "internal: MatrixOwnerOptimizer is for whole-matrix optimizers under "
                "ZeRO-1/3 (optimizer " +
                    config.name + ")");
  routes_ = RouteMatrices(table, owners_, data_parallel.layout());
  local_ = std::make_unique<OptimizerShard>(config, table, data_parallel.update_begin(),
                                            data_parallel.update_end(), routes_.tensors);
  // Each state is gathered from the owners or from the flat ranges (checked: never both).
  for (const StateSpec& spec : config.optimizer->state())
    owned_state_.push_back(StateShardMode(config, table, spec) == ShardMode::kWholeMatrix);
  MakeFullState();
  packed_.resize(routes_.to_owners.total());  // the whole-matrix pieces of its range
  owned_weights_.resize(routes_.owned_elements());
  owned_grads_.resize(routes_.owned_elements());
}

void MatrixOwnerOptimizer::Step(float* weights, const float* grads, double lr, int64_t step,
                                size_t base) {
  local_->Step(weights, grads, lr, step, base);  // the elementwise tensors' parts in the range
  Communicator& comm = data_parallel_.comm();
  auto pack = [&](const float* source) {
    size_t at = 0;
    for (const Range& piece : routes_.pieces) {
      std::copy(source + (piece.begin - base), source + (piece.end - base), packed_.data() + at);
      at += piece.size();
    }
  };
  pack(grads);
  comm.AllToAllV(packed_.data(), routes_.to_owners, owned_grads_.data(), routes_.from_holders,
                 "matrix-gradient all-to-all");
  if (data_parallel_.zero_stage() == 3) {  // the owner holds only its shard of the weights
    pack(weights);
    comm.AllToAllV(packed_.data(), routes_.to_owners, owned_weights_.data(), routes_.from_holders,
                   "matrix-weight all-to-all");
  } else {  // ZeRO-1: every replica holds every weight
    for (size_t k = 0; k < routes_.tensors.size(); ++k) {
      const ParamInfo& param = table_.params()[routes_.tensors[k]];
      std::copy(weights + (param.offset - base), weights + (param.offset + param.numel - base),
                owned_weights_.data() + routes_.tensor_offsets[k]);
    }
  }
  for (size_t k = 0; k < routes_.tensors.size(); ++k) {
    const size_t numel = table_.params()[routes_.tensors[k]].numel;
    const size_t at = routes_.tensor_offsets[k];
    local_->StepMatrix(routes_.tensors[k], std::span<float>(owned_weights_.data() + at, numel),
                       std::span<const float>(owned_grads_.data() + at, numel), lr, step);
  }
  comm.AllToAllV(owned_weights_.data(), routes_.from_holders, packed_.data(), routes_.to_owners,
                 "updated-matrix all-to-all");
  size_t at = 0;
  for (const Range& piece : routes_.pieces) {
    std::copy(packed_.data() + at, packed_.data() + at + piece.size(),
              weights + (piece.begin - base));
    at += piece.size();
  }
}

void MatrixOwnerOptimizer::GatherFullState() {
  const size_t ranks = static_cast<size_t>(data_parallel_.comm().size());
  std::vector<ShardState> parts = local_->State(), full = full_->State();
  std::vector<std::vector<size_t>> tensors_of(ranks);
  for (size_t q = 0; q < ranks; ++q) tensors_of[q] = TensorsOwnedBy(owners_, static_cast<int>(q));
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!owned_state_[i]) {
      GatherRangeState(parts[i], full[i]);
      continue;
    }
    const StateSpec& spec = parts[i].spec;
    const FullStateLayout layout = LayOutFullState(spec, table_);
    // Everything to rank 0, in owner-rank order.
    std::vector<size_t> counts(ranks, 0);
    for (size_t q = 0; q < ranks; ++q)
      ForEachTensorState(spec, layout, table_, tensors_of[q],
                         [&](size_t, size_t, size_t count) { counts[q] += count; });
    std::vector<float> all;
    const Communicator::Blocks blocks = GatherToRoot(parts[i].values, counts, &all);
    if (data_parallel_.comm().rank() != 0) continue;
    std::vector<float>& whole = full[i].values;
    whole.assign(layout.size, 0.0f);
    for (size_t q = 0; q < ranks; ++q)
      ForEachTensorState(spec, layout, table_, tensors_of[q],
                         [&](size_t owned, size_t at, size_t count) {
                           const float* from = all.data() + blocks.offsets[q] + owned;
                           std::copy(from, from + count, whole.data() + at);
                         });
  }
}

void MatrixOwnerOptimizer::ScatterFullState() {
  std::vector<ShardState> parts = local_->State(), full = full_->State();
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!owned_state_[i]) {
      ScatterRangeState(full[i], parts[i]);
      continue;
    }
    ForEachTensorState(parts[i].spec, LayOutFullState(parts[i].spec, table_), table_,
                       routes_.tensors, [&](size_t owned, size_t at, size_t count) {
                         const float* from = full[i].values.data() + at;
                         std::copy(from, from + count, parts[i].values.data() + owned);
                       });
  }
}

size_t MatrixOwnerOptimizer::BufferBytes() const {
  return sizeof(float) * (packed_.size() + owned_weights_.size() + owned_grads_.size());
}

}  // namespace crucible
