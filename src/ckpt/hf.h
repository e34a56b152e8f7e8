// Hugging Face interop: a LlamaForCausalLM folder (config.json, model.safetensors,
// generation_config.json, tokenizer.json + tokenizer_config.json when a tokenizer is known) out
// of our weights, and our weights out of such a folder (written by transformers'
// save_pretrained, one safetensors file or shards with model.safetensors.index.json).
// Tensor names are the same on both sides (our ParameterTable uses Hugging Face names) and
// rotary embeddings use the same rotate-half layout, so no tensor is permuted.
#pragma once

#include <cstdint>
#include <string>

#include "model/llama.h"

namespace crucible {

// Writes the folder `out` (which must not exist, or be empty) atomically: the files are written
// in a temporary sibling folder that is renamed to `out` when complete.
void ExportHfModel(const std::string& out, const LlamaConfig& model, const ParameterTable& table,
                   const float* weights, int64_t max_position_embeddings,
                   const std::string& tokenizer_path);

// The model shape described by `dir`/config.json (a LlamaForCausalLM folder, as transformers 4
// or 5 writes it: the RoPE base is `rope_theta` or `rope_parameters.rope_theta`), and its
// max_position_embeddings in *max_position_embeddings (0 when absent). UsageError if the file is
// missing; DataError if it is not JSON, lacks a shape key, or describes what crucible cannot
// reproduce exactly: a model_type other than llama, an activation other than silu, biases, a
// rope_type other than default (llama3, yarn, linear, dynamic, ...), or two RoPE bases that
// disagree. ImportHfModel then checks the rest.
LlamaConfig ReadHfLlamaConfig(const std::string& dir, int64_t* max_position_embeddings);

// Reads `dir`/config.json (refused as by ReadHfLlamaConfig, and it must describe the same shape
// and RoPE base as `model`: every differing key is listed in a UsageError) and the weights into
// `weights` (DataError on a missing tensor, or on one that holds NaN or infinity, naming its
// file: RequireFiniteWeights).
void ImportHfModel(const std::string& dir, const LlamaConfig& model, const ParameterTable& table,
                   float* weights);

}  // namespace crucible
