// crucible export hf RUN_OR_CKPT OUT: a Hugging Face LlamaForCausalLM folder from a run
// directory (its newest checkpoint that verifies, else its final model.safetensors) or from one
// checkpoint folder.
#include <memory>

#include "ckpt/checkpoint.h"
#include "ckpt/hf.h"
#include "ckpt/model_weights.h"
#include "cli/command.h"
#include "common/config.h"
#include "common/error.h"
#include "common/files.h"
#include "common/log.h"
#include "common/strings.h"
#include "model/model.h"

namespace crucible {
namespace {

struct ExportOptions {
  std::string source, out;
};

// The weights file and the config that describes it.
struct ExportSource {
  std::string weights_path, config_path;
};

ExportSource ResolveSource(const std::string& source) {
  if (!IsDirectory(source)) throw UsageError(source + ": no such run or checkpoint folder");
  if (FileExists(JoinPath(source, "MANIFEST")) || FileExists(JoinPath(source, "COMPLETE"))) {
    std::string failure = VerifyCheckpoint(source);
    if (!failure.empty()) throw DataError(source + ": " + failure);
    return {JoinPath(source, "model.safetensors"), JoinPath(source, "config.toml")};
  }
  if (!FileExists(JoinPath(source, "config.toml")))
    throw UsageError(source +
                     ": neither a checkpoint (MANIFEST) nor a run directory (config.toml)");
  const RunWeights run =
      FindRunWeights(source, "export", [](const std::string& line) { LogWarn(line); });
  return {run.weights_path, run.config_path};
}

CommandRun SetupExport(CLI::App& app) {
  auto o = std::make_shared<ExportOptions>();
  app.require_subcommand(1);
  CLI::App* hf = app.add_subcommand(
      "hf",
      "write a Hugging Face LlamaForCausalLM folder (config.json, model.safetensors, "
      "generation_config.json, tokenizer.json when [model] tokenizer_path is set)");
  hf->add_option("RUN_OR_CKPT", o->source, "run directory or checkpoint folder")->required();
  hf->add_option("OUT", o->out, "output folder (must not exist, or be empty)")->required();
  return [o, hf]() {
    if (!hf->parsed()) return kExitUsage;
    ExportSource source = ResolveSource(o->source);
    Config config = Config::Parse(ReadConfigFile(source.config_path), source.config_path);
    const std::shared_ptr<const ModelSpec> model = BuildModelSpec(config);
    const ParameterTable table = model->BuildTable();
    std::vector<float> weights(table.total());
    LoadModelWeights(source.weights_path, table, weights.data());
    const std::string& tokenizer = config.String("model.tokenizer_path");
    if (!tokenizer.empty() && !FileExists(tokenizer))
      throw UsageError(source.config_path + ": model.tokenizer_path " + tokenizer +
                       ": no such file (run from the folder the run started in)");
    ExportHfModel(o->out, *model, table, weights.data(), config.Int("training.seq_len"), tokenizer);
    PrintLine(StrFormat("exported %s -> %s (%s, %zu parameters%s)", source.weights_path.c_str(),
                        o->out.c_str(), model->hf()->architecture().c_str(), table.total(),
                        tokenizer.empty() ? ", no tokenizer" : ", with tokenizer.json"));
    return kExitOk;
  };
}

CommandRegistrar export_registrar("export",
                                  "export a run or checkpoint: crucible export hf RUN_OR_CKPT OUT",
                                  SetupExport);

}  // namespace
}  // namespace crucible
