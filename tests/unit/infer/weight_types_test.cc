// Generation with 16-bit weight matrices (model/inference_weights.h): an inference path started
// with --dtype f16 or bf16 is, bit for bit, the float32 path over weights rounded to that type
// (every matrix but a router; norms and biases as they are), in prefill and in every decode step,
// for both families; and it holds 1.5x the float32 weights' bytes (the rounded floats for prefill
// and the packed halves for decode).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/philox.h"
#include "kernels/cpu/half.h"
#include "model/model.h"

namespace crucible {
namespace {

constexpr int64_t kVocab = 64;

std::shared_ptr<const ModelSpec> Spec(const std::vector<std::string>& overrides) {
  Config config = Config::Defaults();
  for (const std::string& o : overrides) config.ApplyOverride(o);
  return BuildModelSpec(config);
}

const std::vector<std::string> kLlama = {"model.vocab_size=64", "model.dim=32",
                                         "model.n_heads=4",     "model.n_kv_heads=2",
                                         "model.n_layers=2",    "model.ffn_hidden_dim=48"};
const std::vector<std::string> kDeepSeek = {"model.name=deepseek_v3",
                                            "model.flavor=debug",
                                            "model.vocab_size=64",
                                            "model.dim=32",
                                            "model.n_layers=3",
                                            "model.n_heads=4",
                                            "model.ffn_hidden_dim=48",
                                            "model.n_routed_experts=8",
                                            "model.num_experts_per_tok=2",
                                            "model.moe_intermediate_size=16",
                                            "model.first_k_dense_replace=1",
                                            "model.q_lora_rank=24",
                                            "model.kv_lora_rank=16",
                                            "model.qk_nope_head_dim=8",
                                            "model.qk_rope_head_dim=4",
                                            "model.v_head_dim=6",
                                            "model.n_shared_experts=1"};

// Prefill of 5 tokens into slot 1, then 6 decode steps of slots {1, 0} (slot 0 prefilled with 3):
// every logit, in order.
std::vector<float> Run(InferenceModel& inference) {
  Philox rng(3, 1);
  std::vector<int32_t> tokens(16);
  for (auto& t : tokens) t = static_cast<int32_t>(rng.NextU32() % kVocab);
  std::vector<float> all, logits(2 * kVocab);
  inference.Prefill(1, tokens.data(), 5, logits.data());
  all.insert(all.end(), logits.begin(), logits.begin() + kVocab);
  inference.Prefill(0, tokens.data() + 5, 3, logits.data());
  all.insert(all.end(), logits.begin(), logits.begin() + kVocab);
  const int64_t slots[2] = {1, 0};
  for (int step = 0; step < 6; ++step) {
    inference.Decode(slots, tokens.data() + 8 + step, 2, logits.data());
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

void ExpectRoundedModel(const std::vector<std::string>& overrides, WeightType type) {
  const auto spec = Spec(overrides);
  const ParameterTable table = spec->BuildTable();
  std::vector<float> weights(table.total());
  spec->InitWeights(table, 5, 0, weights.size(), weights.data());
  for (float& w : weights) w *= 4.0f;
  // The weights a 16-bit run computes with: each matrix rounded, the routers kept.
  std::vector<float> rounded = weights;
  size_t matrices = 0;
  for (const ParamInfo& p : table.params()) {
    const bool matrix = p.kind == ParamKind::kEmbedding || p.kind == ParamKind::kLinear ||
                        p.kind == ParamKind::kOutputProjection || p.kind == ParamKind::kHead;
    if (!matrix || p.shape.size() != 2 || p.name.ends_with("mlp.gate.weight")) continue;
    ++matrices;
    for (size_t i = p.offset; i < p.offset + p.numel; ++i)
      rounded[i] = type == WeightType::kF16 ? kernels::FromFp16(kernels::Fp16Bits(weights[i]))
                                            : kernels::FromBf16(kernels::Bf16Bits(weights[i]));
  }
  ASSERT_GT(matrices, 4u);
  FlatParameterAccess original(table, weights.data(), nullptr);
  FlatParameterAccess pre_rounded(table, rounded.data(), nullptr);
  auto half = spec->StartInference(original, 2, 16, DefaultCpuBackend(), type);
  auto reference = spec->StartInference(pre_rounded, 2, 16, DefaultCpuBackend(), WeightType::kF32);
  auto unrounded = spec->StartInference(original, 2, 16, DefaultCpuBackend(), WeightType::kF32);
  const std::vector<float> got = Run(*half), expected = Run(*reference), f32 = Run(*unrounded);
  ASSERT_EQ(got.size(), expected.size());
  EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0)
      << WeightTypeName(type) << ": not the float32 path over the rounded weights";
  // ... and the rounding is visible: the logits are not the float32 model's.
  EXPECT_NE(std::memcmp(got.data(), f32.data(), got.size() * sizeof(float)), 0);
  EXPECT_EQ(half->weight_bytes(), table.total() * (sizeof(float) + sizeof(uint16_t)));
  EXPECT_EQ(unrounded->weight_bytes(), table.total() * sizeof(float));
}

TEST(SixteenBitWeights, LlamaF16IsTheFloat32PathOverRoundedWeights) {
  ExpectRoundedModel(kLlama, WeightType::kF16);
}
TEST(SixteenBitWeights, LlamaBf16IsTheFloat32PathOverRoundedWeights) {
  ExpectRoundedModel(kLlama, WeightType::kBF16);
}
TEST(SixteenBitWeights, DeepSeekF16IsTheFloat32PathOverRoundedWeightsRoutersKept) {
  ExpectRoundedModel(kDeepSeek, WeightType::kF16);
}
TEST(SixteenBitWeights, DeepSeekBf16IsTheFloat32PathOverRoundedWeightsRoutersKept) {
  ExpectRoundedModel(kDeepSeek, WeightType::kBF16);
}

}  // namespace
}  // namespace crucible
