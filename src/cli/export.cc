// crucible export hf RUN_OR_CKPT OUT: a Hugging Face LlamaForCausalLM folder, and crucible
// export gguf RUN_OR_CKPT OUT.gguf: one GGUF file for llama.cpp, from a run directory (its newest
// checkpoint that verifies, else its final model.safetensors) or from one checkpoint folder.
// export hf --chat-template NAME (by default, the named template the run's tokenizer_config.json
// carries) writes crucible's Jinja for it into tokenizer_config.json (sft/chat_template_jinja.h).
#include <memory>

#include "ckpt/checkpoint.h"
#include "ckpt/gguf.h"
#include "ckpt/hf.h"
#include "ckpt/model_weights.h"
#include "cli/command.h"
#include "common/config.h"
#include "common/error.h"
#include "common/files.h"
#include "common/log.h"
#include "common/strings.h"
#include "model/model.h"
#include "sft/chat_template.h"
#include "sft/chat_template_jinja.h"
#include "tokenizer/tokenizer.h"

namespace crucible {
namespace {

struct ExportOptions {
  std::string source, out;
  std::string dtype = "f32", name, chat_template;
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

// The model a source holds: its config, spec, table and weights, and its tokenizer path (""
// when [model] tokenizer_path is unset; UsageError when it names a missing file).
struct LoadedModel {
  ExportSource source;
  Config config = Config::Defaults();
  std::shared_ptr<const ModelSpec> model;
  ParameterTable table;
  std::vector<float> weights;
  std::string tokenizer;
};

LoadedModel LoadSource(const std::string& path) {
  LoadedModel m;
  m.source = ResolveSource(path);
  m.config = Config::Parse(ReadConfigFile(m.source.config_path), m.source.config_path);
  m.model = BuildModelSpec(m.config);
  m.table = m.model->BuildTable();
  m.weights.resize(m.table.total());
  LoadModelWeights(m.source.weights_path, m.table, m.weights.data());
  m.tokenizer = m.config.String("model.tokenizer_path");
  if (!m.tokenizer.empty() && !FileExists(m.tokenizer))
    throw UsageError(m.source.config_path + ": model.tokenizer_path " + m.tokenizer +
                     ": no such file (run from the folder the run started in)");
  return m;
}

// The Jinja text export hf writes as chat_template ("" for none): crucible's for `name`, or, when
// no name is given, for the run's [sft] chat_template, else for the named template the run's
// tokenizer_config.json (beside its tokenizer.json) carries. The tokenizer must hold the template's
// markers as single tokens, and the Jinja must detect as the template it stands for.
std::string ExportChatTemplate(const LoadedModel& m, std::string name) {
  const std::string config_path =
      m.tokenizer.empty()
          ? ""
          : JoinPath(ParentDirectory(m.tokenizer).empty() ? "." : ParentDirectory(m.tokenizer),
                     "tokenizer_config.json");
  // An SFT run's own template ([sft] chat_template) comes first: what it was trained with.
  if (name.empty()) name = m.config.String("sft.chat_template");
  TokenizerChatConfig recorded;
  if (!config_path.empty() && FileExists(config_path))
    recorded = ReadTokenizerChatConfig(config_path);
  if (name.empty()) {
    if (!recorded.has_chat_template) return "";
    ChatTemplateMatch match =
        MatchChatTemplate(recorded.chat_template, recorded.special_tokens, config_path);
    if (match.name.empty()) {
      LogWarn("export hf: " + match.refusal + "; the export carries no chat_template");
      return "";
    }
    name = match.name;
  }
  if (m.tokenizer.empty())
    throw UsageError("--chat-template " + name + ": " + m.source.config_path +
                     " has no [model] tokenizer_path, so the export has no tokenizer_config.json "
                     "to carry a chat template");
  const Tokenizer tokenizer = Tokenizer::Load(m.tokenizer);
  RequireChatMarkers(tokenizer, name, "the tokenizer " + m.tokenizer);
  nlohmann::ordered_json special = nlohmann::ordered_json::object();
  if (tokenizer.bos_id() >= 0)
    special["bos_token"] = tokenizer.IdToToken(static_cast<uint32_t>(tokenizer.bos_id()));
  if (tokenizer.eos_id() >= 0)
    special["eos_token"] = tokenizer.IdToToken(static_cast<uint32_t>(tokenizer.eos_id()));
  const std::string& jinja = ChatTemplateJinja(name);
  const ChatTemplateMatch check =
      MatchChatTemplate(jinja, special, "crucible's " + name + " Jinja");
  if (check.name != name)
    throw Error(kExitFailure, "export hf: " + check.refusal + " (a crucible bug)");
  return jinja;
}

// The last component of a path, without trailing slashes: general.name's default.
std::string BaseName(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
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
  hf->add_option("--chat-template", o->chat_template,
                 "write this named chat template (" + ChatTemplateNameList() +
                     ") into tokenizer_config.json as crucible's Jinja (default: the named "
                     "template the run's tokenizer_config.json carries, if any)");
  CLI::App* gguf = app.add_subcommand(
      "gguf",
      "write one GGUF v3 file that llama.cpp runs as is: architecture \"llama\" (Llama) or "
      "\"deepseek2\" (DeepSeek-V3), llama.cpp's tensor names (RoPE rows interleaved for its "
      "RoPE), the tokenizer from [model] tokenizer_path (byte-level BPE, Llama-3 or GPT-2 "
      "pre-tokenizer; required) (docs/generation.md)");
  gguf->add_option("RUN_OR_CKPT", o->source, "run directory or checkpoint folder")->required();
  gguf->add_option("OUT", o->out, "output .gguf file (replaced atomically)")->required();
  gguf->add_option("--dtype", o->dtype,
                   "matrices as f32, f16 or bf16 (rounded to nearest even) or q8_0 (ggml's "
                   "blocks of 32 with an fp16 scale); norms stay f32")
      ->capture_default_str();
  gguf->add_option("--name", o->name, "general.name (default: the source folder's name)");
  return [o, hf, gguf]() {
    if (gguf->parsed()) {
      const GgufFileType type = ParseGgufFileType(o->dtype);
      const LoadedModel m = LoadSource(o->source);
      const size_t bytes = ExportGgufModel(o->out, *m.model, m.table, m.weights.data(),
                                           m.config.Int("training.seq_len"), m.tokenizer, type,
                                           o->name.empty() ? BaseName(o->source) : o->name);
      PrintLine(StrFormat("exported %s -> %s (gguf %s, %zu parameters, %s)",
                          m.source.weights_path.c_str(), o->out.c_str(),
                          GgufFileTypeName(type).c_str(), m.table.total(),
                          HumanBytes(static_cast<double>(bytes)).c_str()));
      return kExitOk;
    }
    if (!hf->parsed()) return kExitUsage;
    if (!o->chat_template.empty()) CheckChatTemplateName(o->chat_template);
    const LoadedModel m = LoadSource(o->source);
    const std::string chat_template = ExportChatTemplate(m, o->chat_template);
    std::string chat_name = o->chat_template;
    for (const std::string& name : ChatTemplateNames())
      if (!chat_template.empty() && ChatTemplateJinja(name) == chat_template) chat_name = name;
    ExportHfModel(o->out, *m.model, m.table, m.weights.data(), m.config.Int("training.seq_len"),
                  m.tokenizer, chat_template,
                  chat_template.empty() ? "" : ChatTemplateEndOfTurn(chat_name));
    PrintLine(StrFormat("exported %s -> %s (%s, %zu parameters%s%s)", m.source.weights_path.c_str(),
                        o->out.c_str(), m.model->hf()->architecture().c_str(), m.table.total(),
                        m.tokenizer.empty() ? ", no tokenizer" : ", with tokenizer.json",
                        chat_template.empty() ? "" : (", chat_template=" + chat_name).c_str()));
    return kExitOk;
  };
}

CommandRegistrar export_registrar("export",
                                  "export a run or checkpoint: crucible export hf RUN_OR_CKPT "
                                  "OUT, crucible export gguf RUN_OR_CKPT OUT.gguf",
                                  SetupExport);

}  // namespace
}  // namespace crucible
