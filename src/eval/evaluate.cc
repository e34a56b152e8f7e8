// Loading a model to score, and the two kinds of evaluation on top of ScoreRequests.
#include <cmath>

#include "ckpt/checkpoint.h"
#include "ckpt/hf.h"
#include "ckpt/model_weights.h"
#include "common/config.h"
#include "common/error.h"
#include "common/files.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/timer.h"
#include "eval/eval.h"
#include "eval/python_text.h"
#include "eval/scorer.h"

namespace crucible {
namespace {

// lm-eval's HFLM._DEFAULT_MAX_LENGTH, for a config.json without max_position_embeddings.
constexpr int64_t kDefaultMaxLength = 2048;

Tokenizer LoadTokenizerFor(const std::string& path, const std::string& origin) {
  if (path.empty())
    throw UsageError(origin + " names no tokenizer; pass --tokenizer PATH/tokenizer.json");
  if (!FileExists(path))
    throw UsageError(path + ": no such tokenizer (named by " + origin +
                     "); pass --tokenizer PATH/tokenizer.json");
  return Tokenizer::Load(path);
}

// A --max-length above the positions the model was made for (`positions`, named by `source`; 0:
// not stated) is refused before its weights are read.
void RequireWithinPositions(int64_t max_length, int64_t positions, const std::string& source) {
  if (positions > 0 && max_length > positions)
    throw UsageError(StrFormat(
        "--max-length %lld is more than the model's %lld positions (%s); "
        "give at most %lld",
        (long long)max_length, (long long)positions, source.c_str(), (long long)positions));
}

void FinishModel(EvalModel& model, int64_t max_length) {
  if (max_length > 0) model.max_length = max_length;
  if (model.max_length <= 0) throw UsageError("--max-length must be positive");
  if (model.tokenizer.vocab_size() > model.spec->vocab_size())
    throw DataError(StrFormat(
        "the tokenizer has %lld ids but the model only %lld (vocab_size); wrong tokenizer?",
        (long long)model.tokenizer.vocab_size(), (long long)model.spec->vocab_size()));
  // lm-eval's HFLM.prefix_token_id: BOS, else EOS.
  model.prefix_token_id = model.tokenizer.bos_id() >= 0   ? model.tokenizer.bos_id()
                          : model.tokenizer.eos_id() >= 0 ? model.tokenizer.eos_id()
                                                          : 0;
}

// Mean over the items of 0/1 outcomes and its standard error.
void Accuracy(int64_t hits, int64_t n, double* mean, double* stderr_out) {
  *mean = n > 0 ? static_cast<double>(hits) / n : 0.0;
  *stderr_out = MeanStderr(hits, n);
}

// Index of the first maximum, as numpy.argmax.
int ArgMax(const std::vector<double>& values) {
  int best = 0;
  for (int i = 1; i < static_cast<int>(values.size()); ++i)
    if (values[i] > values[best]) best = i;
  return best;
}

// lm-eval's utils.get_rolling_token_windows(tokens, prefix, max_len, context_len=1) followed by
// make_disjoint_window: (context, continuation) pairs that predict every token exactly once.
std::vector<TokenRequest> RollingWindows(const std::vector<uint32_t>& tokens, uint32_t prefix,
                                         int64_t max_length) {
  std::vector<TokenRequest> windows;
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) return windows;
  const int64_t first = std::min(max_length, n);
  TokenRequest head;
  head.context = {prefix};
  head.continuation.assign(tokens.begin(), tokens.begin() + first);
  windows.push_back(std::move(head));
  for (int64_t predicted = first; predicted < n;) {
    const int64_t length = std::min(n - predicted, max_length);
    const int64_t end = predicted + length;
    TokenRequest window;
    // Input tokens[end - max_length - 1, end - 1) minus the overlap with the predictions.
    window.context.assign(tokens.begin() + (end - max_length - 1), tokens.begin() + (end - length));
    window.continuation.assign(tokens.begin() + (end - length), tokens.begin() + end);
    windows.push_back(std::move(window));
    predicted = end;
  }
  return windows;
}

// How many of `available` items or documents an evaluation scores (--limit N: the first N).
int64_t Limited(const EvalOptions& options, size_t available) {
  const int64_t n = static_cast<int64_t>(available);
  return options.limit > 0 ? std::min<int64_t>(options.limit, n) : n;
}

}  // namespace

EvalModel LoadEvalModel(const std::string& path, const std::string& tokenizer_path,
                        int64_t max_length) {
  if (!IsDirectory(path))
    throw UsageError(path + ": no such run directory, checkpoint folder or Hugging Face folder");
  EvalModel model;
  const bool is_checkpoint =
      FileExists(JoinPath(path, "MANIFEST")) || FileExists(JoinPath(path, "COMPLETE"));
  const bool has_toml = FileExists(JoinPath(path, "config.toml"));
  if (!is_checkpoint && !has_toml && FileExists(JoinPath(path, "config.json"))) {
    model.kind = "hf";
    int64_t max_positions = 0;
    model.spec = ReadHfModelSpec(path, &max_positions);
    RequireWithinPositions(max_length, max_positions,
                           "max_position_embeddings of " + JoinPath(path, "config.json"));
    const ParameterTable table = model.spec->BuildTable();
    model.weights.resize(table.total());
    ImportHfModel(path, *model.spec, table, model.weights.data());
    model.weights_path = JoinPath(path, "model.safetensors");
    const std::string tokenizer =
        tokenizer_path.empty() ? JoinPath(path, "tokenizer.json") : tokenizer_path;
    model.tokenizer = LoadTokenizerFor(tokenizer, path);
    model.max_length = max_positions > 0 ? max_positions : kDefaultMaxLength;
    FinishModel(model, max_length);
    return model;
  }
  std::string weights_path, config_path;
  if (is_checkpoint) {
    const std::string failure = VerifyCheckpoint(path);
    if (!failure.empty()) throw DataError(path + ": " + failure);
    model.kind = "checkpoint";
    weights_path = JoinPath(path, "model.safetensors");
    config_path = JoinPath(path, "config.toml");
  } else if (has_toml) {
    model.kind = "run";
    const RunWeights run =
        FindRunWeights(path, "evaluate", [](const std::string& line) { LogWarn(line); });
    weights_path = run.weights_path;
    config_path = run.config_path;
  } else {
    throw UsageError(
        path +
        ": not a run directory (config.toml), a checkpoint (MANIFEST) or a Hugging Face "
        "folder (config.json)");
  }
  Config config = Config::Parse(ReadConfigFile(config_path), config_path);
  model.spec = BuildModelSpec(config);
  RequireWithinPositions(max_length, config.Int("training.seq_len"),
                         "training.seq_len of " + config_path);
  const ParameterTable table = model.spec->BuildTable();
  model.weights.resize(table.total());
  LoadModelWeights(weights_path, table, model.weights.data());
  model.weights_path = weights_path;
  model.tokenizer = LoadTokenizerFor(
      tokenizer_path.empty() ? config.String("model.tokenizer_path") : tokenizer_path,
      config_path + " [model] tokenizer_path");
  model.max_length = config.Int("training.seq_len");
  FinishModel(model, max_length);
  return model;
}

ChoiceResult EvaluateChoiceTask(const EvalModel& model, const ChoiceTask& task,
                                const EvalOptions& options) {
  Timer timer;
  ChoiceResult result;
  result.name = task.name;
  result.path = task.path;
  result.shape = task.shape;
  const int64_t items = Limited(options, task.items.size());
  // Requests (context, " " + choice), with trailing context whitespace moved to the continuation.
  std::vector<std::string> texts;  // per request: context, then context + continuation
  std::vector<std::pair<int64_t, int>> owner;
  for (int64_t i = 0; i < items; ++i) {
    const ChoiceItem& item = task.items[i];
    // lm-eval's _encode_pair: the context's rstrip() (Unicode whitespace) moves to the front.
    const std::string context = PythonRstrip(item.context);
    const std::string moved = item.context.substr(context.size());
    for (int c = 0; c < static_cast<int>(item.choices.size()); ++c) {
      texts.push_back(context);
      texts.push_back(context + moved + " " + item.choices[c]);
      owner.emplace_back(i, c);
    }
  }
  std::vector<std::string_view> views(texts.begin(), texts.end());
  std::vector<std::vector<uint32_t>> encoded = model.tokenizer.EncodeBatch(views);
  std::vector<TokenRequest> requests(owner.size());
  for (size_t r = 0; r < owner.size(); ++r) {
    const auto& context = encoded[2 * r];
    const auto& whole = encoded[2 * r + 1];
    if (task.items[owner[r].first].context.empty()) {
      // lm-eval scores an empty context after the end-of-text token, continuation encoded alone.
      requests[r].context = {static_cast<uint32_t>(model.prefix_token_id)};
      requests[r].continuation =
          model.tokenizer.Encode(" " + task.items[owner[r].first].choices[owner[r].second]);
      continue;
    }
    requests[r].context = context;
    if (whole.size() > context.size())
      requests[r].continuation.assign(whole.begin() + context.size(), whole.end());
  }
  std::vector<TokenScore> scores = ScoreRequests(model, requests, options, "task=" + task.name);
  int64_t hits = 0, hits_norm = 0;
  size_t r = 0;
  for (int64_t i = 0; i < items; ++i) {
    const ChoiceItem& item = task.items[i];
    ChoiceItemResult out;
    out.line = item.line;
    out.gold = item.gold;
    std::vector<double> normalised;
    for (size_t c = 0; c < item.choices.size(); ++c, ++r) {
      out.loglikelihoods.push_back(scores[r].loglikelihood);
      out.is_greedy.push_back(scores[r].greedy);
      out.choice_lengths.push_back(CodePoints(item.choices[c]));
      out.continuation_tokens.push_back(static_cast<int64_t>(requests[r].continuation.size()));
      if (scores[r].truncated) ++result.truncated_requests;
      normalised.push_back(scores[r].loglikelihood /
                           static_cast<double>(out.choice_lengths.back()));
    }
    out.pred = ArgMax(out.loglikelihoods);
    out.pred_norm = ArgMax(normalised);
    hits += out.pred == out.gold;
    hits_norm += out.pred_norm == out.gold;
    result.chance += 1.0 / item.choices.size();
    result.results.push_back(std::move(out));
  }
  result.items = items;
  result.chance /= std::max<int64_t>(1, items);
  Accuracy(hits, items, &result.acc, &result.acc_stderr);
  Accuracy(hits_norm, items, &result.acc_norm, &result.acc_norm_stderr);
  result.seconds = timer.Seconds();
  if (result.truncated_requests > 0)
    LogWarn(StrFormat(
        "%s: %lld requests were longer than max_length %lld + 1 tokens and were left-truncated",
        task.path.c_str(), (long long)result.truncated_requests, (long long)model.max_length));
  return result;
}

PerplexityResult EvaluatePerplexity(const EvalModel& model, const TextDocuments& text,
                                    const EvalOptions& options) {
  Timer timer;
  PerplexityResult result;
  result.name = text.name;
  result.path = text.path;
  const int64_t documents = Limited(options, text.documents.size());
  std::vector<std::string_view> views(text.documents.begin(), text.documents.begin() + documents);
  std::vector<std::vector<uint32_t>> encoded = model.tokenizer.EncodeBatch(views);
  std::vector<TokenRequest> requests;
  for (int64_t d = 0; d < documents; ++d) {
    std::vector<TokenRequest> windows =
        RollingWindows(encoded[d], static_cast<uint32_t>(model.prefix_token_id), model.max_length);
    for (auto& w : windows) requests.push_back(std::move(w));
    result.tokens += static_cast<int64_t>(encoded[d].size());
    result.bytes += static_cast<int64_t>(text.documents[d].size());
    result.words += PythonWordCount(text.documents[d]);
  }
  if (result.bytes == 0 || result.tokens == 0)  // LoadTextDocuments refused files with no text
    throw DataError(
        result.bytes == 0
            ? StrFormat("%s: no text to score in the first %lld documents (--limit %lld); raise "
                        "--limit",
                        text.path.c_str(), (long long)documents, (long long)options.limit)
            : StrFormat("%s: no text to score: its %lld bytes encode to no tokens",
                        text.path.c_str(), (long long)result.bytes));
  std::vector<TokenScore> scores = ScoreRequests(model, requests, options, "text=" + text.name);
  double loglikelihood = 0;
  for (const auto& s : scores) loglikelihood += s.loglikelihood;
  result.documents = documents;
  result.windows = static_cast<int64_t>(requests.size());
  result.nats = -loglikelihood;
  result.bits_per_byte = result.bytes > 0 ? result.nats / (result.bytes * std::log(2.0)) : 0.0;
  result.byte_perplexity = result.bytes > 0 ? std::exp(result.nats / result.bytes) : 0.0;
  result.word_perplexity = result.words > 0 ? std::exp(result.nats / result.words) : 0.0;
  result.token_perplexity = result.tokens > 0 ? std::exp(result.nats / result.tokens) : 0.0;
  result.seconds = timer.Seconds();
  return result;
}

}  // namespace crucible
