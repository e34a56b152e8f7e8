// The DeepSeek-V3 family's inference path (model/deepseek_v3_infer.cc): MLA with values of another
// width than the keys, a dense first layer, then MoE layers. The KV cache against the training
// Forward over the whole prefix at every step, and decode's batch and thread invariance, bit for
// bit (the routed experts' products included), for two shapes of the family; CopySlot and the
// engine's shared prompt prefill (shared_prefill_checks.h).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/philox.h"
#include "model/model.h"
#include "shared_prefill_checks.h"
#include "support/staged_backend.h"

namespace crucible {
namespace {

constexpr int64_t kVocab = 64;

struct Shape {
  const char* name;
  std::vector<std::string> overrides;
  int64_t layers, heads, qk, v;  // for the cache's size
};

// Query compression, grouped routing, a shared expert, values narrower than the keys (Dq 12,
// Dv 6); and plain queries, no shared expert, unnormalised weights, a tied head, values wider
// than the keys (Dq 8, Dv 10).
const Shape kShapes[] = {
    {"compressed_queries_grouped_routing",
     {"model.q_lora_rank=24", "model.kv_lora_rank=16", "model.qk_nope_head_dim=8",
      "model.qk_rope_head_dim=4", "model.v_head_dim=6", "model.n_shared_experts=1",
      "model.n_group=4", "model.topk_group=2", "model.norm_topk_prob=true"},
     3,
     4,
     12,
     6},
    {"plain_queries_no_shared_tied",
     {"model.q_lora_rank=0", "model.kv_lora_rank=12", "model.qk_nope_head_dim=4",
      "model.qk_rope_head_dim=4", "model.v_head_dim=10", "model.n_shared_experts=0",
      "model.n_group=1", "model.topk_group=1", "model.norm_topk_prob=false",
      "model.tie_embeddings=true"},
     3,
     4,
     8,
     10},
};

class DeepSeekInference : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    Config config = Config::Defaults();
    for (const char* o : {"model.name=deepseek_v3", "model.flavor=debug", "model.vocab_size=64",
                          "model.dim=32", "model.n_layers=3", "model.n_heads=4",
                          "model.ffn_hidden_dim=48", "model.n_routed_experts=8",
                          "model.num_experts_per_tok=2", "model.moe_intermediate_size=16",
                          "model.first_k_dense_replace=1", "model.routed_scaling_factor=2.5"})
      config.ApplyOverride(o);
    for (const std::string& o : GetParam().overrides) config.ApplyOverride(o);
    spec_ = BuildModelSpec(config);
    table_ = spec_->BuildTable();
    weights_.resize(table_.total());
    spec_->InitWeights(table_, 5, 0, weights_.size(), weights_.data());
    // Wider weights than the init, so that the logits are far from uniform and RoPE matters; the
    // balance biases away from 0, so that they take part in the routing.
    Philox rng(9, 2);
    for (const ParamInfo& p : table_.params())
      for (size_t i = p.offset; i < p.offset + p.numel; ++i)
        weights_[i] = p.kind == ParamKind::kBalanceBias
                          ? 0.05f * static_cast<float>(rng.NextNormal())
                          : weights_[i] * 4.0f;
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

// Tolerance: 2e-4 absolute on logits of magnitude ~1-10, as the Llama's (observed up to 2e-5: the
// prefill runs the training GEMMs; decode's lane dot products sum in another order).
TEST_P(DeepSeekInference, KvCacheMatchesFullRecomputationAtEveryStep) {
  const Shape& shape = GetParam();
  const std::vector<int32_t> tokens = Tokens(1, 16);
  auto inference = spec_->StartInference(*access_, 2, 16, DefaultCpuBackend());
  // Per slot, layer and position: the keys (H, Dq) and values (H, Dv) of every head.
  EXPECT_EQ(inference->kv_cache_bytes(),
            static_cast<size_t>(2 * shape.layers * 16 * shape.heads * (shape.qk + shape.v)) *
                sizeof(float));
  EXPECT_EQ(spec_->PlannedKvCacheBytes(2, 16), static_cast<double>(inference->kv_cache_bytes()));
  std::vector<float> logits(kVocab);
  const int64_t prompt = 5;
  inference->Prefill(1, tokens.data(), prompt, logits.data());
  EXPECT_EQ(inference->length(1), prompt);
  double worst = 0;
  for (int64_t t = prompt;; ++t) {
    const std::vector<int32_t> prefix(tokens.begin(), tokens.begin() + t);
    const std::vector<float> full = FullLastLogits(prefix);
    double spread = 0;
    for (int64_t v = 0; v < kVocab; ++v) {
      EXPECT_NEAR(logits[v], full[v], 2e-4) << "position " << t - 1 << " token " << v;
      worst = std::max(worst, std::fabs(static_cast<double>(logits[v] - full[v])));
      spread = std::max(spread, std::fabs(static_cast<double>(full[v] - full[0])));
    }
    EXPECT_GT(spread, 0.1);  // the logits say something
    if (t == 16) break;
    const int64_t slot = 1;
    inference->Decode(&slot, &tokens[t], 1, logits.data());
    EXPECT_EQ(inference->length(1), t + 1);
  }
  std::printf("%s: worst |cached - full| logit %.3g\n", shape.name, worst);
}

// Decodes `steps` tokens (each the argmax) for sequence `a` in slot `a_slot`, with the other
// prompts in the other slots decoded beside it (in reverse slot order when `reverse_order`);
// returns a's logits at every step.
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
    next.push_back(other[0]);
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

TEST_P(DeepSeekInference, DecodeLogitsDoNotDependOnTheBatchOrTheThreads) {
  const std::vector<int32_t> a = Tokens(3, 5);
  auto alone_model = spec_->StartInference(*access_, 1, 32, DefaultCpuBackend());
  const std::vector<float> alone = DecodeBeside(*alone_model, a, 0, {}, 10, false);
  // Seven sequences beside it: with 8 experts and 2 per token, rows share experts at every step,
  // so each expert's MatmulRows runs over several rows.
  std::vector<std::vector<int32_t>> others;
  for (uint64_t seed = 4; seed < 11; ++seed) others.push_back(Tokens(seed, 2 + 3 * (seed % 4)));
  auto batched_model = spec_->StartInference(*access_, 8, 32, DefaultCpuBackend());
  const std::vector<float> batched = DecodeBeside(*batched_model, a, 5, others, 10, true);
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

TEST_P(DeepSeekInference, RefusesAPromptBeyondItsCacheNamingTheSlot) {
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
  EXPECT_THROW(inference->Decode(&slot, &tokens[8], 1, logits.data()), Error);
}

// ---- shared prompt prefill (shared_prefill_checks.h) ----

TEST_P(DeepSeekInference, CopySlotDecodesAsAPrefill) {
  const std::vector<int32_t> prompt = Tokens(21, 7);
  shared_prefill::CheckCopySlotDecodesAsAPrefill(
      [&](int64_t slots, int64_t max_len) {
        return spec_->StartInference(*access_, slots, max_len, DefaultCpuBackend());
      },
      prompt);
  shared_prefill::CheckCopySlotDecodesAsAPrefill(
      [&](int64_t slots, int64_t max_len) {
        return spec_->StartInference(*access_, slots, max_len, std::make_shared<StagedBackend>());
      },
      prompt);
}

TEST_P(DeepSeekInference, CopySlotRefusesWrongSlots) {
  shared_prefill::CheckCopySlotRefusesWrongSlots(
      [&](int64_t slots, int64_t max_len) {
        return spec_->StartInference(*access_, slots, max_len, DefaultCpuBackend());
      },
      Tokens(22, 5));
}

TEST_P(DeepSeekInference, EngineSharesPromptPrefillsBitForBit) {
  shared_prefill::CheckEngineSharesPromptPrefills(
      [&](int64_t slots, int64_t max_len) {
        return spec_->StartInference(*access_, slots, max_len, DefaultCpuBackend());
      },
      [&](int i) { return Tokens(30 + i, 3 + 2 * i); });
}

INSTANTIATE_TEST_SUITE_P(Shapes, DeepSeekInference, ::testing::ValuesIn(kShapes),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace crucible
