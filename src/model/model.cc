// The model registry: [model] name -> the family that builds it, and Hugging Face model_type ->
// the family that reads it.
#include "model/model.h"

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/registry.h"
#include "common/strings.h"

namespace crucible {
namespace {

struct Entry {
  ModelSpecBuilder build;
  HfFamily hf;
  std::vector<const char*> own_keys;
};

Registry<Entry>& Models() {
  static Registry<Entry> registry("model");
  return registry;
}

const Entry& Find(const std::string& name) {
  return Models().Find(name, "model.name");
}

}  // namespace

LossSum Model::Retarget(const int32_t*) {
  throw UsageError(
      "this model cannot replace the targets of a forward pass, which the optimizer's Hessian "
      "estimate needs (optimizer.name); choose another optimizer");
}

LossSum Model::Reweight(const float*) {
  throw Error(kExitFailure, "internal: this model cannot replace the loss weights of a forward");
}

std::unique_ptr<InferenceModel> ModelSpec::StartInference(ParameterAccess&, int64_t, int64_t,
                                                          std::shared_ptr<ComputeBackend>,
                                                          WeightType) const {
  throw UsageError("model '" + name() +
                   "' has no inference path yet (prefill and decode with a KV cache); generation "
                   "runs the llama and deepseek_v3 families");
}

ModelRegistrar::ModelRegistrar(const char* name, ModelSpecBuilder build, HfFamily hf,
                               std::vector<const char*> own_keys) {
  Models().Add(name, Entry{build, hf, std::move(own_keys)});
}

std::vector<std::string> RegisteredModels() {
  return Models().Names();
}

std::shared_ptr<const ModelSpec> BuildModelSpec(Config& config) {
  const std::string name = config.String("model.name");
  const Entry& entry = Find(name);
  // A key of another family is refused when it was given a value other than its default: a run's
  // recorded config.toml writes every key, the other families' at their defaults.
  const Config defaults = Config::Defaults();
  for (const auto& [other, family] : Models().entries()) {
    if (other == name) continue;
    for (const char* key : family.own_keys) {
      bool ours = false;
      for (const char* own : entry.own_keys) ours |= std::string(own) == key;
      if (!ours && config.IsSet(key) && config.Value(key) != defaults.Value(key))
        throw UsageError(
            StrFormat("%s (%s): a key of model.name = \"%s\", not of \"%s\"; remove "
                      "it or set model.name = \"%s\"",
                      key, config.Origin(key).c_str(), other.c_str(), name.c_str(), other.c_str()));
    }
  }
  std::shared_ptr<const ModelSpec> spec = entry.build(config);
  if (spec->name() != name)
    throw Error(kExitFailure, "internal: model '" + name + "' built a spec named " + spec->name());
  return spec;
}

std::string ModelNameForHfConfig(const nlohmann::json& config, const std::string& path) {
  if (!config.contains("model_type")) return Config::Defaults().String("model.name");
  const nlohmann::json& type = config["model_type"];
  std::string supported;
  for (const auto& [name, entry] : Models().entries()) {
    if (!entry.hf.model_type) continue;
    if (type.is_string() && type.get<std::string>() == entry.hf.model_type) return name;
    supported += StrFormat("%s'%s' (%s)", supported.empty() ? "" : " or ", entry.hf.model_type,
                           entry.hf.architecture);
  }
  const std::string quoted =
      type.is_string() ? StrFormat("'%s'", type.get<std::string>().c_str()) : type.dump();
  throw DataError(path + ": model_type " + quoted +
                  " is not supported: crucible reads only model_type " + supported);
}

std::shared_ptr<const ModelSpec> ModelSpecFromHfConfig(const nlohmann::json& config,
                                                       const std::string& path) {
  const std::string name = ModelNameForHfConfig(config, path);
  const Entry& entry = Find(name);
  if (!entry.hf.read)
    throw DataError(path + ": model '" + name + "' cannot be read from a Hugging Face folder");
  return entry.hf.read(config, path);
}

}  // namespace crucible
