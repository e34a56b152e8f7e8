// Choosing the next token from a sequence's logits: the logits processors of Hugging Face
// transformers' generate, in its order, and a draw from a counter-based stream, so the token
// depends on (logits, seed, sequence index, position) alone: not on the batch, the thread count or
// what ran before.
//
//   1. repetition penalty (every token of the prompt and of the output so far, once each): a
//      logit s becomes s / penalty when s > 0, s * penalty otherwise
//   greedy (temperature 0): the largest logit, the first of equal ones; else
//   2. temperature: s / temperature
//   3. top-k: logits below the k-th largest become -inf (ties with it stay)
//   4. top-p: sorted by logit (ties by token id), the smallest set of the largest whose
//      probabilities sum to at least p stays, the rest become -inf (the largest always stays)
//   5. min-p: tokens whose probability is below min_p x the largest probability become -inf
//   6. a draw: u uniform in [0, 1) from Philox(seed, stream = the sequence's index in its
//      request, offset = 2 x its position in the output), the first token id whose cumulative
//      probability (softmax of the processed logits, in double, in token-id order) exceeds u.
//
// The log-probability reported for the chosen token is the log-softmax of the processed logits
// (after steps 1-5; for greedy after step 1 only, at temperature 1), in double.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace crucible {

struct SamplingParams {
  double temperature = 0;         // 0: greedy; else > 0
  int64_t top_k = 0;              // 0: off
  double top_p = 1;               // in (0, 1]; 1: off
  double min_p = 0;               // in [0, 1]; 0: off
  double repetition_penalty = 1;  // > 0; 1: off
  int64_t max_new_tokens = 64;    // >= 1
  std::vector<std::string> stop;  // stop strings (in the output text); none empty
  bool stop_at_eos = true;        // end when the model emits the tokenizer's EOS
  uint64_t seed = 0;
};

// UsageError naming the option (as `--name`) and its allowed range when a value is outside it.
void CheckSamplingParams(const SamplingParams& params);

// The processors, in place on logits (V). `seen`: the prompt and output tokens so far.
void ApplyRepetitionPenalty(float* logits, int64_t V, const std::vector<int32_t>& seen,
                            double penalty);
void ApplyTemperature(float* logits, int64_t V, double temperature);
void ApplyTopK(float* logits, int64_t V, int64_t k);
void ApplyTopP(float* logits, int64_t V, double p);
void ApplyMinP(float* logits, int64_t V, double min_p);

// The uniform draw of step 6.
double SamplingUniform(uint64_t seed, uint64_t sequence_index, int64_t position);

struct TokenChoice {
  int32_t token = -1;
  double logprob = 0;
};
// Steps 1-6 on `logits` (overwritten with the processed values).
TokenChoice ChooseToken(float* logits, int64_t V, const SamplingParams& params,
                        const std::vector<int32_t>& seen, uint64_t sequence_index,
                        int64_t position);

}  // namespace crucible
