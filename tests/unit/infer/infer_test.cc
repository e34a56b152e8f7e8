// The inference path: the KV cache against a full recomputation, batch invariance of decode,
// CopySlot and the engine's shared prompt prefill, the logits processors, and reproducible
// sampling through the engine.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/error.h"
#include "common/philox.h"
#include "infer/engine.h"
#include "infer/sampling.h"
#include "model/model.h"
#include "shared_prefill_checks.h"
#include "support/staged_backend.h"

namespace crucible {
namespace {

constexpr int64_t kVocab = 64;
constexpr float kInf = std::numeric_limits<float>::infinity();

std::shared_ptr<const ModelSpec> SmallLlama() {
  Config config = Config::Defaults();
  for (const char* o : {"model.vocab_size=64", "model.dim=32", "model.n_heads=4",
                        "model.n_kv_heads=2", "model.n_layers=2", "model.ffn_hidden_dim=48"})
    config.ApplyOverride(o);
  return BuildModelSpec(config);
}

class Inference : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = SmallLlama();
    table_ = spec_->BuildTable();
    weights_.resize(table_.total());
    spec_->InitWeights(table_, 5, 0, weights_.size(), weights_.data());
    // Wider weights than the init, so that the logits are far from uniform and RoPE matters.
    for (float& w : weights_) w *= 4.0f;
    access_ = std::make_unique<FlatParameterAccess>(table_, weights_.data(), nullptr);
  }
  std::vector<int32_t> Tokens(uint64_t seed, int64_t n) {
    Philox rng(seed, 1);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<int32_t>(rng.NextU32() % kVocab);
    return t;
  }
  // The last position's logits of the training forward over all of `tokens`.
  std::vector<float> FullLastLogits(const std::vector<int32_t>& tokens) {
    const int64_t T = static_cast<int64_t>(tokens.size());
    auto model = spec_->Build(1, T);
    std::vector<int32_t> targets(tokens.size(), -1);
    model->Forward(*access_, tokens.data(), targets.data(), nullptr, ForwardOptions::Logits());
    const float* last = model->logits() + (T - 1) * kVocab;
    return std::vector<float>(last, last + kVocab);
  }
  std::shared_ptr<const ModelSpec> spec_;
  ParameterTable table_;
  std::vector<float> weights_;
  std::unique_ptr<FlatParameterAccess> access_;
};

TEST_F(Inference, KvCacheMatchesFullRecomputationAtEveryStep) {
  const std::vector<int32_t> tokens = Tokens(1, 16);
  auto inference = spec_->StartInference(*access_, 2, 16, DefaultCpuBackend());
  EXPECT_EQ(inference->kv_cache_bytes(), 2u * 2 * 2 * 16 * 2 * 8 * sizeof(float));
  EXPECT_EQ(spec_->PlannedKvCacheBytes(2, 16), static_cast<double>(inference->kv_cache_bytes()));
  std::vector<float> logits(kVocab);
  const int64_t prompt = 5;
  inference->Prefill(1, tokens.data(), prompt, logits.data());
  EXPECT_EQ(inference->length(1), prompt);
  for (int64_t t = prompt;; ++t) {
    const std::vector<int32_t> prefix(tokens.begin(), tokens.begin() + t);
    const std::vector<float> full = FullLastLogits(prefix);
    double spread = 0;
    for (int64_t v = 0; v < kVocab; ++v) {
      EXPECT_NEAR(logits[v], full[v], 2e-4) << "position " << t - 1 << " token " << v;
      spread = std::max(spread, std::fabs(static_cast<double>(full[v] - full[0])));
    }
    EXPECT_GT(spread, 0.1);  // the logits say something
    if (t == 16) break;
    const int64_t slot = 1;
    inference->Decode(&slot, &tokens[t], 1, logits.data());
    EXPECT_EQ(inference->length(1), t + 1);
  }
}

TEST_F(Inference, RefusesASequenceBeyondItsCache) {
  const std::vector<int32_t> tokens = Tokens(2, 9);
  auto inference = spec_->StartInference(*access_, 1, 8, DefaultCpuBackend());
  std::vector<float> logits(kVocab);
  try {
    inference->Prefill(0, tokens.data(), 9, logits.data());
    FAIL() << "a 9-token prompt was prefilled into 8 positions";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("slot 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("8 positions"), std::string::npos) << e.what();
  }
  inference->Prefill(0, tokens.data(), 8, logits.data());
  const int64_t slot = 0;
  try {
    inference->Decode(&slot, &tokens[8], 1, logits.data());
    FAIL() << "decoded past a full cache";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("slot 0 is full"), std::string::npos) << e.what();
  }
  inference->Free(0);
  EXPECT_EQ(inference->length(0), 0);
}

// Decodes `steps` tokens (each the argmax) for sequence `a` in slot `a_slot`, with the other
// prompts in the other slots decoded beside it; returns a's logits at every step.
std::vector<float> DecodeBeside(InferenceModel& model, const std::vector<int32_t>& a,
                                int64_t a_slot, const std::vector<std::vector<int32_t>>& others,
                                int steps, bool reverse_order) {
  std::vector<float> logits(static_cast<size_t>(model.slots() * kVocab)), trace;
  std::vector<int64_t> slots = {a_slot};
  std::vector<int32_t> next;
  model.Prefill(a_slot, a.data(), static_cast<int64_t>(a.size()), logits.data());
  trace.insert(trace.end(), logits.begin(), logits.begin() + kVocab);
  next.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + kVocab) -
                                      logits.begin()));
  int64_t slot = 0;
  for (const auto& other : others) {
    if (slot == a_slot) ++slot;
    model.Prefill(slot, other.data(), static_cast<int64_t>(other.size()), logits.data());
    slots.push_back(slot);
    next.push_back(static_cast<int32_t>(other[0]));
    ++slot;
  }
  if (reverse_order) {
    std::reverse(slots.begin(), slots.end());
    std::reverse(next.begin(), next.end());
  }
  const size_t a_row = reverse_order ? slots.size() - 1 : 0;
  for (int s = 0; s < steps; ++s) {
    model.Decode(slots.data(), next.data(), static_cast<int64_t>(slots.size()), logits.data());
    const float* row = logits.data() + a_row * kVocab;
    trace.insert(trace.end(), row, row + kVocab);
    for (size_t i = 0; i < slots.size(); ++i) {
      const float* r = logits.data() + i * kVocab;
      next[i] = static_cast<int32_t>(std::max_element(r, r + kVocab) - r);
    }
  }
  return trace;
}

TEST_F(Inference, DecodeLogitsDoNotDependOnTheBatchOrTheThreads) {
  const std::vector<int32_t> a = Tokens(3, 5);
  auto alone_model = spec_->StartInference(*access_, 1, 32, DefaultCpuBackend());
  const std::vector<float> alone = DecodeBeside(*alone_model, a, 0, {}, 10, false);
  auto batched_model = spec_->StartInference(*access_, 4, 32, DefaultCpuBackend());
  const std::vector<std::vector<int32_t>> others = {Tokens(4, 9), Tokens(5, 2), Tokens(6, 13)};
  const std::vector<float> batched = DecodeBeside(*batched_model, a, 2, others, 10, true);
  ASSERT_EQ(alone.size(), batched.size());
  EXPECT_EQ(std::memcmp(alone.data(), batched.data(), alone.size() * sizeof(float)), 0);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(threads > 1 ? 1 : 2);
  auto other_threads = spec_->StartInference(*access_, 3, 32, DefaultCpuBackend());
  const std::vector<float> rethreaded =
      DecodeBeside(*other_threads, a, 1, {others[0], others[2]}, 10, false);
  omp_set_num_threads(threads);
  EXPECT_EQ(std::memcmp(alone.data(), rethreaded.data(), alone.size() * sizeof(float)), 0);
}

// ---- shared prompt prefill (shared_prefill_checks.h) ----

TEST_F(Inference, CopySlotDecodesAsAPrefill) {
  const std::vector<int32_t> prompt = Tokens(21, 7);
  shared_prefill::CheckCopySlotDecodesAsAPrefill(
      [&](int64_t slots, int64_t max_len) {
        return spec_->StartInference(*access_, slots, max_len, DefaultCpuBackend());
      },
      prompt);
  // Off host memory: the cache is copied through the backend's own copies.
  shared_prefill::CheckCopySlotDecodesAsAPrefill(
      [&](int64_t slots, int64_t max_len) {
        return spec_->StartInference(*access_, slots, max_len, std::make_shared<StagedBackend>());
      },
      prompt);
}

TEST_F(Inference, CopySlotRefusesWrongSlots) {
  shared_prefill::CheckCopySlotRefusesWrongSlots(
      [&](int64_t slots, int64_t max_len) {
        return spec_->StartInference(*access_, slots, max_len, DefaultCpuBackend());
      },
      Tokens(22, 5));
}

TEST_F(Inference, EngineSharesPromptPrefillsBitForBit) {
  shared_prefill::CheckEngineSharesPromptPrefills(
      [&](int64_t slots, int64_t max_len) {
        return spec_->StartInference(*access_, slots, max_len, DefaultCpuBackend());
      },
      [&](int i) { return Tokens(30 + i, 3 + 2 * i); });
}

// ---- the logits processors ----

TEST(Sampling, TopKKeepsTheKLargestAndTheirTies) {
  std::vector<float> x = {1, 3, 2, 5, 4, 4};
  ApplyTopK(x.data(), 6, 2);
  EXPECT_EQ(x, (std::vector<float>{-kInf, -kInf, -kInf, 5, 4, 4}));
  std::vector<float> y = {1, 2};
  ApplyTopK(y.data(), 2, 0);  // off
  EXPECT_EQ(y, (std::vector<float>{1, 2}));
}

TEST(Sampling, TopPKeepsTheSmallestSetReachingP) {
  // Probabilities 0.5, 0.25, 0.125, 0.125 (logits are their logs).
  const std::vector<float> base = {std::log(0.125f), std::log(0.5f), std::log(0.25f),
                                   std::log(0.125f)};
  std::vector<float> x = base;
  ApplyTopP(x.data(), 4, 0.7);  // 0.5 + 0.25 >= 0.7
  EXPECT_EQ(x[0], -kInf);
  EXPECT_EQ(x[1], base[1]);
  EXPECT_EQ(x[2], base[2]);
  EXPECT_EQ(x[3], -kInf);
  x = base;
  ApplyTopP(x.data(), 4, 0.1);  // the largest always stays
  EXPECT_EQ(x[1], base[1]);
  EXPECT_EQ(std::count(x.begin(), x.end(), -kInf), 3);
  x = base;
  ApplyTopP(x.data(), 4, 0.8);  // 0.875 with token 0: ties by token id, 0 before 3
  EXPECT_EQ(x[0], base[0]);
  EXPECT_EQ(x[3], -kInf);
}

TEST(Sampling, MinPDropsTokensBelowAFractionOfTheLargest) {
  const std::vector<float> base = {std::log(0.125f), std::log(0.5f), std::log(0.25f),
                                   std::log(0.125f)};
  std::vector<float> x = base;
  ApplyMinP(x.data(), 4, 0.3);  // threshold 0.15
  EXPECT_EQ(x, (std::vector<float>{-kInf, base[1], base[2], -kInf}));
}

TEST(Sampling, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogitsOnce) {
  std::vector<float> x = {2, -2, 4, 1};
  ApplyRepetitionPenalty(x.data(), 4, {0, 1, 1, 0}, 2.0);
  EXPECT_EQ(x, (std::vector<float>{1, -4, 4, 1}));
}

TEST(Sampling, ParamsOutsideTheirRangesAreRefused) {
  SamplingParams p;
  p.top_p = 0;
  EXPECT_THROW(CheckSamplingParams(p), Error);
  p.top_p = 1.5;
  EXPECT_THROW(CheckSamplingParams(p), Error);
  p.top_p = 1;
  p.temperature = -1;
  EXPECT_THROW(CheckSamplingParams(p), Error);
  p.temperature = 0.5;
  CheckSamplingParams(p);
}

TEST(Sampling, GreedyTakesTheFirstLargestAndReportsItsLogSoftmax) {
  std::vector<float> x = {0, 1, 1, 0};
  SamplingParams p;
  const TokenChoice c = ChooseToken(x.data(), 4, p, {}, 0, 0);
  EXPECT_EQ(c.token, 1);
  EXPECT_NEAR(c.logprob, 1 - std::log(2 * std::exp(1.0) + 2), 1e-6);
}

TEST(Sampling, TheSameSeedGivesTheSameTokensAndOtherSeedsOthers) {
  SamplingParams p;
  p.temperature = 1;
  std::vector<float> logits(kVocab, 0.0f);  // uniform: every draw is the seed's
  auto draw = [&](uint64_t seed, uint64_t index) {
    std::vector<int32_t> out;
    p.seed = seed;
    for (int64_t pos = 0; pos < 32; ++pos) {
      std::vector<float> x = logits;
      out.push_back(ChooseToken(x.data(), kVocab, p, {}, index, pos).token);
    }
    return out;
  };
  EXPECT_EQ(draw(7, 0), draw(7, 0));
  EXPECT_NE(draw(7, 0), draw(8, 0));
  EXPECT_NE(draw(7, 0), draw(7, 1));
}

// ---- the engine ----

TEST_F(Inference, EngineSamplesTheSameTokensAloneAndBatched) {
  SamplingParams p;
  p.temperature = 0.9;
  p.top_k = 40;
  p.top_p = 0.95;
  p.max_new_tokens = 12;
  p.seed = 11;
  const std::vector<int32_t> prompt = Tokens(9, 6);
  auto run = [&](int64_t slots, const std::vector<std::vector<int32_t>>& prompts, uint64_t seed) {
    auto inference = spec_->StartInference(*access_, slots, 32, DefaultCpuBackend());
    Engine engine(*inference, nullptr, -1);
    std::vector<int64_t> ids;
    for (size_t i = 0; i < prompts.size(); ++i) {
      SamplingParams q = p;
      q.seed = seed;
      ids.push_back(engine.Add({prompts[i], q, i}));
    }
    while (engine.Busy()) engine.Step();
    std::vector<std::vector<int32_t>> out;
    for (int64_t id : ids) {
      EXPECT_EQ(engine.sequence(id).finish, FinishReason::kLength);
      out.push_back(engine.sequence(id).tokens);
    }
    return out;
  };
  const auto alone = run(1, {prompt}, 11);
  ASSERT_EQ(alone[0].size(), 12u);
  const auto batched = run(2, {prompt, Tokens(10, 3), Tokens(12, 8)}, 11);
  EXPECT_EQ(batched[0], alone[0]);
  EXPECT_EQ(run(1, {prompt}, 11), alone);
  EXPECT_NE(run(1, {prompt}, 12), alone);
}

TEST_F(Inference, EngineEndsASequenceWhenItsCacheIsFull) {
  auto inference = spec_->StartInference(*access_, 1, 8, DefaultCpuBackend());
  Engine engine(*inference, nullptr, -1);
  SamplingParams p;
  p.max_new_tokens = 100;
  const int64_t id = engine.Add({Tokens(13, 5), p, 0});
  EXPECT_THROW(engine.Add({Tokens(13, 9), p, 1}), Error);
  EXPECT_THROW(engine.Add({{}, p, 2}), Error);
  while (engine.Busy()) engine.Step();
  EXPECT_EQ(engine.sequence(id).finish, FinishReason::kContextFull);
  EXPECT_EQ(engine.sequence(id).tokens.size(), 4u);  // 5 + 3 fill the 8 positions, then 1 more
}

TEST_F(Inference, EngineEndsASequenceAtAnAddedEosId) {
  SamplingParams p;
  p.max_new_tokens = 10;
  const std::vector<int32_t> prompt = Tokens(9, 6);
  auto run = [&](int64_t more_eos, bool stop_at_eos) {
    auto inference = spec_->StartInference(*access_, 1, 32, DefaultCpuBackend());
    Engine engine(*inference, nullptr, -1);
    if (more_eos >= 0) engine.AddEosId(more_eos);  // a chat template's end-of-turn token
    SamplingParams q = p;
    q.stop_at_eos = stop_at_eos;
    const int64_t id = engine.Add({prompt, q, 0});
    while (engine.Busy()) engine.Step();
    return engine.sequence(id);
  };
  const Sequence plain = run(-1, true);
  ASSERT_EQ(plain.tokens.size(), 10u);
  const int32_t marker = plain.tokens[3];
  const size_t first = static_cast<size_t>(
      std::find(plain.tokens.begin(), plain.tokens.end(), marker) - plain.tokens.begin());
  const Sequence ended = run(marker, true);
  EXPECT_EQ(ended.finish, FinishReason::kEos);
  EXPECT_EQ(ended.tokens,
            std::vector<int32_t>(plain.tokens.begin(), plain.tokens.begin() + first + 1));
  EXPECT_EQ(run(marker, false).tokens, plain.tokens);  // --ignore-eos ignores it too
}

}  // namespace
}  // namespace crucible
