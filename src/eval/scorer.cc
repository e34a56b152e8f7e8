#include "eval/scorer.h"

#include <algorithm>
#include <memory>
#include <numeric>

#include "common/log.h"
#include "common/strings.h"
#include "common/timer.h"

namespace crucible {
namespace {

// Sequence lengths are rounded up to this, so a few model sizes serve a whole task.
constexpr int64_t kLengthBucket = 16;

}  // namespace

std::vector<TokenScore> ScoreRequests(const EvalModel& model,
                                      const std::vector<TokenRequest>& requests,
                                      const EvalOptions& options, const std::string& label) {
  const int64_t n = static_cast<int64_t>(requests.size());
  std::vector<TokenScore> scores(n);
  if (n == 0) return scores;
  const int64_t max_length = model.max_length;
  const int64_t vocab = model.spec->vocab_size();
  // The window each request reads: the last max_length + 1 tokens of context + continuation.
  std::vector<std::vector<int32_t>> windows(n);
  std::vector<int64_t> continuation_length(n);
  for (int64_t r = 0; r < n; ++r) {
    const auto& request = requests[r];
    std::vector<int32_t> whole;
    whole.reserve(request.context.size() + request.continuation.size());
    for (uint32_t t : request.context) whole.push_back(static_cast<int32_t>(t));
    for (uint32_t t : request.continuation) whole.push_back(static_cast<int32_t>(t));
    if (static_cast<int64_t>(whole.size()) > max_length + 1) {
      whole.erase(whole.begin(), whole.end() - (max_length + 1));
      scores[r].truncated = true;
    }
    // The model reads whole[:-1]; the continuation is predicted at its last positions.
    continuation_length[r] = std::min<int64_t>(request.continuation.size(), whole.size() - 1);
    windows[r] = std::move(whole);
  }
  // Longest first (ties by index), so each batch pads little and the order is fixed.
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return windows[a].size() > windows[b].size(); });

  const int64_t batch = std::max<int64_t>(1, options.batch_size);
  std::unique_ptr<Model> built;  // for the current sequence length
  std::vector<int32_t> tokens, targets;
  Timer timer;
  double last_report = 0;
  for (int64_t begin = 0; begin < n; begin += batch) {
    const int64_t end = std::min(n, begin + batch);
    const int64_t longest = static_cast<int64_t>(windows[order[begin]].size()) - 1;
    const int64_t T =
        std::min(max_length, (longest + kLengthBucket - 1) / kLengthBucket * kLengthBucket);
    if (!built || built->seq_len() != T) {
      built.reset();
      built = model.spec->Build(batch, T);
    }
    tokens.assign(batch * T, 0);
    targets.assign(batch * T, -1);
    for (int64_t row = 0; row < end - begin; ++row) {
      const auto& window = windows[order[begin + row]];
      const int64_t length = static_cast<int64_t>(window.size()) - 1;
      const int64_t first = length - continuation_length[order[begin + row]];
      for (int64_t i = 0; i < length; ++i) {
        tokens[row * T + i] = window[i];
        if (i >= first) targets[row * T + i] = window[i + 1];
      }
    }
    FlatParameterAccess access(built->table(), model.weights.data(), nullptr);
    // Scored: the head runs in chunks of rows (FusedHeadRows), so the whole (batch x T x V)
    // logits never exist; a model without it serves it as kLogits and its logits are read.
    built->Forward(access, tokens.data(), targets.data(), nullptr, ForwardOptions::Scored());
    const float* losses = built->losses();
    const int32_t* predictions = built->predictions();
    const float* logits = predictions ? nullptr : built->logits();
    for (int64_t row = 0; row < end - begin; ++row) {
      TokenScore& score = scores[order[begin + row]];
      double sum = 0;
      bool greedy = true;
      for (int64_t i = 0; i < T; ++i) {
        const int32_t target = targets[row * T + i];
        if (target < 0) continue;
        sum -= losses[row * T + i];
        int64_t best;
        if (predictions) {
          best = predictions[row * T + i];
        } else {
          const float* row_logits = logits + (row * T + i) * vocab;
          best = std::max_element(row_logits, row_logits + vocab) - row_logits;
        }
        if (best != target) greedy = false;
      }
      score.loglikelihood = sum;
      score.greedy = greedy;
    }
    if (options.progress && (timer.Seconds() - last_report >= 2.0 || end == n)) {
      last_report = timer.Seconds();
      PrintLine(StrFormat("phase=eval %s requests=%lld/%lld seq_len=%lld elapsed_s=%.1f",
                          label.c_str(), (long long)end, (long long)n, (long long)T, last_report));
    }
  }
  return scores;
}

}  // namespace crucible
