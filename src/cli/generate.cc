// crucible generate MODEL --prompt TEXT...: text from a run, a checkpoint or a Hugging Face
// folder, through the engine (infer/engine.h) with a KV cache. stdout carries the output alone
// (the text, streamed for one prompt, or --json); the phase= lines go to stderr.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "common/error.h"
#include "common/files.h"
#include "common/log.h"
#include "common/strings.h"
#include "eval/eval.h"
#include "infer/engine.h"

namespace crucible {
namespace {

// Flushes stdout; a failed write is recorded for main()'s exit 74 with its errno (a later
// fprintf to stderr would overwrite errno).
void FlushStdout() {
  if (std::fflush(stdout) != 0) RecordStdoutError(errno);
}

struct GenerateCliOptions {
  std::string model, tokenizer, prompts_file, dtype = "f32";
  std::vector<std::string> prompts;
  SamplingParams params;
  int64_t batch_size = 8, max_length = 0;
  bool json = false, chat = false, ignore_eos = false;
};

// The prompts of a .jsonl file: one {"prompt": "..."} object per line, blank lines skipped.
std::vector<std::string> ReadPrompts(const std::string& path) {
  if (!FileExists(path)) throw UsageError("--prompts " + path + ": no such file");
  const std::string text = ReadFile(path);
  std::vector<std::string> prompts;
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
    if (!value.is_object() || !value.contains("prompt") || !value["prompt"].is_string())
      throw DataError(where + ": expected {\"prompt\": \"...\"}");
    prompts.push_back(value["prompt"].get<std::string>());
  }
  return prompts;
}

// --chat: only the hook. The chat template support comes with the SFT issue.
void RefuseChat(const std::string& model) {
  bool has_template = FileExists(JoinPath(model, "chat_template.jinja"));
  const std::string config = JoinPath(model, "tokenizer_config.json");
  if (FileExists(config)) {
    try {
      has_template =
          has_template || nlohmann::json::parse(ReadFile(config)).contains("chat_template");
    } catch (const nlohmann::json::exception&) {
    }
  }
  if (!has_template)
    throw UsageError("--chat: " + model +
                     " has no chat template (tokenizer_config.json chat_template or "
                     "chat_template.jinja); give plain prompts without --chat");
  throw UsageError("--chat: " + model +
                   " has a chat template, but applying chat templates is not supported yet; give "
                   "the formatted prompt without --chat");
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
  app.add_option("--prompts", o->prompts_file, "a .jsonl file of {\"prompt\": ...} lines");
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
  app.add_flag("--chat", o->chat, "apply the model's chat template (not supported yet)");
  return [o]() {
    SamplingParams& params = o->params;
    params.stop_at_eos = !o->ignore_eos;
    CheckSamplingParams(params);
    WeightType weight_type;
    if (!ParseWeightType(o->dtype, &weight_type))
      throw UsageError("--dtype '" + o->dtype + "': expected f32, f16 or bf16");
    if (o->chat) RefuseChat(o->model);
    std::vector<std::string> prompts = o->prompts;
    if (!o->prompts_file.empty()) {
      const std::vector<std::string> more = ReadPrompts(o->prompts_file);
      prompts.insert(prompts.end(), more.begin(), more.end());
    }
    if (prompts.empty())
      throw UsageError("crucible generate: no prompt; give --prompt TEXT or --prompts FILE.jsonl");
    for (size_t i = 0; i < prompts.size(); ++i)
      if (prompts[i].empty()) throw UsageError("prompt " + std::to_string(i) + " is empty");

    EvalModel model = LoadEvalModel(o->model, o->tokenizer, o->max_length);
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
                 inference->scratch_bytes(), inference->weight_bytes(), WeightTypeName(weight_type));
    const int64_t eos = model.tokenizer.eos_id();
    Engine engine(*inference, &model.tokenizer, eos);
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
        results.push_back({{"index", i},
                           {"prompt", prompts[i]},
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
          {"model", model.weights_path}, {"kind", model.kind},  {"max_length", model.max_length},
          {"batch_size", slots},         {"seed", params.seed}, {"dtype", o->dtype},
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
