#include "ckpt/model_weights.h"

#include <cmath>
#include <map>
#include <set>

#include "ckpt/safetensors.h"
#include "common/error.h"
#include "common/strings.h"

namespace crucible {

std::map<std::string, std::string> ModelWeightsMetadata(const ModelSpec& model) {
  std::map<std::string, std::string> metadata = model.WeightsMetadata();
  metadata["format"] = "pt";
  return metadata;
}

void SaveModelWeights(const std::string& path, const ParameterTable& table, const ModelSpec& model,
                      const float* weights,
                      const std::function<std::string(const ParamInfo&)>& name_of) {
  std::vector<TensorView> views;
  for (const auto& p : table.params())
    views.push_back({name_of ? name_of(p) : p.name, p.shape, weights + p.offset});
  WriteSafetensors(path, views, ModelWeightsMetadata(model));
}

void LoadModelWeights(const std::string& path, const ParameterTable& table, float* weights) {
  SafetensorsReader reader(path);
  std::set<std::string> names;
  for (const auto& p : table.params()) names.insert(p.name);
  const TensorEntry* first_extra = nullptr;
  size_t extras = 0;
  for (const auto& t : reader.tensors()) {
    if (names.count(t.name)) continue;
    if (!first_extra) first_extra = &t;
    ++extras;
  }
  if (first_extra)
    throw DataError(StrFormat(
        "%s: tensor '%s' is not in the model (%zu tensor%s not): the file holds another model's "
        "weights (biases, more layers or an untied head?); load weights written for this model",
        path.c_str(), first_extra->name.c_str(), extras, extras == 1 ? " is" : "s are"));
  for (const auto& p : table.params()) reader.ReadFloat32(p.name, p.shape, weights + p.offset);
  RequireFiniteWeights(table, weights, [&](const std::string&) { return path; });
}

void RequireFiniteWeights(const ParameterTable& table, const float* weights,
                          const std::function<std::string(const std::string&)>& file_of) {
  const ParamInfo* first = nullptr;
  size_t first_count = 0, total = 0, tensors = 0;
  for (const auto& p : table.params()) {
    size_t count = 0;
    for (size_t i = 0; i < p.numel; ++i) count += !std::isfinite(weights[p.offset + i]);
    if (count == 0) continue;
    if (!first) {
      first = &p;
      first_count = count;
    }
    total += count;
    ++tensors;
  }
  if (!first) return;
  throw DataError(StrFormat(
      "%s: tensor '%s' holds %zu non-finite values (NaN or infinity) of %zu; %zu in all, in %zu "
      "tensor%s: weights that are not finite cannot be trained or scored; load other weights",
      file_of(first->name).c_str(), first->name.c_str(), first_count, first->numel, total, tensors,
      tensors == 1 ? "" : "s"));
}

}  // namespace crucible
