// The generation engine: sequences in, tokens out, over one InferenceModel (model/model.h). What
// `crucible generate` runs, and what evaluation and RL rollouts are to call.
//
//   Engine engine(*inference, &tokenizer, tokenizer.eos_id());
//   int64_t id = engine.Add({prompt_tokens, params, /*index=*/0});
//   while (engine.Busy()) for (int64_t id : engine.Step()) ... engine.sequence(id) ...
//   engine.Free(id);
//
// Step() prefills the waiting sequences that find a free slot (their first token comes from the
// prefill's logits) and decodes one token for every other running sequence, in one batch. A
// sequence ends, and its slot is freed for the next waiting one, when it emits EOS (finish
// "eos"), its output text contains a stop string ("stop"; the text is cut before it, the tokens
// kept), it has max_new_tokens tokens ("length"), or its slot's KV cache is full ("context_full").
// Its tokens depend only on its prompt, its params and its index (infer/sampling.h, and
// InferenceModel's batch invariance): the same whichever sequences run beside it.
//
// Shared prompt prefill: sequences that start in the same Step with exactly the same prompt
// tokens (GRPO's G samples of a prompt) run it once. The first one's Prefill gives the logits of
// every one's first token (kept per distinct prompt for the Step), and each of the others that
// goes on past that token gets its cache by InferenceModel::CopySlot from a slot of this Step
// that holds just that prompt (a Prefill again only when every such slot has ended). A prefill is
// deterministic and CopySlot copies its bits, so this changes no bit of any sequence: the
// contract above holds whether a prompt was shared or not.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "infer/sampling.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace crucible {

enum class FinishReason { kNone, kEos, kStop, kLength, kContextFull };
// "", "eos", "stop", "length", "context_full".
const char* FinishReasonName(FinishReason reason);

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams params;
  uint64_t index = 0;  // the sequence's index in its request: its random stream
};

struct Sequence {
  int64_t id = -1;
  GenerationRequest request;
  std::vector<int32_t> tokens;   // generated so far (EOS included when it ended on it)
  std::vector<double> logprobs;  // of each generated token (infer/sampling.h)
  std::string text;              // the decoded output (special tokens skipped; cut at a stop)
  FinishReason finish = FinishReason::kNone;
  int64_t slot = -1;  // its KV-cache slot while running
};

class Engine {
 public:
  // `tokenizer` decodes the text (stop strings need it; nullptr: no text, no stop strings).
  // `eos_id` < 0: no EOS.
  Engine(InferenceModel& model, const Tokenizer* tokenizer, int64_t eos_id);
  // One more token that ends a sequence as EOS does (a chat template's end-of-turn marker).
  void AddEosId(int64_t id) { more_eos_ids_.push_back(id); }

  // Queues a sequence; its id. UsageError for an empty prompt or one longer than the model's
  // max_len (naming both lengths), or bad params (CheckSamplingParams).
  int64_t Add(GenerationRequest request);
  // One step (above); the ids that got a token, in the order they ran.
  std::vector<int64_t> Step();
  // Sequences waiting or running.
  bool Busy() const;
  const Sequence& sequence(int64_t id) const;
  // Forgets a sequence (running or not), freeing its slot.
  void Free(int64_t id);
  // InferenceModel::Prefill calls made so far, and the sequences that started on another one's
  // prefill instead (shared prompt prefill, above): together, the sequences started.
  int64_t prefills() const { return prefills_; }
  int64_t shared_prefills() const { return shared_prefills_; }

 private:
  Sequence& Find(int64_t id);
  // Appends a chosen token to `s` and ends it when it should.
  void Accept(Sequence& s, const float* logits);
  void Finish(Sequence& s, FinishReason reason);

  InferenceModel& model_;
  const Tokenizer* tokenizer_;
  int64_t eos_id_;
  std::vector<int64_t> more_eos_ids_;
  int64_t next_id_ = 0;
  std::vector<Sequence> sequences_;  // every sequence not freed, in id order
  std::vector<int64_t> slot_owner_;  // per slot: the running sequence's id, or -1
  std::vector<float> logits_;        // (slots, V)
  std::vector<int32_t> seen_;        // scratch: prompt + output
  // A distinct prompt prefilled in this Step: its tokens (a waiting sequence's), its row of
  // prompt_logits_, and the last sequence of the Step that took a slot holding just that prompt.
  struct StepPrompt {
    const std::vector<int32_t>* prompt;
    size_t row;
    int64_t holder_id, holder_slot;
  };
  std::vector<StepPrompt> step_prompts_;
  std::vector<float> prompt_logits_;  // (distinct prompts of the Step, V)
  int64_t prefills_ = 0, shared_prefills_ = 0;
};

}  // namespace crucible
