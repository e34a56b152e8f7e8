#include "optim/optimizer.h"

#include "common/error.h"
#include "common/registry.h"

namespace crucible {
namespace {

Registry<OptimizerFactory>& Optimizers() {
  static Registry<OptimizerFactory> registry("optimizer");
  return registry;
}

}  // namespace

FullStateLayout LayOutFullState(const StateSpec& spec, const ParameterTable& table) {
  FullStateLayout layout;
  for (const ParamInfo& param : table.params()) {
    const size_t floats = spec.FloatsOf(param);
    layout.offsets.push_back(spec.Carries(param) ? layout.size : FullStateLayout::kNotCarried);
    layout.size += floats;
  }
  return layout;
}

void Optimizer::UpdateHessian(const TensorUpdate&) const {
  throw Error(kExitFailure, "internal: UpdateHessian on an optimizer with no Hessian estimate");
}

OptimizerRegistrar::OptimizerRegistrar(const char* name, OptimizerFactory factory) {
  Optimizers().Add(name, factory);
}

std::vector<std::string> RegisteredOptimizers() {
  return Optimizers().Names();
}

std::unique_ptr<Optimizer> MakeOptimizer(const std::string& name, const Config& config,
                                         const std::string& key) {
  return Optimizers().Find(name, key)(config);
}

}  // namespace crucible
