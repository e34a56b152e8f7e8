#include "optim/per_group_optimizer.h"

#include "common/error.h"

namespace crucible {
namespace {

class PerGroupOptimizer final : public Optimizer {
 public:
  PerGroupOptimizer(std::shared_ptr<const Optimizer> matrices,
                    std::shared_ptr<const Optimizer> others)
      : matrices_(std::move(matrices)),
        others_(std::move(others)),
        matrix_specs_(matrices_->state().size()) {
    const std::vector<StateSpec> all = state();
    for (size_t a = 0; a < all.size(); ++a)
      for (size_t b = a + 1; b < all.size(); ++b)
        if (all[a].name == all[b].name)
          throw Error(kExitFailure,
                      "internal: the optimizers of two parameter groups both name "
                      "a state '" +
                          all[a].name + "'");
  }

  ShardMode shard_mode() const override {
    return matrices_->shard_mode() == ShardMode::kWholeMatrix ||
                   others_->shard_mode() == ShardMode::kWholeMatrix
               ? ShardMode::kWholeMatrix
               : ShardMode::kElementwise;
  }

  // Each group's optimizer's specs, carried by that group's tensors only.
  ShardMode shard_mode_of(const ParamInfo& param) const override {
    return (IsHiddenMatrix(param.kind) ? matrices_ : others_)->shard_mode_of(param);
  }

  std::vector<StateSpec> state() const override {
    std::vector<StateSpec> specs = matrices_->state();
    for (StateSpec& spec : specs) spec.carried_by = spec.carried_by & kHiddenMatrices;
    for (StateSpec& spec : others_->state()) {
      spec.carried_by = spec.carried_by & kHiddenMatrices.Complement();
      specs.push_back(std::move(spec));
    }
    return specs;
  }

  void Update(const TensorUpdate& u) const override {
    const bool matrix = IsHiddenMatrix(u.param.kind);
    std::span<const std::span<float>> state =
        matrix ? u.state.first(matrix_specs_) : u.state.subspan(matrix_specs_);
    // The metrics are the matrices optimizer's: the others' tensors get none.
    (matrix ? matrices_ : others_)
        ->Update({u.param, u.group, u.lr, u.step, u.first, u.weights, u.grads, state,
                  u.batch_tokens, matrix ? u.metrics : std::span<double>()});
  }
  std::vector<OptimizerMetric> metrics() const override { return matrices_->metrics(); }

 private:
  std::shared_ptr<const Optimizer> matrices_, others_;
  size_t matrix_specs_;
};

}  // namespace

std::unique_ptr<Optimizer> MakePerGroupOptimizer(std::shared_ptr<const Optimizer> matrices,
                                                 std::shared_ptr<const Optimizer> others) {
  return std::make_unique<PerGroupOptimizer>(std::move(matrices), std::move(others));
}

}  // namespace crucible
