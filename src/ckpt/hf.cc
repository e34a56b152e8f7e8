#include "ckpt/hf.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "ckpt/model_weights.h"
#include "ckpt/safetensors.h"
#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"

namespace crucible {
namespace {

// Special-token ids of a tokenizer.json, by the names the common Llama/GPT tokenizers use.
void FindSpecialTokens(const nlohmann::json& tokenizer, nlohmann::json* bos, nlohmann::json* eos) {
  *bos = nullptr;
  *eos = nullptr;
  if (!tokenizer.contains("added_tokens") || !tokenizer["added_tokens"].is_array()) return;
  std::map<std::string, int64_t> ids;
  for (const auto& token : tokenizer["added_tokens"])
    if (token.is_object() && token.contains("content") && token.contains("id") &&
        token["content"].is_string() && token["id"].is_number_integer())
      ids[token["content"].get<std::string>()] = token["id"].get<int64_t>();
  for (const char* name : {"<|begin_of_text|>", "<s>", "<|endoftext|>"})
    if (ids.count(name)) {
      *bos = ids[name];
      break;
    }
  for (const char* name : {"<|end_of_text|>", "</s>", "<|endoftext|>", "<|eot_id|>"})
    if (ids.count(name)) {
      *eos = ids[name];
      break;
    }
}

nlohmann::json ReadJson(const std::string& path) {
  try {
    return nlohmann::json::parse(ReadFile(path));
  } catch (const nlohmann::json::exception& e) {
    throw DataError(path + ": not valid JSON (" + e.what() + ")");
  }
}

}  // namespace

void ExportHfModel(const std::string& out, const LlamaConfig& m, const ParameterTable& table,
                   const float* weights, int64_t max_position_embeddings,
                   const std::string& tokenizer_path) {
  if (IsDirectory(out)) {
    std::error_code error;
    if (!std::filesystem::is_empty(out, error))
      throw UsageError(out + ": exists and is not empty; choose a new output folder");
    ::rmdir(out.c_str());
  } else if (FileExists(out)) {
    throw UsageError(out + ": exists and is not a folder");
  }
  std::string parent = ParentDirectory(out);
  if (!parent.empty()) MakeDirectories(parent);
  const std::string temporary = out + ".tmp." + std::to_string(::getpid());
  RemoveTree(temporary);
  MakeDirectories(temporary);
  try {
    nlohmann::json bos = nullptr, eos = nullptr;
    std::string tokenizer_text;
    if (!tokenizer_path.empty()) {
      tokenizer_text = ReadFile(tokenizer_path);
      nlohmann::json tokenizer = nlohmann::json::parse(tokenizer_text, nullptr, false);
      if (tokenizer.is_discarded()) throw DataError(tokenizer_path + ": not valid JSON");
      FindSpecialTokens(tokenizer, &bos, &eos);
    }
    nlohmann::ordered_json config = {{"architectures", {"LlamaForCausalLM"}},
                                     {"model_type", "llama"},
                                     {"vocab_size", m.vocab_size},
                                     {"hidden_size", m.dim},
                                     {"intermediate_size", m.ffn_hidden_dim},
                                     {"num_hidden_layers", m.n_layers},
                                     {"num_attention_heads", m.n_heads},
                                     {"num_key_value_heads", m.n_kv_heads},
                                     {"head_dim", m.head_dim()},
                                     {"hidden_act", "silu"},
                                     {"max_position_embeddings", max_position_embeddings},
                                     {"rms_norm_eps", m.norm_eps},
                                     {"rope_theta", m.rope_theta},
                                     {"rope_scaling", nullptr},
                                     {"attention_bias", false},
                                     {"attention_dropout", 0.0},
                                     {"mlp_bias", false},
                                     {"initializer_range", m.init_std},
                                     {"pretraining_tp", 1},
                                     {"tie_word_embeddings", m.tie_embeddings},
                                     {"torch_dtype", "float32"},
                                     {"use_cache", true},
                                     {"bos_token_id", bos},
                                     {"eos_token_id", eos}};
    AtomicWriteFile(JoinPath(temporary, "config.json"), config.dump(2) + "\n");
    nlohmann::ordered_json generation = {
        {"_from_model_config", true}, {"bos_token_id", bos}, {"eos_token_id", eos}};
    AtomicWriteFile(JoinPath(temporary, "generation_config.json"), generation.dump(2) + "\n");
    SaveModelWeights(JoinPath(temporary, "model.safetensors"), table, m, weights);
    if (!tokenizer_path.empty()) {
      AtomicWriteFile(JoinPath(temporary, "tokenizer.json"), tokenizer_text);
      nlohmann::ordered_json tokenizer_config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                                                 {"model_max_length", max_position_embeddings}};
      AtomicWriteFile(JoinPath(temporary, "tokenizer_config.json"),
                      tokenizer_config.dump(2) + "\n");
    }
    if (::rename(temporary.c_str(), out.c_str()) != 0)
      ThrowErrno("cannot rename " + temporary + " to " + out);
    FsyncDirectory(parent);
  } catch (...) {
    RemoveTree(temporary);
    throw;
  }
}

LlamaConfig ReadHfLlamaConfig(const std::string& dir, int64_t* max_position_embeddings) {
  const std::string config_path = JoinPath(dir, "config.json");
  if (!FileExists(config_path))
    throw UsageError(config_path + ": missing (not a Hugging Face model folder)");
  nlohmann::json c = ReadJson(config_path);
  if (!c.is_object()) throw DataError(config_path + ": not a JSON object");
  auto integer = [&](const char* key, int64_t fallback) -> int64_t {
    if (c.contains(key) && c[key].is_number_integer()) return c[key].get<int64_t>();
    if (fallback >= 0) return fallback;
    throw DataError(config_path + ": no integer '" + key + "'");
  };
  LlamaConfig m;
  m.flavor = "hf";
  m.vocab_size = integer("vocab_size", -1);
  m.dim = integer("hidden_size", -1);
  m.ffn_hidden_dim = integer("intermediate_size", -1);
  m.n_layers = integer("num_hidden_layers", -1);
  m.n_heads = integer("num_attention_heads", -1);
  m.n_kv_heads = integer("num_key_value_heads", m.n_heads);
  m.norm_eps = c.contains("rms_norm_eps") && c["rms_norm_eps"].is_number()
                   ? c["rms_norm_eps"].get<double>()
                   : 1e-6;
  m.rope_theta = c.contains("rope_theta") && c["rope_theta"].is_number()
                     ? c["rope_theta"].get<double>()
                     : 10000.0;
  m.tie_embeddings = c.value("tie_word_embeddings", false);
  if (c.contains("initializer_range") && c["initializer_range"].is_number())
    m.init_std = c["initializer_range"].get<double>();
  if (m.n_heads <= 0 || m.dim % m.n_heads != 0 || m.n_kv_heads <= 0 ||
      m.n_heads % m.n_kv_heads != 0)
    throw DataError(config_path +
                    ": hidden_size / num_attention_heads / num_key_value_heads do not divide");
  if (max_position_embeddings) *max_position_embeddings = integer("max_position_embeddings", 0);
  return m;
}

void ImportHfModel(const std::string& dir, const LlamaConfig& m, const ParameterTable& table,
                   float* weights) {
  if (!IsDirectory(dir))
    throw UsageError("checkpoint.initial_load_hf: " + dir + ": no such folder");
  const std::string config_path = JoinPath(dir, "config.json");
  if (!FileExists(config_path))
    throw UsageError("checkpoint.initial_load_hf: " + config_path +
                     ": missing (not a Hugging Face model folder)");
  nlohmann::json c = ReadJson(config_path);
  if (!c.is_object()) throw DataError(config_path + ": not a JSON object");
  std::vector<std::string> differences;
  auto integer = [&](const char* key, int64_t ours, const char* our_key, int64_t fallback) {
    int64_t theirs = fallback;
    if (c.contains(key) && c[key].is_number_integer())
      theirs = c[key].get<int64_t>();
    else if (fallback < 0)
      differences.push_back(std::string(key) + " missing");
    if (fallback >= 0 || c.contains(key))
      if (theirs != ours)
        differences.push_back(
            StrFormat("%s=%lld vs %s=%lld", key, (long long)theirs, our_key, (long long)ours));
  };
  auto real = [&](const char* key, double ours, const char* our_key, double fallback) {
    double theirs = c.contains(key) && c[key].is_number() ? c[key].get<double>() : fallback;
    if (std::fabs(theirs - ours) > 1e-12 * std::max(1.0, std::fabs(ours)))
      differences.push_back(StrFormat("%s=%g vs %s=%g", key, theirs, our_key, ours));
  };
  integer("vocab_size", m.vocab_size, "model.vocab_size", -1);
  integer("hidden_size", m.dim, "model.dim", -1);
  integer("intermediate_size", m.ffn_hidden_dim, "model.ffn_hidden_dim", -1);
  integer("num_hidden_layers", m.n_layers, "model.n_layers", -1);
  integer("num_attention_heads", m.n_heads, "model.n_heads", -1);
  int64_t kv =
      c.contains("num_key_value_heads") && c["num_key_value_heads"].is_number_integer()
          ? c["num_key_value_heads"].get<int64_t>()
          : (c.contains("num_attention_heads") && c["num_attention_heads"].is_number_integer()
                 ? c["num_attention_heads"].get<int64_t>()
                 : -1);
  if (kv != m.n_kv_heads)
    differences.push_back(StrFormat("num_key_value_heads=%lld vs model.n_kv_heads=%lld",
                                    (long long)kv, (long long)m.n_kv_heads));
  if (c.contains("head_dim") && c["head_dim"].is_number_integer() &&
      c["head_dim"].get<int64_t>() != m.head_dim())
    differences.push_back(StrFormat("head_dim=%lld vs dim/n_heads=%lld",
                                    (long long)c["head_dim"].get<int64_t>(),
                                    (long long)m.head_dim()));
  real("rms_norm_eps", m.norm_eps, "model.norm_eps", 1e-6);
  real("rope_theta", m.rope_theta, "model.rope_theta", 10000.0);
  bool tied = c.value("tie_word_embeddings", false);
  if (tied != m.tie_embeddings)
    differences.push_back(StrFormat("tie_word_embeddings=%s vs model.tie_embeddings=%s",
                                    tied ? "true" : "false", m.tie_embeddings ? "true" : "false"));
  if (c.contains("hidden_act") && c["hidden_act"] != "silu")
    differences.push_back("hidden_act=" + c["hidden_act"].dump() + " (only silu)");
  if (c.contains("rope_scaling") && !c["rope_scaling"].is_null())
    differences.push_back("rope_scaling=" + c["rope_scaling"].dump() + " (not supported)");
  if (c.value("attention_bias", false) || c.value("mlp_bias", false))
    differences.push_back("attention_bias/mlp_bias=true (not supported)");
  if (!differences.empty()) {
    std::string all;
    for (const auto& d : differences) all += (all.empty() ? "" : "; ") + d;
    throw UsageError("checkpoint.initial_load_hf: " + config_path + " does not match [model]: " +
                     all + ". Set the [model] keys to the folder's values");
  }
  // Which file holds each tensor.
  std::map<std::string, std::string> file_of;
  const std::string index_path = JoinPath(dir, "model.safetensors.index.json");
  if (FileExists(JoinPath(dir, "model.safetensors"))) {
    for (const auto& p : table.params()) file_of[p.name] = "model.safetensors";
  } else if (FileExists(index_path)) {
    nlohmann::json index = ReadJson(index_path);
    if (!index.contains("weight_map") || !index["weight_map"].is_object())
      throw DataError(index_path + ": no weight_map object");
    for (const auto& p : table.params()) {
      if (!index["weight_map"].contains(p.name) || !index["weight_map"][p.name].is_string())
        throw DataError(index_path + ": weight_map has no tensor '" + p.name + "'");
      std::string shard = index["weight_map"][p.name].get<std::string>();
      if (shard.find('/') != std::string::npos)
        throw DataError(index_path + ": bad shard name '" + shard + "'");
      file_of[p.name] = shard;
    }
  } else {
    throw UsageError("checkpoint.initial_load_hf: " + dir +
                     " has no model.safetensors (nor an index); "
                     "re-save it with save_pretrained(..., safe_serialization=True)");
  }
  std::map<std::string, std::unique_ptr<SafetensorsReader>> readers;
  for (const auto& p : table.params()) {
    auto& reader = readers[file_of[p.name]];
    if (!reader) reader = std::make_unique<SafetensorsReader>(JoinPath(dir, file_of[p.name]));
    reader->ReadFloat32(p.name, p.shape, weights + p.offset);
  }
  RequireFiniteWeights(table, weights,
                       [&](const std::string& name) { return JoinPath(dir, file_of[name]); });
}

}  // namespace crucible
