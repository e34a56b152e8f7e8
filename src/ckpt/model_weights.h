// The model's flat weight buffer as a safetensors file with Hugging Face Llama tensor names.
#pragma once

#include <string>

#include "model/llama.h"

namespace crucible {

void SaveModelWeights(const std::string& path, const ParameterTable& table,
                      const LlamaConfig& model, const float* weights);
// Fills `weights` from a safetensors file; every tensor of the table must be present with its
// shape (F32, BF16, F16 or F64). Throws DataError naming the file and tensor otherwise.
void LoadModelWeights(const std::string& path, const ParameterTable& table, float* weights);

}  // namespace crucible
