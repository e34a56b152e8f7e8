// Helpers of the optimizer tests (and of tests/unit/distributed/matrix_routes_test.cc): a small
// parameter table with one tensor of every kind, a table of given sizes, values that do not
// depend on the library's random distributions, and a config for an optimizer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/strings.h"
#include "model/parameters.h"
#include "optim/optimizer_shard.h"

namespace crucible::optim_test {

// embedding {7, 5}, norm {5}, linear {6, 5}, output projection {5, 6}, norm {5}, head {7, 5}: 140
// elements in three units, with odd sizes so that cuts fall inside tensors.
inline ParameterTable SmallTable() {
  ParameterTable table;
  table.Add("embed", {7, 5}, ParamKind::kEmbedding, -1);
  table.EndUnit();
  table.Add("layer.norm", {5}, ParamKind::kNorm, 0);
  table.Add("layer.linear", {6, 5}, ParamKind::kLinear, 0);
  table.Add("layer.output", {5, 6}, ParamKind::kOutputProjection, 0);
  table.EndUnit();
  table.Add("final.norm", {5}, ParamKind::kNorm, -1);
  table.Add("head", {7, 5}, ParamKind::kHead, -1);
  table.EndUnit();
  return table;
}

// One unit of 1-D tensors t0, t1, ... of these sizes, in order.
inline ParameterTable TableOfSizes(const std::vector<int64_t>& sizes) {
  ParameterTable table;
  for (size_t i = 0; i < sizes.size(); ++i)
    table.Add(StrFormat("t%zu", i), {sizes[i]}, ParamKind::kLinear, 0);
  table.EndUnit();
  return table;
}

// n values in [-scale, scale), a pure function of (seed, index) (SplitMix64).
inline std::vector<float> Values(size_t n, uint64_t seed, float scale = 1.0f) {
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + (i + 1) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    out[i] = scale * (static_cast<float>(z >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f);
  }
  return out;
}

// The [optimizer] of the defaults with `name` and the overrides ("optimizer.beta1=0.8", ...).
inline OptimizerConfig ConfigFor(const std::string& name,
                                 const std::vector<std::string>& overrides = {}) {
  Config config = Config::Defaults();
  config.ApplyOverride("optimizer.name=" + name);
  for (const std::string& o : overrides) config.ApplyOverride(o);
  return BuildOptimizerConfig(config);
}

}  // namespace crucible::optim_test
