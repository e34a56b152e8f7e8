// crucible generate MODEL --prompt TEXT...: text from a run, a checkpoint or a Hugging Face
// folder, through the engine (infer/engine.h) with a KV cache. stdout carries the output alone
// (the text, streamed for one prompt, or --json); the phase= lines go to stderr. With --chat each
// prompt is a conversation rendered by a named chat template (sft/chat_template.h): the one given,
// or the one the model's tokenizer_config.json carries, detected by its rendering.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "common/config.h"
#include "common/error.h"
#include "common/files.h"
#include "common/log.h"
#include "common/strings.h"
#include "eval/eval.h"
#include "infer/engine.h"
#include "sft/chat_template.h"
#include "sft/chat_template_jinja.h"

namespace crucible {
namespace {

// Flushes stdout; a failed write is recorded for main()'s exit 74 with its errno (a later
// fprintf to stderr would overwrite errno).
void FlushStdout() {
  if (std::fflush(stdout) != 0) RecordStdoutError(errno);
}

struct GenerateCliOptions {
  std::string model, tokenizer, prompts_file, dtype = "f32", chat_template;
  std::vector<std::string> prompts;
  SamplingParams params;
  int64_t batch_size = 8, max_length = 0;
  bool json = false, chat = false, ignore_eos = false;
};

// One prompt: plain text, or (a --prompts line's {"messages": [...]}) a conversation.
struct PromptInput {
  std::string prompt;
  std::vector<ChatMessage> messages;
  bool has_messages = false;
  std::string where;  // "--prompt 0", "FILE:LINE"
};

// The prompts of a .jsonl file: one {"prompt": "..."} or {"messages": [{"role", "content"}...]}
// object per line, blank lines skipped.
std::vector<PromptInput> ReadPrompts(const std::string& path) {
  if (!FileExists(path)) throw UsageError("--prompts " + path + ": no such file");
  const std::string text = ReadFile(path);
  std::vector<PromptInput> prompts;
  size_t begin = 0;
  for (int64_t line = 1; begin <= text.size(); ++line) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string row = text.substr(begin, end - begin);
    begin = end + 1;
    if (!row.empty() && row.back() == '\r') row.pop_back();
    if (row.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line);
    nlohmann::json value;
    try {
      value = nlohmann::json::parse(row);
    } catch (const nlohmann::json::exception& e) {
      throw DataError(where + ": not a JSON object (" + e.what() + ")");
    }
    PromptInput input;
    input.where = where;
    if (value.is_object() && value.contains("messages")) {
      input.messages = ChatMessagesFromJson(value["messages"], where);
      input.has_messages = true;
      if (input.messages.empty()) throw DataError(where + ": \"messages\" is empty");
    } else if (value.is_object() && value.contains("prompt") && value["prompt"].is_string()) {
      input.prompt = value["prompt"].get<std::string>();
    } else {
      throw DataError(where + ": expected {\"prompt\": \"...\"} or {\"messages\": [...]}");
    }
    prompts.push_back(std::move(input));
  }
  return prompts;
}

// The chat template --chat renders with, and the special tokens it is given.
struct ChatSetup {
  std::string name;
  ChatTokens tokens;
  bool tokens_from_config = false;  // else they come from the tokenizer
};

// The tokenizer_config.json that says a model's chat template: a Hugging Face folder's own; for a
// run directory or checkpoint, the one beside its tokenizer (--tokenizer, else [model]
// tokenizer_path). "" when there is no tokenizer to look beside.
std::string TokenizerConfigPath(const std::string& model, const std::string& tokenizer) {
  const bool is_checkpoint =
      FileExists(JoinPath(model, "MANIFEST")) || FileExists(JoinPath(model, "COMPLETE"));
  const std::string toml = JoinPath(model, "config.toml");
  if (!is_checkpoint && !FileExists(toml) && FileExists(JoinPath(model, "config.json")))
    return JoinPath(model, "tokenizer_config.json");
  std::string path = tokenizer;
  if (path.empty() && FileExists(toml))
    path = Config::Parse(ReadConfigFile(toml), toml).String("model.tokenizer_path");
  if (path.empty()) return "";
  const std::string parent = ParentDirectory(path);
  return JoinPath(parent.empty() ? "." : parent, "tokenizer_config.json");
}

// Resolves --chat before the weights load: the named template (--chat-template), a run's [sft]
// chat_template, or the one the model's tokenizer_config.json carries (refused in one line when
// there is none, or when it is not one of the named templates).
ChatSetup ResolveChat(const std::string& model, const std::string& tokenizer,
                      const std::string& name) {
  ChatSetup chat;
  if (!name.empty()) CheckChatTemplateName(name);
  const std::string config_path =
      IsDirectory(model) ? TokenizerConfigPath(model, tokenizer) : std::string();
  TokenizerChatConfig config;
  if (!config_path.empty() && FileExists(config_path)) {
    config = ReadTokenizerChatConfig(config_path);
    chat.tokens_from_config = true;
    if (config.special_tokens.contains("bos_token"))
      chat.tokens.bos_token = config.special_tokens["bos_token"].get<std::string>();
    if (config.special_tokens.contains("eos_token"))
      chat.tokens.eos_token = config.special_tokens["eos_token"].get<std::string>();
  }
  if (!name.empty()) {
    chat.name = name;
    return chat;
  }
  // A run (or its checkpoint) fine-tuned with [sft] chat_template: the template it was trained
  // with, before its tokenizer_config.json.
  if (const std::string toml = JoinPath(model, "config.toml");
      IsDirectory(model) && FileExists(toml))
    if (std::string trained = Config::Parse(ReadConfigFile(toml), toml).String("sft.chat_template");
        !trained.empty()) {
      CheckChatTemplateName(trained);
      chat.name = trained;
      return chat;
    }
  if (!config.has_chat_template)
    throw UsageError("--chat: " + model + " has no chat template (" +
                     (config_path.empty() ? std::string("no tokenizer to look beside")
                                          : "none in " + config_path) +
                     "); pass --chat-template NAME (one of " + ChatTemplateNameList() +
                     "), or give plain prompts without --chat");
  ChatTemplateMatch match =
      MatchChatTemplate(config.chat_template, config.special_tokens, config_path);
  if (match.name.empty()) throw UsageError("--chat: " + match.refusal);
  chat.name = match.name;
  return chat;
}

// Every marker the template writes must be one token of the model's tokenizer, as it was in
// training; the end-of-turn marker's id, which ends generation as EOS does.
int64_t CheckChatMarkers(const Tokenizer& tokenizer, ChatSetup* chat, const std::string& model) {
  if (!chat->tokens_from_config && tokenizer.bos_id() >= 0)
    chat->tokens.bos_token = tokenizer.IdToToken(static_cast<uint32_t>(tokenizer.bos_id()));
  if (!chat->tokens_from_config && tokenizer.eos_id() >= 0)
    chat->tokens.eos_token = tokenizer.IdToToken(static_cast<uint32_t>(tokenizer.eos_id()));
  try {
    RequireChatMarkers(tokenizer, chat->name, "the tokenizer of " + model);
  } catch (const Error& e) {
    throw UsageError(std::string("--chat: ") + e.what());
  }
  return tokenizer.TokenToId(ChatTemplateEndOfTurn(chat->name));
}

// The text a streamed sequence can print now: what is new since `printed` bytes. While it runs,
// held back: a decoded text ending in U+FFFD (a character whose bytes are not all generated yet)
// and its last `hold` bytes (the longest stop string but one, which a stop may still cut).
std::string StreamDelta(const Sequence& s, size_t hold, size_t* printed) {
  static const std::string kReplacement = "\xEF\xBF\xBD";
  const std::string& text = s.text;
  size_t end = text.size();
  if (s.finish == FinishReason::kNone) {
    if (text.size() >= kReplacement.size() &&
        text.compare(text.size() - kReplacement.size(), kReplacement.size(), kReplacement) == 0)
      return "";
    end = end > hold ? end - hold : 0;
    while (end > 0 && end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80)
      --end;  // not inside a character
  }
  if (end <= *printed) return "";
  std::string delta = text.substr(*printed, end - *printed);
  *printed = end;
  return delta;
}

CommandRun SetupGenerate(CLI::App& app) {
  auto o = std::make_shared<GenerateCliOptions>();
  SamplingParams& p = o->params;
  app.add_option("MODEL", o->model,
                 "run directory, checkpoint folder (ckpt/step-<n>) or Hugging Face folder "
                 "(crucible export hf)")
      ->required();
  app.add_option("-p,--prompt", o->prompts, "a prompt (repeatable)")->take_all();
  app.add_option("--prompts", o->prompts_file,
                 "a .jsonl file of {\"prompt\": ...} lines (with --chat, also {\"messages\": "
                 "[{\"role\", \"content\"}...]} lines)");
  app.add_option("--max-new-tokens", p.max_new_tokens, "tokens to generate at most per prompt")
      ->capture_default_str();
  app.add_option("--temperature", p.temperature, "0: greedy (the default); else sample")
      ->capture_default_str();
  app.add_option("--top-k", p.top_k, "keep the k largest logits (0: off)")->capture_default_str();
  app.add_option("--top-p", p.top_p,
                 "nucleus: keep the smallest set of probability >= p, in (0, 1]")
      ->capture_default_str();
  app.add_option("--min-p", p.min_p, "drop tokens below min_p x the largest probability")
      ->capture_default_str();
  app.add_option("--repetition-penalty", p.repetition_penalty,
                 "divide positive (multiply negative) logits of seen tokens by this (1: off)")
      ->capture_default_str();
  app.add_option("--stop", p.stop, "end a sequence when its text contains this (repeatable)")
      ->take_all();
  app.add_flag("--ignore-eos", o->ignore_eos, "keep generating after the EOS token");
  app.add_option("--seed", p.seed, "sampling seed (same seed, same tokens)")->capture_default_str();
  app.add_option("--batch-size", o->batch_size, "sequences decoded together (KV-cache slots)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--max-length", o->max_length,
                 "context in tokens (prompt + output), at most the model's positions (default: "
                 "seq_len or max_position_embeddings)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--tokenizer", o->tokenizer, "tokenizer.json (default: the model's)");
  app.add_option("--dtype", o->dtype,
                 "the weight matrices' type while generating: f32 (as trained), f16 or bf16 "
                 "(rounded to nearest even; decode reads half the bytes; activations, norms and "
                 "arithmetic stay float32)")
      ->capture_default_str();
  app.add_flag("--json", o->json,
               "print one JSON document: per prompt its token ids, text, log-probabilities and "
               "finish reason");
  app.add_flag("--chat", o->chat,
               "each --prompt is one user message (a --prompts line may give \"messages\"), "
               "rendered with the generation prompt by the model's chat template "
               "(tokenizer_config.json, detected by rendering) or --chat-template; generation "
               "also stops at the template's end-of-turn token");
  app.add_option("--chat-template", o->chat_template,
                 "with --chat: the named template to render with (" + ChatTemplateNameList() + ")");
  return [o]() {
    SamplingParams& params = o->params;
    params.stop_at_eos = !o->ignore_eos;
    CheckSamplingParams(params);
    WeightType weight_type;
    if (!ParseWeightType(o->dtype, &weight_type))
      throw UsageError("--dtype '" + o->dtype + "': expected f32, f16 or bf16");
    if (!o->chat_template.empty() && !o->chat) throw UsageError("--chat-template needs --chat");
    std::vector<PromptInput> inputs;
    for (size_t i = 0; i < o->prompts.size(); ++i)
      inputs.push_back({o->prompts[i], {}, false, "--prompt " + std::to_string(i)});
    if (!o->prompts_file.empty()) {
      std::vector<PromptInput> more = ReadPrompts(o->prompts_file);
      for (PromptInput& input : more) inputs.push_back(std::move(input));
    }
    if (inputs.empty())
      throw UsageError("crucible generate: no prompt; give --prompt TEXT or --prompts FILE.jsonl");
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].has_messages && !o->chat)
        throw UsageError(inputs[i].where + ": \"messages\" needs --chat");
      if (!inputs[i].has_messages && inputs[i].prompt.empty())
        throw UsageError("prompt " + std::to_string(i) + " is empty");
    }
    ChatSetup chat;
    if (o->chat) chat = ResolveChat(o->model, o->tokenizer, o->chat_template);

    EvalModel model = LoadEvalModel(o->model, o->tokenizer, o->max_length);
    int64_t end_of_turn = -1;
    if (o->chat) end_of_turn = CheckChatMarkers(model.tokenizer, &chat, o->model);
    std::vector<std::string> prompts;  // the text each prompt encodes (rendered, with --chat)
    for (PromptInput& input : inputs) {
      if (!o->chat) {
        prompts.push_back(input.prompt);
        continue;
      }
      if (!input.has_messages) input.messages = {ChatMessage{"user", input.prompt}};
      prompts.push_back(RenderChat(chat.name, input.messages, true, chat.tokens, input.where).text);
    }
    std::vector<GenerationRequest> requests;
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerationRequest request;
      for (uint32_t t : model.tokenizer.Encode(prompts[i]))
        request.prompt.push_back(static_cast<int32_t>(t));
      if (request.prompt.empty())
        throw UsageError("prompt " + std::to_string(i) + " encodes to no tokens");
      if (static_cast<int64_t>(request.prompt.size()) > model.max_length)
        throw UsageError("prompt " + std::to_string(i) + " has " +
                         std::to_string(request.prompt.size()) +
                         " tokens, more than the context of " + std::to_string(model.max_length) +
                         " (--max-length)");
      request.params = params;
      request.index = i;
      requests.push_back(std::move(request));
    }
    const int64_t slots = std::min<int64_t>(o->batch_size, static_cast<int64_t>(prompts.size()));
    const ParameterTable table = model.spec->BuildTable();
    FlatParameterAccess access(table, model.weights.data(), nullptr);
    std::unique_ptr<InferenceModel> inference = model.spec->StartInference(
        access, slots, model.max_length, DefaultCpuBackend(), weight_type);
    // The inference path holds its own copy of the weights: the loaded ones are not needed.
    std::vector<float>().swap(model.weights);
    std::fprintf(stderr,
                 "phase=kv_cache bytes=%zu slots=%lld max_len=%lld scratch_bytes=%zu "
                 "weight_bytes=%zu dtype=%s\n",
                 inference->kv_cache_bytes(), (long long)slots, (long long)model.max_length,
                 inference->scratch_bytes(), inference->weight_bytes(),
                 WeightTypeName(weight_type));
    const int64_t eos = model.tokenizer.eos_id();
    Engine engine(*inference, &model.tokenizer, eos);
    if (end_of_turn >= 0 && end_of_turn != eos) engine.AddEosId(end_of_turn);
    std::vector<int64_t> ids;
    for (GenerationRequest& request : requests) ids.push_back(engine.Add(std::move(request)));
    const bool stream = prompts.size() == 1 && !o->json;
    size_t printed = 0, hold = 0;
    for (const std::string& stop : params.stop) hold = std::max(hold, stop.size() - 1);
    int64_t generated = 0;
    const auto start = std::chrono::steady_clock::now();
    while (engine.Busy()) {
      for (int64_t id : engine.Step()) {
        ++generated;
        if (!stream) continue;
        const std::string delta = StreamDelta(engine.sequence(id), hold, &printed);
        if (!delta.empty()) {
          std::fputs(delta.c_str(), stdout);
          FlushStdout();
        }
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (stream) {
      const std::string& text = engine.sequence(ids[0]).text;
      if (text.size() > printed) std::fputs(text.c_str() + printed, stdout);
      std::fputs("\n", stdout);
    }
    nlohmann::ordered_json results = nlohmann::ordered_json::array();
    for (size_t i = 0; i < ids.size(); ++i) {
      const Sequence& s = engine.sequence(ids[i]);
      if (o->json) {
        nlohmann::ordered_json messages = nullptr;
        if (o->chat) {
          messages = nlohmann::ordered_json::array();
          for (const ChatMessage& m : inputs[i].messages)
            messages.push_back({{"role", m.role}, {"content", m.content}});
        }
        results.push_back({{"index", i},
                           {"prompt", prompts[i]},
                           {"messages", messages},
                           {"prompt_tokens", s.request.prompt},
                           {"tokens", s.tokens},
                           {"text", s.text},
                           {"logprobs", s.logprobs},
                           {"finish", FinishReasonName(s.finish)}});
      } else if (!stream) {
        std::printf("--- prompt %zu (finish=%s)\n%s%s\n", i, FinishReasonName(s.finish),
                    prompts[i].c_str(), s.text.c_str());
      }
    }
    if (o->json) {
      nlohmann::ordered_json out = {
          {"model", model.weights_path},
          {"kind", model.kind},
          {"max_length", model.max_length},
          {"batch_size", slots},
          {"seed", params.seed},
          {"dtype", o->dtype},
          {"chat_template", o->chat ? nlohmann::ordered_json(chat.name) : nullptr},
          {"end_of_turn_id", end_of_turn >= 0 ? nlohmann::ordered_json(end_of_turn) : nullptr},
          {"results", results}};
      std::printf("%s\n",
                  out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    }
    FlushStdout();
    std::fprintf(stderr, "phase=generate prompts=%zu tokens=%lld seconds=%.3f tokens_per_s=%.1f\n",
                 prompts.size(), (long long)generated, seconds,
                 seconds > 0 ? static_cast<double>(generated) / seconds : 0.0);
    return kExitOk;
  };
}

CommandRegistrar generate_registrar("generate",
                                    "generate text from a model (greedy or sampled, batched, "
                                    "with a KV cache)",
                                    SetupGenerate);

}  // namespace
}  // namespace crucible
