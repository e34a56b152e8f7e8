// The model's flat weight buffer as a safetensors file with Hugging Face Llama tensor names.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "model/llama.h"

namespace crucible {

// The __metadata__ of a weights file: format=pt (what transformers expects) and the model shape.
std::map<std::string, std::string> ModelWeightsMetadata(const LlamaConfig& model);
void SaveModelWeights(const std::string& path, const ParameterTable& table,
                      const LlamaConfig& model, const float* weights);
// Fills `weights` from a safetensors file; every tensor of the table must be present with its
// shape (F32, BF16, F16 or F64) and every value finite once converted to float32. Throws
// DataError naming the file and tensor otherwise.
void LoadModelWeights(const std::string& path, const ParameterTable& table, float* weights);

// Throws DataError when `weights` (table layout) hold a NaN or an infinity, naming the file the
// first such tensor came from (file_of(tensor name)), that tensor, how many of its values are
// not finite, and the totals: trained on, they would only ever give NaN.
void RequireFiniteWeights(const ParameterTable& table, const float* weights,
                          const std::function<std::string(const std::string&)>& file_of);

}  // namespace crucible
