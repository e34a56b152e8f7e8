// The generation engine (infer/engine.h).
#include "infer/engine.h"

#include <algorithm>

#include "common/error.h"

namespace crucible {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kContextFull:
      return "context_full";
    case FinishReason::kNone:
      break;
  }
  return "";
}

Engine::Engine(InferenceModel& model, const Tokenizer* tokenizer, int64_t eos_id)
    : model_(model),
      tokenizer_(tokenizer),
      eos_id_(eos_id),
      slot_owner_(static_cast<size_t>(model.slots()), -1),
      logits_(static_cast<size_t>(model.slots() * model.vocab_size())) {}

int64_t Engine::Add(GenerationRequest request) {
  CheckSamplingParams(request.params);
  const int64_t length = static_cast<int64_t>(request.prompt.size());
  if (length == 0)
    throw UsageError("sequence " + std::to_string(request.index) +
                     ": the prompt is empty (it must have at least one token)");
  if (length > model_.max_len())
    throw UsageError("sequence " + std::to_string(request.index) + ": the prompt has " +
                     std::to_string(length) + " tokens, more than the context of " +
                     std::to_string(model_.max_len()));
  for (int32_t t : request.prompt)
    if (t < 0 || t >= model_.vocab_size())
      throw UsageError("sequence " + std::to_string(request.index) + ": token id " +
                       std::to_string(t) + " is outside the model's vocabulary of " +
                       std::to_string(model_.vocab_size()));
  if (!request.params.stop.empty() && !tokenizer_)
    throw UsageError("stop strings need a tokenizer to decode the output");
  Sequence s;
  s.id = next_id_++;
  s.request = std::move(request);
  sequences_.push_back(std::move(s));
  return sequences_.back().id;
}

bool Engine::Busy() const {
  for (const Sequence& s : sequences_)
    if (s.finish == FinishReason::kNone) return true;
  return false;
}

const Sequence& Engine::sequence(int64_t id) const {
  return const_cast<Engine*>(this)->Find(id);
}

Sequence& Engine::Find(int64_t id) {
  auto it = std::lower_bound(sequences_.begin(), sequences_.end(), id,
                             [](const Sequence& s, int64_t value) { return s.id < value; });
  if (it == sequences_.end() || it->id != id)
    throw Error(kExitFailure, "internal: no sequence " + std::to_string(id) + " in the engine");
  return *it;
}

void Engine::Free(int64_t id) {
  Sequence& s = Find(id);
  if (s.slot >= 0) {
    model_.Free(s.slot);
    slot_owner_[s.slot] = -1;
  }
  sequences_.erase(sequences_.begin() + (&s - sequences_.data()));
}

void Engine::Finish(Sequence& s, FinishReason reason) {
  s.finish = reason;
  if (s.slot >= 0) {
    model_.Free(s.slot);
    slot_owner_[s.slot] = -1;
    s.slot = -1;
  }
}

void Engine::Accept(Sequence& s, const float* logits) {
  const int64_t V = model_.vocab_size();
  std::vector<float> processed(logits, logits + V);
  seen_.assign(s.request.prompt.begin(), s.request.prompt.end());
  seen_.insert(seen_.end(), s.tokens.begin(), s.tokens.end());
  const TokenChoice choice = ChooseToken(processed.data(), V, s.request.params, seen_,
                                         s.request.index, static_cast<int64_t>(s.tokens.size()));
  s.tokens.push_back(choice.token);
  s.logprobs.push_back(choice.logprob);
  if (tokenizer_) {
    const std::vector<uint32_t> ids(s.tokens.begin(), s.tokens.end());
    s.text = tokenizer_->Decode(ids, true);
  }
  const SamplingParams& p = s.request.params;
  if (p.stop_at_eos &&
      ((eos_id_ >= 0 && choice.token == eos_id_) ||
       std::find(more_eos_ids_.begin(), more_eos_ids_.end(), choice.token) != more_eos_ids_.end()))
    return Finish(s, FinishReason::kEos);
  size_t cut = std::string::npos;
  for (const std::string& stop : p.stop) cut = std::min(cut, s.text.find(stop));
  if (cut != std::string::npos) {
    s.text.resize(cut);
    return Finish(s, FinishReason::kStop);
  }
  if (static_cast<int64_t>(s.tokens.size()) >= p.max_new_tokens)
    return Finish(s, FinishReason::kLength);
}

std::vector<int64_t> Engine::Step() {
  std::vector<int64_t> stepped;
  const int64_t V = model_.vocab_size();
  // Running sequences that already hold a token decode first (their slots are taken)...
  std::vector<int64_t> slots, ids;
  std::vector<int32_t> tokens;
  for (Sequence& s : sequences_) {
    if (s.finish != FinishReason::kNone || s.slot < 0) continue;
    if (model_.length(s.slot) >= model_.max_len()) {
      Finish(s, FinishReason::kContextFull);
      stepped.push_back(s.id);
      continue;
    }
    slots.push_back(s.slot);
    ids.push_back(s.id);
    tokens.push_back(s.tokens.back());
  }
  // ...then waiting sequences take the free slots, in id order. A prompt is prefilled once a
  // step: a sequence whose prompt an earlier one of this step already ran takes that prefill's
  // logits, and a copy of a slot that holds just that prompt (CopySlot), when it needs a slot.
  step_prompts_.clear();
  for (Sequence& s : sequences_) {
    if (s.finish != FinishReason::kNone || s.slot >= 0) continue;
    const auto free = std::find(slot_owner_.begin(), slot_owner_.end(), -1);
    if (free == slot_owner_.end()) break;
    const std::vector<int32_t>& prompt = s.request.prompt;
    const int64_t count = static_cast<int64_t>(prompt.size());
    const auto same = std::find_if(step_prompts_.begin(), step_prompts_.end(),
                                   [&](const StepPrompt& p) { return *p.prompt == prompt; });
    const int64_t slot = free - slot_owner_.begin();
    if (same == step_prompts_.end()) {
      const size_t row = step_prompts_.size();
      prompt_logits_.resize(std::max(prompt_logits_.size(), (row + 1) * static_cast<size_t>(V)));
      float* logits = prompt_logits_.data() + row * static_cast<size_t>(V);
      s.slot = slot;
      *free = s.id;
      model_.Prefill(slot, prompt.data(), count, logits);
      ++prefills_;
      step_prompts_.push_back({&prompt, row, s.id, slot});
      Accept(s, logits);
    } else {
      // The shared logits choose the first token before a slot is taken: a sequence that ends
      // on it needs no cache.
      Accept(s, prompt_logits_.data() + same->row * static_cast<size_t>(V));
      if (s.finish == FinishReason::kNone) {
        s.slot = slot;
        *free = s.id;
        // The holder's slot holds just the prompt while it runs: it was filled in this step.
        if (slot_owner_[same->holder_slot] == same->holder_id) {
          model_.CopySlot(same->holder_slot, slot);
          ++shared_prefills_;
        } else {  // the holder ended on its first token; the logits are the same bits
          model_.Prefill(slot, prompt.data(), count, logits_.data());
          ++prefills_;
        }
        same->holder_id = s.id;
        same->holder_slot = slot;
      } else {
        ++shared_prefills_;
      }
    }
    stepped.push_back(s.id);
  }
  if (!slots.empty()) {
    const int64_t n = static_cast<int64_t>(slots.size());
    model_.Decode(slots.data(), tokens.data(), n, logits_.data());
    for (int64_t i = 0; i < n; ++i) {
      Accept(Find(ids[i]), logits_.data() + i * V);
      stepped.push_back(ids[i]);
    }
  }
  return stepped;
}

}  // namespace crucible
