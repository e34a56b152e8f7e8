// Checks of the engine's shared prompt prefill (infer/engine.h) and of InferenceModel::CopySlot
// that both families run (infer_test.cc, deepseek_infer_test.cc): a copied slot decodes the bits
// a prefilled one does, CopySlot refuses a wrong slot state, and an engine that shares a prompt's
// prefill between sequences gives each the tokens and log-probabilities it gets alone, bit for
// bit, with fewer prefills.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "infer/engine.h"
#include "model/model.h"

namespace crucible {
namespace shared_prefill {

// An inference model that counts the Prefill and CopySlot calls it passes on.
class CountingModel final : public InferenceModel {
 public:
  explicit CountingModel(InferenceModel& inner) : inner_(inner) {}
  int64_t slots() const override { return inner_.slots(); }
  int64_t max_len() const override { return inner_.max_len(); }
  int64_t vocab_size() const override { return inner_.vocab_size(); }
  size_t kv_cache_bytes() const override { return inner_.kv_cache_bytes(); }
  size_t scratch_bytes() const override { return inner_.scratch_bytes(); }
  size_t weight_bytes() const override { return inner_.weight_bytes(); }
  int64_t length(int64_t slot) const override { return inner_.length(slot); }
  void Prefill(int64_t slot, const int32_t* tokens, int64_t count, float* logits) override {
    ++prefills;
    inner_.Prefill(slot, tokens, count, logits);
  }
  void Decode(const int64_t* slots, const int32_t* tokens, int64_t n, float* logits) override {
    inner_.Decode(slots, tokens, n, logits);
  }
  void CopySlot(int64_t from, int64_t to) override {
    ++copies;
    inner_.CopySlot(from, to);
  }
  void Free(int64_t slot) override { inner_.Free(slot); }
  int64_t prefills = 0, copies = 0;

 private:
  InferenceModel& inner_;
};

// `steps` decode steps of `slot` alone, each on the argmax of the logits before (`first`: the
// prompt's); the logits of every step, one after the other.
inline std::vector<float> DecodeTrace(InferenceModel& model, int64_t slot,
                                      const std::vector<float>& first, int steps) {
  const int64_t V = model.vocab_size();
  std::vector<float> logits = first, trace;
  for (int s = 0; s < steps; ++s) {
    const int32_t next =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    model.Decode(&slot, &next, 1, logits.data());
    trace.insert(trace.end(), logits.begin(), logits.begin() + V);
  }
  return trace;
}

using StartFn = std::function<std::unique_ptr<InferenceModel>(int64_t slots, int64_t max_len)>;

// Prefill into slot 0 then CopySlot(0, 2), against a Prefill into slot 2 of another model: the
// same length, and the same bits of logits at every decode step of the copy and of its source.
inline void CheckCopySlotDecodesAsAPrefill(const StartFn& start,
                                           const std::vector<int32_t>& prompt) {
  const int64_t count = static_cast<int64_t>(prompt.size());
  auto copied = start(3, 32);
  const int64_t V = copied->vocab_size();
  std::vector<float> logits(static_cast<size_t>(V)), other(static_cast<size_t>(V));
  copied->Prefill(0, prompt.data(), count, logits.data());
  copied->CopySlot(0, 2);
  EXPECT_EQ(copied->length(2), count);
  EXPECT_EQ(copied->length(0), count);
  EXPECT_EQ(copied->length(1), 0);
  auto prefilled = start(3, 32);
  prefilled->Prefill(2, prompt.data(), count, other.data());
  EXPECT_EQ(std::memcmp(logits.data(), other.data(), logits.size() * sizeof(float)), 0);
  const std::vector<float> want = DecodeTrace(*prefilled, 2, other, 8);
  const std::vector<float> copy = DecodeTrace(*copied, 2, logits, 8);
  const std::vector<float> source = DecodeTrace(*copied, 0, logits, 8);
  ASSERT_EQ(copy.size(), want.size());
  EXPECT_EQ(std::memcmp(copy.data(), want.data(), want.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(source.data(), want.data(), want.size() * sizeof(float)), 0);
  EXPECT_EQ(copied->length(2), count + 8);
  // A copy of a slot that has decoded: its whole length.
  copied->Free(1);
  copied->CopySlot(2, 1);
  EXPECT_EQ(copied->length(1), count + 8);
  std::vector<float> a(static_cast<size_t>(V)), b(static_cast<size_t>(V));
  const int32_t token = prompt[0];
  int64_t slot = 1;
  copied->Decode(&slot, &token, 1, a.data());
  slot = 2;
  copied->Decode(&slot, &token, 1, b.data());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

// CopySlot's internal errors: a slot outside [0, slots), onto itself, from an empty slot, into a
// slot that holds positions; none changes a length.
inline void CheckCopySlotRefusesWrongSlots(const StartFn& start,
                                           const std::vector<int32_t>& prompt) {
  auto model = start(3, 32);
  const int64_t count = static_cast<int64_t>(prompt.size());
  std::vector<float> logits(static_cast<size_t>(model->vocab_size()));
  model->Prefill(0, prompt.data(), count, logits.data());
  model->Prefill(1, prompt.data(), count, logits.data());
  auto refused = [&](int64_t from, int64_t to, const std::string& says) {
    try {
      model->CopySlot(from, to);
      ADD_FAILURE() << "CopySlot(" << from << ", " << to << ") was not refused";
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), kExitFailure) << e.what();
      EXPECT_NE(std::string(e.what()).find("internal:"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused(0, 3, "slot 3 outside [0, 3)");
  refused(-1, 2, "slot -1 outside [0, 3)");
  refused(0, 0, "onto itself");
  refused(2, 0, "copy of empty sequence slot 2");
  refused(0, 1, "copy into sequence slot 1, which holds " + std::to_string(count));
  EXPECT_EQ(model->length(0), count);
  EXPECT_EQ(model->length(1), count);
  EXPECT_EQ(model->length(2), 0);
}

struct Generated {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<double>> logprobs;
  std::vector<FinishReason> finish;
};

// Runs `requests` through one engine over `slots` slots; `model` counts its calls.
inline Generated Generate(InferenceModel& inner, const std::vector<GenerationRequest>& requests,
                          int64_t* prefills = nullptr, int64_t* shared = nullptr) {
  CountingModel model(inner);
  Engine engine(model, nullptr, -1);
  std::vector<int64_t> ids;
  for (const GenerationRequest& r : requests) ids.push_back(engine.Add(r));
  while (engine.Busy()) engine.Step();
  Generated out;
  for (int64_t id : ids) {
    out.tokens.push_back(engine.sequence(id).tokens);
    out.logprobs.push_back(engine.sequence(id).logprobs);
    out.finish.push_back(engine.sequence(id).finish);
  }
  EXPECT_EQ(engine.prefills(), model.prefills);
  EXPECT_EQ(engine.shared_prefills() + engine.prefills(), static_cast<int64_t>(requests.size()));
  EXPECT_LE(model.copies, engine.shared_prefills());
  if (prefills) *prefills = engine.prefills();
  if (shared) *shared = engine.shared_prefills();
  return out;
}

// G = 4 samples of prompt a, 3 of prompt b and one each of c and d (GRPO's groups), sampled; each
// sequence's tokens and log-probabilities equal, bit for bit, those of the same request run
// alone in a one-slot engine. All slots: one prefill per distinct prompt. Fewer slots than
// sequences: a group split over Steps is prefilled once in each Step it starts in. Sequences of
// one prompt that end on their first token (max_new_tokens = 1) before one that goes on: that one
// is prefilled again (no slot holds the prompt any more), the next one copies its slot.
inline void CheckEngineSharesPromptPrefills(
    const StartFn& start, const std::function<std::vector<int32_t>(int)>& tokens) {
  SamplingParams p;
  p.temperature = 0.9;
  p.top_k = 40;
  p.top_p = 0.95;
  p.max_new_tokens = 10;
  p.seed = 11;
  const std::vector<int32_t> a = tokens(1), b = tokens(2), c = tokens(3), d = tokens(4);
  std::vector<GenerationRequest> requests;
  uint64_t index = 0;
  for (const auto* prompt : {&a, &c, &a, &b, &a, &b, &d, &b, &a})
    requests.push_back({*prompt, p, index++});
  std::vector<std::vector<int32_t>> alone_tokens;
  std::vector<std::vector<double>> alone_logprobs;
  for (const GenerationRequest& r : requests) {
    auto one = start(1, 32);
    const Generated g = Generate(*one, {r});
    alone_tokens.push_back(g.tokens[0]);
    alone_logprobs.push_back(g.logprobs[0]);
  }
  // The group's samples differ (their indices draw other tokens): the sharing is not trivial.
  EXPECT_NE(alone_tokens[0], alone_tokens[2]);
  const int64_t n = static_cast<int64_t>(requests.size());
  for (int64_t slots : {n, int64_t{4}}) {
    SCOPED_TRACE("slots " + std::to_string(slots));
    auto model = start(slots, 32);
    int64_t prefills = 0, shared = 0;
    const Generated g = Generate(*model, requests, &prefills, &shared);
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(g.tokens[i], alone_tokens[i]) << "sequence " << i;
      EXPECT_EQ(g.logprobs[i], alone_logprobs[i]) << "sequence " << i;
      EXPECT_EQ(g.finish[i], FinishReason::kLength) << "sequence " << i;
    }
    // All slots: one prefill per distinct prompt. 4 slots: the first Step starts a, c, a, b (3
    // prefills), the Step after all four end a, b, d, b (3), the next one a (1).
    EXPECT_EQ(prefills, slots == n ? 4 : 7);
    EXPECT_EQ(shared, n - prefills);
  }
  // Two samples of a that end on their first token, then two that go on.
  std::vector<GenerationRequest> ending;
  for (int i = 0; i < 4; ++i) {
    GenerationRequest r{a, p, static_cast<uint64_t>(i)};
    if (i < 2) r.params.max_new_tokens = 1;
    ending.push_back(r);
  }
  auto model = start(4, 32);
  CountingModel counted(*model);
  int64_t prefills = 0, shared = 0;
  const Generated g = Generate(counted, ending, &prefills, &shared);
  EXPECT_EQ(prefills, 2);  // a's first, and the third after the second ended on its token
  EXPECT_EQ(shared, 2);    // the second (no slot taken) and the fourth (a copy of the third's)
  EXPECT_EQ(counted.copies, 1);
  for (int i = 0; i < 4; ++i) {
    auto one = start(1, 32);
    const Generated want = Generate(*one, {ending[static_cast<size_t>(i)]});
    EXPECT_EQ(g.tokens[i], want.tokens[0]) << "sequence " << i;
    EXPECT_EQ(g.logprobs[i], want.logprobs[0]) << "sequence " << i;
  }
  EXPECT_EQ(g.tokens[0].size(), 1u);
  EXPECT_EQ(g.tokens[3].size(), 10u);
}

}  // namespace shared_prefill
}  // namespace crucible
