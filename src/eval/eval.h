// Evaluation as ground truth: multiple-choice log-likelihood tasks and perplexity /
// bits-per-byte, scored exactly as lm-evaluation-harness (lm-eval 0.4.3, Hugging Face backend)
// scores them, so `crucible eval` and `lm_eval --model hf` on an export agree item by item.
//
// Multiple choice. Each choice is a request (context, " " + choice) (target_delimiter " ").
// Trailing whitespace of the context (Python's rstrip(), eval/python_text.h) moves to the front
// of the continuation; the continuation's
// tokens are encode(context + continuation)[len(encode(context)):], without special tokens; the
// model reads the last max_length + 1 tokens of context + continuation minus the final one, and
// the request's log-likelihood is the sum of the continuation tokens' log-probabilities.
// pred = argmax ll, pred_norm = argmax ll / len(choice) with len counted in Unicode code points
// as Python's len(str) does (lm-eval's "byte-length" normalisation; bytes for ASCII); ties go to
// the first choice (numpy argmax). acc and acc_norm are means over items, their standard error
// the sample standard deviation / sqrt(n).
//
// Perplexity. Each document is encoded whole and scored in lm-eval's rolling windows (prefix
// token, then disjoint windows of max_length predicted tokens, each with the longest context
// that fits). bits_per_byte = total nats / (UTF-8 bytes * ln 2), byte and word perplexity as
// lm-eval's weighted_perplexity (words = re.split(r"\s+", text), Unicode whitespace as Python's
// re), token perplexity per token.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace crucible {

// A model ready to score: its spec, fp32 weights (its table's layout), tokenizer and context
// length.
struct EvalModel {
  std::shared_ptr<const ModelSpec> spec;
  std::vector<float> weights;
  Tokenizer tokenizer;
  int64_t max_length = 0;        // tokens the model reads at once (lm-eval's max_length)
  int64_t prefix_token_id = -1;  // before an empty context / a document: BOS, else EOS, else 0
  std::string weights_path;      // what was loaded, for reports
  std::string kind;              // "checkpoint", "run" or "hf"
};

// Loads a run directory (its newest checkpoint that verifies, else its final
// model.safetensors, with the run's config.toml), one checkpoint folder (ckpt/step-<n>), or a
// Hugging Face folder (config.json + model.safetensors + tokenizer.json, as `crucible export hf`
// writes). `tokenizer_path` overrides the tokenizer (needed when [model] tokenizer_path is
// unset or relative to another folder); `max_length` > 0 overrides the context length, up to the
// model's positions (training.seq_len, max_position_embeddings; UsageError above them).
EvalModel LoadEvalModel(const std::string& path, const std::string& tokenizer_path,
                        int64_t max_length);

// One multiple-choice question, in the shape-independent form lm-eval builds from a doc.
struct ChoiceItem {
  std::string context;
  std::vector<std::string> choices;
  int gold = 0;
  int64_t line = 0;  // 1-based line in the task file
};

struct ChoiceTask {
  std::string name;  // file name without .jsonl
  std::string path;
  std::string shape;  // "hellaswag", "arc" or "generic"
  std::vector<ChoiceItem> items;
};

// Reads a JSONL task, one JSON object per line (blank lines skipped), every line of one shape:
//   hellaswag: ctx, endings, label (int or digit string); with activity_label, ctx_a and ctx_b the
//              context and endings get lm-eval's hellaswag preprocessing, with Python's Unicode
//              strip() and capitalize()
//   arc:       question, choices {text: [...], label: [...]}, answerKey; context is
//              "Question: <question>\nAnswer:" (lm-eval's arc_easy / arc_challenge)
//   generic:   context, choices, gold (int)
// UsageError if the file is missing; DataError naming file:line for malformed JSON, an unknown or
// mixed shape, fewer than 2 choices, or a label out of range.
ChoiceTask LoadChoiceTask(const std::string& path);
// A task's or text's name: its file name without .jsonl, .json or .txt.
std::string EvalFileName(const std::string& path);

struct EvalOptions {
  int64_t batch_size = 16;  // sequences per forward pass
  int64_t limit = 0;        // score only the first `limit` items / documents (0: all)
  bool progress = true;     // phase=eval heartbeats on stdout every ~2 s
};

struct ChoiceItemResult {
  int64_t line = 0;
  int gold = 0, pred = 0, pred_norm = 0;
  std::vector<double> loglikelihoods;
  std::vector<bool> is_greedy;
  std::vector<int64_t> choice_lengths;  // code points, the acc_norm divisor
  std::vector<int64_t> continuation_tokens;
};

struct ChoiceResult {
  std::string name, path, shape;
  int64_t items = 0;
  double acc = 0, acc_stderr = 0, acc_norm = 0, acc_norm_stderr = 0;
  double chance = 0;               // mean of 1/choices
  int64_t truncated_requests = 0;  // requests longer than max_length + 1 (left-truncated)
  double seconds = 0;
  std::vector<ChoiceItemResult> results;
};

ChoiceResult EvaluateChoiceTask(const EvalModel& model, const ChoiceTask& task,
                                const EvalOptions& options);

// Held-out text: a .jsonl of {"text": ...} documents, or any other file read as one document.
struct TextDocuments {
  std::string name, path;
  std::vector<std::string> documents;
};
TextDocuments LoadTextDocuments(const std::string& path);

struct PerplexityResult {
  std::string name, path;
  int64_t documents = 0, tokens = 0, bytes = 0, words = 0, windows = 0;
  double nats = 0;  // -sum of log-likelihoods
  double bits_per_byte = 0, byte_perplexity = 0, word_perplexity = 0, token_perplexity = 0;
  double seconds = 0;
};

PerplexityResult EvaluatePerplexity(const EvalModel& model, const TextDocuments& text,
                                    const EvalOptions& options);

// Sample standard deviation / sqrt(n) of 0/1 outcomes with `hits` ones (lm-eval's mean_stderr).
double MeanStderr(int64_t hits, int64_t n);

// Unicode code points of UTF-8 text (bytes that are not a valid sequence count one each).
int64_t CodePoints(const std::string& text);

}  // namespace crucible
