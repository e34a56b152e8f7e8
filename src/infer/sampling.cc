// The logits processors and the draw (infer/sampling.h states the order and the arithmetic).
#include "infer/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "common/error.h"
#include "common/philox.h"

namespace crucible {
namespace {

constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();

// Softmax of logits (V) in double; -inf gives 0.
std::vector<double> Probabilities(const float* logits, int64_t V) {
  const float m = *std::max_element(logits, logits + V);
  std::vector<double> p(static_cast<size_t>(V));
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) {
    p[i] = logits[i] == kMinusInfinity ? 0.0 : std::exp(static_cast<double>(logits[i]) - m);
    sum += p[i];
  }
  for (double& x : p) x /= sum;
  return p;
}

double LogSoftmaxAt(const float* logits, int64_t V, int32_t token) {
  const double m = *std::max_element(logits, logits + V);
  double sum = 0;
  for (int64_t i = 0; i < V; ++i)
    if (logits[i] != kMinusInfinity) sum += std::exp(static_cast<double>(logits[i]) - m);
  return static_cast<double>(logits[token]) - m - std::log(sum);
}

}  // namespace

void CheckSamplingParams(const SamplingParams& p) {
  if (!(p.temperature >= 0) || !std::isfinite(p.temperature))
    throw UsageError("--temperature: expected a finite value >= 0 (0: greedy), got " +
                     std::to_string(p.temperature));
  if (p.top_k < 0)
    throw UsageError("--top-k: expected >= 0 (0: off), got " + std::to_string(p.top_k));
  if (!(p.top_p > 0 && p.top_p <= 1))
    throw UsageError("--top-p: expected a value in (0, 1], got " + std::to_string(p.top_p));
  if (!(p.min_p >= 0 && p.min_p <= 1))
    throw UsageError("--min-p: expected a value in [0, 1], got " + std::to_string(p.min_p));
  if (!(p.repetition_penalty > 0) || !std::isfinite(p.repetition_penalty))
    throw UsageError("--repetition-penalty: expected a finite value > 0 (1: off), got " +
                     std::to_string(p.repetition_penalty));
  if (p.max_new_tokens < 1)
    throw UsageError("--max-new-tokens: expected >= 1, got " + std::to_string(p.max_new_tokens));
  for (const std::string& s : p.stop)
    if (s.empty()) throw UsageError("--stop: a stop string must not be empty");
}

void ApplyRepetitionPenalty(float* logits, int64_t V, const std::vector<int32_t>& seen,
                            double penalty) {
  if (penalty == 1) return;
  std::vector<int32_t> tokens(seen);
  std::sort(tokens.begin(), tokens.end());
  tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());
  const float f = static_cast<float>(penalty);
  for (int32_t t : tokens) {
    if (t < 0 || t >= V) continue;
    logits[t] = logits[t] > 0 ? logits[t] / f : logits[t] * f;
  }
}

void ApplyTemperature(float* logits, int64_t V, double temperature) {
  if (temperature == 1) return;
  const float t = static_cast<float>(temperature);
  for (int64_t i = 0; i < V; ++i) logits[i] /= t;
}

void ApplyTopK(float* logits, int64_t V, int64_t k) {
  if (k <= 0 || k >= V) return;
  std::vector<float> sorted(logits, logits + V);
  std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<float>());
  const float kth = sorted[k - 1];
  for (int64_t i = 0; i < V; ++i)
    if (logits[i] < kth) logits[i] = kMinusInfinity;
}

void ApplyTopP(float* logits, int64_t V, double p) {
  if (p >= 1) return;
  const std::vector<double> probs = Probabilities(logits, V);
  // Largest first; equal logits by token id.
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  double sum = 0;
  size_t keep = 0;
  while (keep < order.size()) {
    sum += probs[order[keep]];
    ++keep;
    if (sum >= p) break;
  }
  for (size_t i = keep; i < order.size(); ++i) logits[order[i]] = kMinusInfinity;
}

void ApplyMinP(float* logits, int64_t V, double min_p) {
  if (min_p <= 0) return;
  const std::vector<double> probs = Probabilities(logits, V);
  const double threshold = min_p * *std::max_element(probs.begin(), probs.end());
  for (int64_t i = 0; i < V; ++i)
    if (probs[i] < threshold) logits[i] = kMinusInfinity;
}

double SamplingUniform(uint64_t seed, uint64_t sequence_index, int64_t position) {
  Philox rng(seed, sequence_index, 2 * static_cast<uint64_t>(position));
  return static_cast<double>(rng.NextU64() >> 11) * (1.0 / 9007199254740992.0);
}

TokenChoice ChooseToken(float* logits, int64_t V, const SamplingParams& params,
                        const std::vector<int32_t>& seen, uint64_t sequence_index,
                        int64_t position) {
  ApplyRepetitionPenalty(logits, V, seen, params.repetition_penalty);
  TokenChoice choice;
  if (params.temperature == 0) {
    choice.token = static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
    choice.logprob = LogSoftmaxAt(logits, V, choice.token);
    return choice;
  }
  ApplyTemperature(logits, V, params.temperature);
  ApplyTopK(logits, V, params.top_k);
  ApplyTopP(logits, V, params.top_p);
  ApplyMinP(logits, V, params.min_p);
  const std::vector<double> probs = Probabilities(logits, V);
  const double u = SamplingUniform(params.seed, sequence_index, position);
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) {
    if (probs[i] == 0) continue;
    choice.token = static_cast<int32_t>(i);  // the last one with probability, if u is not passed
    sum += probs[i];
    if (u < sum) break;
  }
  choice.logprob = LogSoftmaxAt(logits, V, choice.token);
  return choice;
}

}  // namespace crucible
