// Hugging Face interop: a transformers folder (config.json, model.safetensors,
// generation_config.json, tokenizer.json + tokenizer_config.json when a tokenizer is known) out
// of our weights, and our weights out of such a folder (written by transformers'
// save_pretrained, one safetensors file or shards with model.safetensors.index.json). The files
// are read and written here; what they hold comes from the model's HfMapping (model/model.h):
// the architecture, config.json's keys, the tensor names (for Llama, LlamaForCausalLM and the
// table's own names).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "model/model.h"
#include "model/parameters.h"

namespace crucible {

// Writes the folder `out` (which must not exist, or be empty) atomically: the files are written
// in a temporary sibling folder that is renamed to `out` when complete. UsageError when the
// model has no Hugging Face form. `chat_template` (Jinja text), when not empty, is written as
// tokenizer_config.json's chat_template (it needs a tokenizer). `end_of_turn`, the template's
// end-of-turn marker (ChatTemplateEndOfTurn), when it is a token of the tokenizer other than its
// EOS, joins the EOS in generation_config.json's eos_token_id ([eos, end_of_turn], as instruct
// models ship it), so that transformers' generate ends a chat turn where crucible's does.
void ExportHfModel(const std::string& out, const ModelSpec& model, const ParameterTable& table,
                   const float* weights, int64_t max_position_embeddings,
                   const std::string& tokenizer_path, const std::string& chat_template = "",
                   const std::string& end_of_turn = "");

// The model described by `dir`/config.json (its model_type picks the family:
// ModelSpecFromHfConfig), and its max_position_embeddings in *max_position_embeddings (0 when
// absent). UsageError if the file is missing; DataError if it is not a JSON object, names a
// model_type crucible does not read, or describes what the model cannot reproduce exactly (for
// Llama: lacks a shape key, an activation other than silu, biases, a rope_type other than default,
// two RoPE bases that disagree). ImportHfModel then checks the rest.
std::shared_ptr<const ModelSpec> ReadHfModelSpec(const std::string& dir,
                                                 int64_t* max_position_embeddings);

// Reads `dir`/config.json (refused as by ReadHfModelSpec, and it must describe the same model
// as `model`: every differing key is listed in a UsageError) and the weights into `weights`
// (DataError on a missing tensor, or on one that holds NaN or infinity, naming its file:
// RequireFiniteWeights).
void ImportHfModel(const std::string& dir, const ModelSpec& model, const ParameterTable& table,
                   float* weights);

}  // namespace crucible
