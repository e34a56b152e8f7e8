// The model's flat weight buffer as a safetensors file with the table's tensor names (Hugging
// Face names for Llama).
#pragma once

#include <functional>
#include <map>
#include <string>

#include "model/model.h"
#include "model/parameters.h"

namespace crucible {

// The __metadata__ of a weights file: format=pt (what transformers expects) and the model shape
// (ModelSpec::WeightsMetadata).
std::map<std::string, std::string> ModelWeightsMetadata(const ModelSpec& model);
// One tensor per table entry, named by `name_of` (nullptr: the table's names).
void SaveModelWeights(const std::string& path, const ParameterTable& table, const ModelSpec& model,
                      const float* weights,
                      const std::function<std::string(const ParamInfo&)>& name_of = nullptr);
// Fills `weights` from a safetensors file; every tensor of the table must be present with its
// shape (F32, BF16, F16 or F64), no other tensor may be (a file of another model, e.g. one with
// attention biases), and every value must be finite once converted to float32. Throws DataError
// naming the file and tensor otherwise.
void LoadModelWeights(const std::string& path, const ParameterTable& table, float* weights);

// Throws DataError when `weights` (table layout) hold a NaN or an infinity, naming the file the
// first such tensor came from (file_of(tensor name)), that tensor, how many of its values are
// not finite, and the totals: trained on, they would only ever give NaN.
void RequireFiniteWeights(const ParameterTable& table, const float* weights,
                          const std::function<std::string(const std::string&)>& file_of);

}  // namespace crucible
