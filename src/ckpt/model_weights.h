// The model's flat weight buffer as a safetensors file with Hugging Face Llama tensor names.
#pragma once

#include <map>
#include <string>

#include "model/llama.h"

namespace crucible {

// The __metadata__ of a weights file: format=pt (what transformers expects) and the model shape.
std::map<std::string, std::string> ModelWeightsMetadata(const LlamaConfig& model);
void SaveModelWeights(const std::string& path, const ParameterTable& table,
                      const LlamaConfig& model, const float* weights);
// Fills `weights` from a safetensors file; every tensor of the table must be present with its
// shape (F32, BF16, F16 or F64). Throws DataError naming the file and tensor otherwise.
void LoadModelWeights(const std::string& path, const ParameterTable& table, float* weights);

}  // namespace crucible
