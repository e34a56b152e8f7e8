// Internal to src/eval: the log-likelihood engine shared by multiple-choice tasks and
// perplexity. Not part of the public interface (see eval.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "eval/eval.h"

namespace crucible {

// A request as lm-eval's _loglikelihood_tokens sees it: context and continuation token ids.
struct TokenRequest {
  std::vector<uint32_t> context, continuation;
};

struct TokenScore {
  double loglikelihood = 0;  // sum of log p(continuation token | everything before it)
  bool greedy = false;       // every continuation token is the argmax of its logits
  bool truncated = false;    // context + continuation was longer than max_length + 1
};

// Scores the requests in batches of options.batch_size (longest first, like lm-eval), each
// reading the last max_length + 1 tokens of context + continuation minus the final one.
// `label` names the work in phase=eval heartbeats.
std::vector<TokenScore> ScoreRequests(const EvalModel& model,
                                      const std::vector<TokenRequest>& requests,
                                      const EvalOptions& options, const std::string& label);

}  // namespace crucible
