#include "ckpt/model_weights.h"

#include <map>

#include "ckpt/safetensors.h"

namespace crucible {

std::map<std::string, std::string> ModelWeightsMetadata(const LlamaConfig& m) {
  return {{"format", "pt"},
          {"crucible.flavor", m.flavor},
          {"crucible.vocab_size", std::to_string(m.vocab_size)},
          {"crucible.dim", std::to_string(m.dim)},
          {"crucible.n_layers", std::to_string(m.n_layers)},
          {"crucible.n_heads", std::to_string(m.n_heads)},
          {"crucible.n_kv_heads", std::to_string(m.n_kv_heads)},
          {"crucible.ffn_hidden_dim", std::to_string(m.ffn_hidden_dim)},
          {"crucible.tie_embeddings", m.tie_embeddings ? "true" : "false"}};
}

void SaveModelWeights(const std::string& path, const ParameterTable& table, const LlamaConfig& m,
                      const float* weights) {
  std::vector<TensorView> views;
  for (const auto& p : table.params()) views.push_back({p.name, p.shape, weights + p.offset});
  WriteSafetensors(path, views, ModelWeightsMetadata(m));
}

void LoadModelWeights(const std::string& path, const ParameterTable& table, float* weights) {
  SafetensorsReader reader(path);
  for (const auto& p : table.params()) reader.ReadFloat32(p.name, p.shape, weights + p.offset);
}

}  // namespace crucible
