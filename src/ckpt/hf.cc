#include "ckpt/hf.h"

#include <sys/stat.h>
#include <unistd.h>

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
#include "tokenizer/tokenizer.h"

namespace crucible {
namespace {

// The BOS and EOS tokens of a tokenizer.json (content and id; null when none), found by the
// tokenizer module's one detector. Only the added tokens are read: the export also carries
// tokenizers crucible cannot encode with.
void FindBosEos(const nlohmann::json& tokenizer, nlohmann::json* bos, nlohmann::json* eos,
                nlohmann::json* bos_token, nlohmann::json* eos_token) {
  *bos = *eos = *bos_token = *eos_token = nullptr;
  if (!tokenizer.contains("added_tokens") || !tokenizer["added_tokens"].is_array()) return;
  std::vector<std::pair<std::string, int64_t>> added;
  for (const auto& token : tokenizer["added_tokens"])
    if (token.is_object() && token.contains("content") && token.contains("id") &&
        token["content"].is_string() && token["id"].is_number_integer())
      added.emplace_back(token["content"].get<std::string>(), token["id"].get<int64_t>());
  const SpecialTokenIds ids = FindSpecialTokens(added);
  for (const auto& [content, id] : added) {
    if (id == ids.bos && bos->is_null()) *bos = id, *bos_token = content;
    if (id == ids.eos && eos->is_null()) *eos = id, *eos_token = content;
  }
}

nlohmann::json ReadJson(const std::string& path) {
  try {
    return nlohmann::json::parse(ReadConfigFile(path));
  } catch (const nlohmann::json::exception& e) {
    throw DataError(path + ": not valid JSON (" + e.what() + ")");
  }
}

// config.json of a Hugging Face folder: DataError naming the file when it is not a JSON object.
nlohmann::json ReadConfigJson(const std::string& path) {
  nlohmann::json c = ReadJson(path);
  if (!c.is_object()) throw DataError(path + ": not a JSON object");
  return c;
}

// The model's Hugging Face form; UsageError naming `what` when it has none.
const HfMapping& RequireHf(const ModelSpec& model, const std::string& what) {
  if (!model.hf())
    throw UsageError(what + ": model '" + model.name() + "' has no Hugging Face form");
  return *model.hf();
}

}  // namespace

void ExportHfModel(const std::string& out, const ModelSpec& model, const ParameterTable& table,
                   const float* weights, int64_t max_position_embeddings,
                   const std::string& tokenizer_path, const std::string& chat_template,
                   const std::string& end_of_turn) {
  const HfMapping& hf = RequireHf(model, "export hf");
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
    nlohmann::json bos = nullptr, eos = nullptr, bos_token = nullptr, eos_token = nullptr;
    std::string tokenizer_text;
    nlohmann::json generation_eos = nullptr;
    if (!tokenizer_path.empty()) {
      tokenizer_text = ReadConfigFile(tokenizer_path);
      nlohmann::json tokenizer = nlohmann::json::parse(tokenizer_text, nullptr, false);
      if (tokenizer.is_discarded()) throw DataError(tokenizer_path + ": not valid JSON");
      FindBosEos(tokenizer, &bos, &eos, &bos_token, &eos_token);
      generation_eos = eos;
      if (!chat_template.empty() && !end_of_turn.empty() && tokenizer.contains("added_tokens"))
        for (const auto& token : tokenizer["added_tokens"])
          if (token.is_object() && token.value("content", "") == end_of_turn &&
              token.contains("id") && token["id"].is_number_integer() && token["id"] != eos) {
            generation_eos = eos.is_null() ? nlohmann::json(token["id"])
                                           : nlohmann::json::array({eos, token["id"]});
            break;
          }
    }
    const nlohmann::ordered_json config = hf.ConfigJson(max_position_embeddings, bos, eos);
    AtomicWriteFile(JoinPath(temporary, "config.json"), config.dump(2) + "\n");
    nlohmann::ordered_json generation = {
        {"_from_model_config", true}, {"bos_token_id", bos}, {"eos_token_id", generation_eos}};
    AtomicWriteFile(JoinPath(temporary, "generation_config.json"), generation.dump(2) + "\n");
    SaveModelWeights(JoinPath(temporary, "model.safetensors"), table, model, weights,
                     [&](const ParamInfo& p) { return hf.TensorName(p); });
    if (!tokenizer_path.empty()) {
      AtomicWriteFile(JoinPath(temporary, "tokenizer.json"), tokenizer_text);
      // bos_token/eos_token make AutoTokenizer report them (lm-eval needs the EOS).
      nlohmann::ordered_json tokenizer_config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                                                 {"model_max_length", max_position_embeddings}};
      if (!bos_token.is_null()) tokenizer_config["bos_token"] = bos_token;
      if (!eos_token.is_null()) tokenizer_config["eos_token"] = eos_token;
      if (!chat_template.empty()) tokenizer_config["chat_template"] = chat_template;
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

std::shared_ptr<const ModelSpec> ReadHfModelSpec(const std::string& dir,
                                                 int64_t* max_position_embeddings) {
  const std::string config_path = JoinPath(dir, "config.json");
  if (!FileExists(config_path))
    throw UsageError(config_path + ": missing (not a Hugging Face model folder)");
  const nlohmann::json c = ReadConfigJson(config_path);
  std::shared_ptr<const ModelSpec> model = ModelSpecFromHfConfig(c, config_path);
  if (max_position_embeddings) {
    const char* key = "max_position_embeddings";
    *max_position_embeddings =
        c.contains(key) && c[key].is_number_integer() ? c[key].get<int64_t>() : 0;
  }
  return model;
}

void ImportHfModel(const std::string& dir, const ModelSpec& model, const ParameterTable& table,
                   float* weights) {
  const HfMapping& hf = RequireHf(model, "checkpoint.initial_load_hf");
  if (!IsDirectory(dir))
    throw UsageError("checkpoint.initial_load_hf: " + dir + ": no such folder");
  const std::string config_path = JoinPath(dir, "config.json");
  if (!FileExists(config_path))
    throw UsageError("checkpoint.initial_load_hf: " + config_path +
                     ": missing (not a Hugging Face model folder)");
  const nlohmann::json c = ReadConfigJson(config_path);
  const std::string theirs = ModelNameForHfConfig(c, config_path);
  std::vector<std::string> differences;
  if (theirs != model.name())
    differences.push_back("model=" + theirs + " vs model.name=" + model.name());
  else
    differences = hf.Differences(c, config_path);
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
      const std::string name = hf.TensorName(p);
      if (!index["weight_map"].contains(name) || !index["weight_map"][name].is_string())
        throw DataError(index_path + ": weight_map has no tensor '" + name + "'");
      std::string shard = index["weight_map"][name].get<std::string>();
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
    reader->ReadFloat32(hf.TensorName(p), p.shape, weights + p.offset);
    hf.FromHf(c, p, weights + p.offset);
  }
  RequireFiniteWeights(table, weights,
                       [&](const std::string& name) { return JoinPath(dir, file_of[name]); });
}

}  // namespace crucible
