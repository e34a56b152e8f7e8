#include "optim/optimizer.h"

#include <cstdio>
#include <cstdlib>
#include <map>

#include "common/error.h"

namespace crucible {
namespace {

// Filled by the static registrars before main(); read-only afterwards.
std::map<std::string, OptimizerFactory>& Registry() {
  static std::map<std::string, OptimizerFactory> registry;
  return registry;
}

}  // namespace

OptimizerRegistrar::OptimizerRegistrar(const char* name, OptimizerFactory factory) {
  if (!Registry().emplace(name, factory).second) {
    std::fprintf(stderr, "internal: optimizer '%s' is registered twice\n", name);
    std::abort();
  }
}

std::vector<std::string> RegisteredOptimizers() {
  std::vector<std::string> names;
  for (const auto& [name, factory] : Registry()) names.push_back(name);
  return names;
}

std::unique_ptr<Optimizer> MakeOptimizer(const std::string& name, const Config& config,
                                         const std::string& key) {
  auto found = Registry().find(name);
  if (found == Registry().end()) {
    std::string choices;
    const std::vector<std::string> names = RegisteredOptimizers();
    for (size_t i = 0; i < names.size(); ++i)
      choices += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
    throw UsageError(key + ": unknown optimizer '" + name + "' (choose " + choices + ")");
  }
  return found->second(config);
}

}  // namespace crucible
