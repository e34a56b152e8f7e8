// crucible eval MODEL --tasks T.jsonl... --text HELD_OUT...: multiple-choice accuracy (acc,
// acc_norm with standard errors) and perplexity / bits-per-byte, scored as lm-eval scores them.
#include "eval/eval.h"

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "common/error.h"
#include "common/files.h"
#include "common/log.h"
#include "common/strings.h"

namespace crucible {
namespace {

struct EvalCliOptions {
  std::string model, tokenizer, json_out, predictions_out;
  std::vector<std::string> tasks, texts;
  int64_t batch_size = 16, limit = 0, max_length = 0;
  bool quiet = false;
};

nlohmann::ordered_json ChoiceJson(const ChoiceResult& r) {
  return {{"path", r.path},
          {"shape", r.shape},
          {"items", r.items},
          {"acc", r.acc},
          {"acc_stderr", r.acc_stderr},
          {"acc_norm", r.acc_norm},
          {"acc_norm_stderr", r.acc_norm_stderr},
          {"chance", r.chance},
          {"truncated_requests", r.truncated_requests},
          {"seconds", r.seconds}};
}

nlohmann::ordered_json PerplexityJson(const PerplexityResult& r) {
  return {{"path", r.path},
          {"documents", r.documents},
          {"tokens", r.tokens},
          {"bytes", r.bytes},
          {"words", r.words},
          {"windows", r.windows},
          {"nats", r.nats},
          {"bits_per_byte", r.bits_per_byte},
          {"byte_perplexity", r.byte_perplexity},
          {"word_perplexity", r.word_perplexity},
          {"token_perplexity", r.token_perplexity},
          {"seconds", r.seconds}};
}

CommandRun SetupEval(CLI::App& app) {
  auto o = std::make_shared<EvalCliOptions>();
  app.add_option("MODEL", o->model,
                 "run directory, checkpoint folder (ckpt/step-<n>) or Hugging Face folder "
                 "(crucible export hf)")
      ->required();
  app.add_option(
         "-t,--tasks", o->tasks,
         "multiple-choice task files (.jsonl: ctx/endings/label, question/choices/answerKey or "
         "context/choices/gold)")
      ->take_all();
  app.add_option("--text", o->texts,
                 "held-out text for perplexity / bits-per-byte (.jsonl of {\"text\"} or a file)")
      ->take_all();
  app.add_option("--json", o->json_out, "write the results as JSON here");
  app.add_option("--predictions", o->predictions_out,
                 "write one JSON line per multiple-choice item here");
  app.add_option("--tokenizer", o->tokenizer, "tokenizer.json (default: the model's)");
  app.add_option("--batch-size", o->batch_size, "sequences per forward pass")
      ->check(CLI::Range(1, 4096));
  app.add_option("--limit", o->limit, "score only the first N items / documents of each file")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-length", o->max_length,
                 "context length in tokens, at most the model's positions (default: seq_len or "
                 "max_position_embeddings)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("-q,--quiet", o->quiet, "no phase=eval heartbeats");
  return [o]() {
    if (o->tasks.empty() && o->texts.empty())
      throw UsageError("crucible eval: nothing to do; give --tasks FILE.jsonl and/or --text FILE");
    // Read every input before the model, so bad data fails fast.
    std::vector<ChoiceTask> tasks;
    for (const auto& path : o->tasks) tasks.push_back(LoadChoiceTask(path));
    std::vector<TextDocuments> texts;
    for (const auto& path : o->texts) texts.push_back(LoadTextDocuments(path));
    for (const std::string* out : {&o->json_out, &o->predictions_out}) {
      if (out->empty()) continue;
      const std::string parent = ParentDirectory(*out);
      if (!parent.empty() && !IsDirectory(parent))
        throw UsageError(*out + ": folder " + parent + " does not exist");
    }
    EvalModel model = LoadEvalModel(o->model, o->tokenizer, o->max_length);
    PrintLine(StrFormat("phase=eval model=%s kind=%s params=%zu max_length=%lld vocab=%lld",
                        model.weights_path.c_str(), model.kind.c_str(), model.weights.size(),
                        (long long)model.max_length, (long long)model.spec->vocab_size()));
    EvalOptions options;
    options.batch_size = o->batch_size;
    options.limit = o->limit;
    options.progress = !o->quiet;

    std::vector<ChoiceResult> choice_results;
    for (const auto& task : tasks)
      choice_results.push_back(EvaluateChoiceTask(model, task, options));
    std::vector<PerplexityResult> perplexity_results;
    for (const auto& text : texts)
      perplexity_results.push_back(EvaluatePerplexity(model, text, options));

    if (!choice_results.empty()) {
      std::printf("\n%-24s %-9s %6s %17s %17s %7s\n", "task", "shape", "items", "acc", "acc_norm",
                  "chance");
      for (const auto& r : choice_results)
        std::printf("%-24s %-9s %6lld %8.4f ± %6.4f %8.4f ± %6.4f %7.4f\n", r.name.c_str(),
                    r.shape.c_str(), (long long)r.items, r.acc, r.acc_stderr, r.acc_norm,
                    r.acc_norm_stderr, r.chance);
    }
    if (!perplexity_results.empty()) {
      std::printf("\n%-24s %6s %9s %10s %14s %10s %10s %10s\n", "text", "docs", "tokens", "bytes",
                  "bits_per_byte", "byte_ppl", "word_ppl", "token_ppl");
      for (const auto& r : perplexity_results)
        std::printf("%-24s %6lld %9lld %10lld %14.6f %10.4f %10.3f %10.3f\n", r.name.c_str(),
                    (long long)r.documents, (long long)r.tokens, (long long)r.bytes,
                    r.bits_per_byte, r.byte_perplexity, r.word_perplexity, r.token_perplexity);
    }
    std::fflush(stdout);

    if (!o->json_out.empty()) {
      nlohmann::ordered_json out = {{"model", model.weights_path},
                                    {"kind", model.kind},
                                    {"max_length", model.max_length},
                                    {"limit", o->limit},
                                    {"tasks", nlohmann::ordered_json::object()},
                                    {"perplexity", nlohmann::ordered_json::object()}};
      for (const auto& r : choice_results) out["tasks"][r.name] = ChoiceJson(r);
      for (const auto& r : perplexity_results) out["perplexity"][r.name] = PerplexityJson(r);
      AtomicWriteFile(o->json_out, out.dump(2) + "\n");
    }
    if (!o->predictions_out.empty()) {
      std::string lines;
      for (const auto& r : choice_results)
        for (size_t i = 0; i < r.results.size(); ++i) {
          const ChoiceItemResult& item = r.results[i];
          nlohmann::ordered_json row = {{"task", r.name},
                                        {"doc_id", i},
                                        {"line", item.line},
                                        {"gold", item.gold},
                                        {"pred", item.pred},
                                        {"pred_norm", item.pred_norm},
                                        {"acc", item.pred == item.gold ? 1 : 0},
                                        {"acc_norm", item.pred_norm == item.gold ? 1 : 0},
                                        {"loglikelihoods", item.loglikelihoods},
                                        {"is_greedy", item.is_greedy},
                                        {"choice_lengths", item.choice_lengths},
                                        {"continuation_tokens", item.continuation_tokens}};
          lines += row.dump() + "\n";
        }
      AtomicWriteFile(o->predictions_out, lines);
    }
    return kExitOk;
  };
}

CommandRegistrar eval_registrar(
    "eval",
    "score a model on multiple-choice tasks (acc, acc_norm) and held-out text "
    "(bits-per-byte), as lm-eval does",
    SetupEval);

}  // namespace
}  // namespace crucible
