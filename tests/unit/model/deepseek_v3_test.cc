// The deepseek_v3 family's plan, router, kernels and config checks. Its forward and backward are
// checked against a float64 PyTorch reference in tests/integration/test_deepseek_v3.py.
#include "model/deepseek_v3.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "common/error.h"
#include "distributed/communicator.h"
#include "kernels/cpu/kernels.h"
#include "model/moe_routing.h"

namespace crucible {
namespace {

Config Overridden(const std::vector<std::string>& overrides) {
  Config config = Config::Defaults();
  config.ApplyOverride("model.name=deepseek_v3");
  for (const auto& o : overrides) config.ApplyOverride(o);
  return config;
}

DeepSeekV3Config Model(const std::vector<std::string>& overrides) {
  Config config = Overridden(overrides);
  return BuildDeepSeekV3Config(config);
}

std::vector<DeepSeekV3Config> Models() {
  return {Model({}),
          Model({"model.flavor=small"}),
          Model({"model.flavor=base"}),
          Model({"model.q_lora_rank=0", "model.n_shared_experts=0", "model.tie_embeddings=true"}),
          Model({"model.first_k_dense_replace=0", "model.num_experts_per_tok=3"}),
          Model({"model.first_k_dense_replace=2"}),  // every layer dense
          Model({"model.dim=64", "model.n_layers=3", "model.n_heads=2", "model.kv_lora_rank=16",
                 "model.q_lora_rank=32", "model.v_head_dim=40", "model.n_routed_experts=6",
                 "model.n_group=3", "model.topk_group=3", "model.n_shared_experts=2"})};
}

TEST(DeepSeekV3, PlannedSizesAreTheParameterTableOfEveryFlavor) {
  for (const DeepSeekV3Config& c : Models()) {
    const ParameterTable table = DeepSeekV3ParameterTable(c);
    const DeepSeekV3Spec spec(c);
    const ParameterSizes planned = spec.PlannedSizes();
    const std::string where = c.flavor + " q_lora " + std::to_string(c.q_lora_rank);
    EXPECT_EQ(planned.parameters, static_cast<double>(table.total())) << where;
    EXPECT_EQ(planned.first_unit, static_cast<double>(table.units()[0].size())) << where;
    EXPECT_EQ(planned.largest_unit, static_cast<double>(table.max_unit_size())) << where;
    EXPECT_EQ(planned.tensors, static_cast<double>(table.params().size())) << where;
    std::array<double, kParamKindCount> elements{}, tensors{};
    double experts = 0;
    for (const ParamInfo& p : table.params()) {
      elements[static_cast<size_t>(p.kind)] += static_cast<double>(p.numel);
      tensors[static_cast<size_t>(p.kind)] += 1;
      if (p.name.find(".mlp.experts.") != std::string::npos)
        experts += static_cast<double>(p.numel);
    }
    EXPECT_EQ(planned.kind_parameters, elements) << where;
    EXPECT_EQ(planned.kind_tensors, tensors) << where;
    // Active: the routed experts counted num_experts_per_tok times of n_routed_experts.
    const double active = static_cast<double>(table.total()) -
                          experts * (1.0 - static_cast<double>(c.num_experts_per_tok) /
                                               static_cast<double>(c.n_routed_experts));
    EXPECT_NEAR(planned.active, active, 1e-6 * active) << where;
  }
}

TEST(DeepSeekV3, FlavorsHaveTheDocumentedSizes) {
  const DeepSeekV3Sizes debug = PlannedDeepSeekV3Sizes(Model({}));
  const DeepSeekV3Sizes small = PlannedDeepSeekV3Sizes(Model({"model.flavor=small"}));
  const DeepSeekV3Sizes base = PlannedDeepSeekV3Sizes(Model({"model.flavor=base"}));
  EXPECT_NEAR(debug.parameters / 1e6, 1.03, 0.005);
  EXPECT_NEAR(debug.active / 1e6, 0.88, 0.005);
  EXPECT_NEAR(small.parameters / 1e6, 61.3, 0.05);
  EXPECT_NEAR(small.active / 1e6, 23.5, 0.05);
  EXPECT_NEAR(base.parameters / 1e6, 122.1, 0.05);
  EXPECT_NEAR(base.active / 1e6, 78.8, 0.05);
}

TEST(DeepSeekV3, AnExpertParallelRankHoldsItsBlockOfTheExpertsAndPlansWhatItHolds) {
  for (const DeepSeekV3Config& c : Models()) {
    if (c.moe_layers() == 0) continue;
    const ParameterTable whole = DeepSeekV3ParameterTable(c);
    const DeepSeekV3Spec spec(c);
    for (int ep : {2, 4}) {
      if (c.n_routed_experts % ep != 0) continue;
      std::vector<float> values(whole.total()), together(whole.total(), -1.0f);
      for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
      size_t experts_held = 0;
      for (int r = 0; r < ep; ++r) {
        const ParameterTable part = DeepSeekV3ParameterTable(c, ep, r);
        const std::string where =
            c.flavor + " ep " + std::to_string(ep) + " rank " + std::to_string(r);
        EXPECT_TRUE(part.partial()) << where;
        ModelParallelism parallelism;
        parallelism.ep_degree = ep;
        parallelism.ep_rank = r;
        const ParameterSizes planned = spec.PlannedSizes(parallelism);
        EXPECT_EQ(planned.parameters, static_cast<double>(part.total())) << where;
        EXPECT_EQ(planned.largest_unit, static_cast<double>(part.max_unit_size())) << where;
        EXPECT_EQ(planned.tensors, static_cast<double>(part.params().size())) << where;
        std::array<double, kParamKindCount> elements{};
        for (const ParamInfo& p : part.params()) {
          elements[static_cast<size_t>(p.kind)] += static_cast<double>(p.numel);
          if (p.expert < 0) continue;
          // Its own block of experts, under their whole-model names and places.
          const int64_t held = c.n_routed_experts / ep;
          EXPECT_GE(p.expert, held * r) << p.name;
          EXPECT_LT(p.expert, held * (r + 1)) << p.name;
          EXPECT_EQ(whole.params()[p.whole_index].name, p.name);
          ++experts_held;
        }
        EXPECT_EQ(planned.kind_parameters, elements) << where;
        // The parts of every rank put together are the whole model.
        std::vector<float> mine(part.total());
        CopyWholeToParts(whole, values.data(), part, mine.data());
        CopyPartsToWhole(part, mine.data(), whole, together.data());
      }
      size_t whole_experts = 0;
      for (const ParamInfo& p : whole.params()) whole_experts += p.expert >= 0;
      EXPECT_EQ(experts_held, whole_experts);
      EXPECT_EQ(together, values) << c.flavor << " ep " << ep;  // dense tensors from every rank
    }
  }
}

// ForwardOptions::seq_len: rows shorter than the model was built for, laid out (B, seq_len), give
// the bits of a model built for that length (the MoE layer's routing and balance loss included).
TEST(DeepSeekV3, ShorterRowsGiveTheBitsOfAModelBuiltForThem) {
  const DeepSeekV3Spec spec(Model({}));
  constexpr int64_t B = 2, T = 12, kShort = 7;
  std::unique_ptr<crucible::Model> built = spec.Build(B, T), built_short = spec.Build(B, kShort);
  std::vector<float> weights(built->table().total());
  spec.InitWeights(built->table(), 5, 0, weights.size(), weights.data());
  std::mt19937 rng(3);
  std::vector<int32_t> tokens(B * kShort), targets(B * kShort);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>(rng() % spec.vocab_size());
    targets[i] = i % 4 == 3 ? -1 : static_cast<int32_t>(rng() % spec.vocab_size());
  }
  auto pass = [&](crucible::Model& model, int64_t seq_len, std::vector<float>* grads) {
    grads->assign(weights.size(), 0.0f);
    FlatParameterAccess access(model.table(), weights.data(), grads->data());
    ForwardOptions options = ForwardOptions::Fused(0.25f);
    options.seq_len = seq_len;
    const LossSum sum = model.Forward(access, tokens.data(), targets.data(), nullptr, options);
    model.Backward(access, 0.25f);
    return sum;
  };
  std::vector<float> shorter, reference;
  const LossSum a = pass(*built, kShort, &shorter), b = pass(*built_short, 0, &reference);
  EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(&a.aux, &b.aux, sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(shorter.data(), reference.data(), 4 * shorter.size()), 0);
  EXPECT_EQ(built->seq_len(), T);
}

TEST(DeepSeekV3, PlannedActivationsAreWhatTheModelAllocates) {
  for (const DeepSeekV3Config& c : Models()) {
    if (c.flavor != "debug") continue;  // the big flavors' activations need not be allocated
    for (auto [B, T] : {std::pair<int64_t, int64_t>{1, 16}, {2, 40}}) {
      const DeepSeekV3Spec spec(c);
      EXPECT_EQ(spec.PlannedBuffers(B, T).activation_bytes,
                static_cast<double>(spec.Build(B, T)->activation_bytes()))
          << "q_lora " << c.q_lora_rank << " first dense " << c.first_k_dense_replace;
      // An expert owner's buffers under expert parallelism (the rows of every rank of its
      // group, the other ranks' weight gradients): planned as allocated at each degree.
      std::unique_ptr<Communicator> group = Communicator::OneRank();
      for (int ep : {2, 4}) {
        if (c.moe_layers() == 0 || c.n_routed_experts % ep != 0) continue;
        ModelParallelism parallelism;
        parallelism.ep_degree = ep;
        parallelism.expert_parallel = group.get();
        const double planned = spec.PlannedBuffers(B, T, parallelism).activation_bytes;
        EXPECT_EQ(planned, static_cast<double>(
                               spec.Build(B, T, MakeBackend({}), parallelism)->activation_bytes()))
            << "ep " << ep;
        EXPECT_GT(planned, spec.PlannedBuffers(B, T).activation_bytes);
      }
    }
  }
}

TEST(DeepSeekV3, RefusesWhatItCannotBuildInOneLineWithExitTwo) {
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"model.n_routed_experts=6", "model.n_group=4"},
       "model.n_routed_experts (6) must be divisible by model.n_group (4)"},
      {{"model.num_experts_per_tok=9"},
       "model.num_experts_per_tok (9) is larger than model.n_routed_experts (8)"},
      {{"model.num_experts_per_tok=5"},
       "model.num_experts_per_tok (5) is larger than the 4 experts of the model.topk_group = 1 "
       "groups"},
      {{"model.topk_group=3"}, "model.topk_group (3) is larger than model.n_group (2)"},
      {{"model.kv_lora_rank=200"}, "model.kv_lora_rank (200) is larger than model.dim (128)"},
      {{"model.q_lora_rank=129"}, "model.q_lora_rank (129) is larger than model.dim (128)"},
      {{"model.qk_rope_head_dim=7"}, "model.qk_rope_head_dim (7) must be even"},
      {{"model.first_k_dense_replace=3"}, "model.first_k_dense_replace (3) must be between 0"},
      {{"model.flavor=1b"}, "model.flavor: unknown deepseek_v3 flavor '1b'"},
  };
  for (const auto& [overrides, message] : cases) {
    try {
      Config config = Overridden(overrides);
      // n_group 4 only where the case sets it; the others keep the flavor's 2.
      BuildDeepSeekV3Config(config);
      ADD_FAILURE() << "accepted " << overrides[0];
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), kExitUsage) << overrides[0];
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos)
          << overrides[0] << ": " << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
}

TEST(DeepSeekV3, KeysOfTheFamilyAreRefusedForAnotherOne) {
  Config config = Config::Defaults();
  config.ApplyOverride("model.kv_lora_rank=32");
  try {
    BuildModelSpec(config);
    FAIL() << "llama accepted a deepseek_v3 key";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    EXPECT_NE(std::string(e.what()).find("model.kv_lora_rank (--set model.kv_lora_rank=32): a key "
                                         "of model.name = \"deepseek_v3\", not of \"llama\""),
              std::string::npos)
        << e.what();
  }
  config.ApplyOverride("model.name=deepseek_v3");
  EXPECT_EQ(BuildModelSpec(config)->name(), "deepseek_v3");
}

TEST(DeepSeekV3, ARecordedConfigWithEveryKeyAtItsDefaultBuildsEitherFamily) {
  // A run's config.toml (Config::ToToml) writes every key, those of the other family at their
  // defaults: read back (crucible export, resume), it is not refused.
  for (const char* name : {"llama", "deepseek_v3"}) {
    Config written = Config::Defaults();
    written.ApplyOverride(std::string("model.name=") + name);
    Config config = Config::Parse(written.ToToml(), "run/config.toml");
    EXPECT_EQ(BuildModelSpec(config)->name(), name);
  }
  // A key set to its default on the command line is not a setting of the other family either.
  Config config = Config::Defaults();
  config.ApplyOverride("model.bias_update_speed=0.001");
  EXPECT_EQ(BuildModelSpec(config)->name(), "llama");
}

TEST(DeepSeekV3, RefusesTensorParallelismAndBackendsWithoutItsKernels) {
  const DeepSeekV3Spec spec(Model({}));
  EXPECT_NE(spec.CheckParallelism(ModelParallelism::Layout(2, 0, 2)), "");
  ModelParallelism experts;
  experts.ep_degree = 3;  // does not divide the 8 experts
  EXPECT_NE(spec.CheckParallelism(experts).find("parallelism.expert_parallel_degree = 3 does not "
                                                "divide model.n_routed_experts = 8"),
            std::string::npos);
  experts.ep_degree = 4;
  EXPECT_EQ(spec.CheckParallelism(experts), "");
  BackendOptions portable;
  portable.portable_exact = true;
  try {
    spec.Build(1, 8, MakeBackend(portable));
    FAIL() << "built on a backend that refuses the inherited kernels";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    EXPECT_NE(std::string(e.what()).find("model.name = \"deepseek_v3\" on training.device"),
              std::string::npos)
        << e.what();
  }
}

// ---- the router ----

MoeRouterConfig Router(int64_t E, int64_t K, int64_t groups, int64_t topk_groups, bool normalize,
                       float factor) {
  return {E, K, groups, topk_groups, factor, normalize};
}

float Logit(float s) {
  return std::log(s / (1.0f - s));
}

TEST(MoeRouting, ChoosesTheTopExpertsOfTheBestGroupsWithTiesToTheLowerIndex) {
  // 8 experts in 4 groups of 2; 2 groups eligible; top 3.
  const MoeRouterConfig config = Router(8, 3, 4, 2, true, 2.0f);
  // Group scores (sum of both): g0 0.3, g1 1.5, g2 0.95 + 0.1 = 1.05, g3 1.5: g1 and g3 (a tie
  // at 1.5 with nobody else, both taken). Among experts 2 3 6 7: 0.9 0.6 0.9 0.6: 2, 6 (tie at
  // 0.9 to the lower index first), then 3 (0.6, lower than 7).
  const float s[8] = {0.1f, 0.2f, 0.9f, 0.6f, 0.95f, 0.1f, 0.9f, 0.6f};
  // Expert 4 alone has the highest affinity, but its group (0.95 + 0.1) is not among the best.
  float logits[8];
  for (int e = 0; e < 8; ++e) logits[e] = Logit(s[e]);
  MoeRouting r;
  RouteTokens(config, logits, nullptr, 1, &r);
  EXPECT_EQ(r.expert, (std::vector<int32_t>{2, 6, 3}));
  const float sum = r.affinity[2] + r.affinity[6] + r.affinity[3];
  EXPECT_FLOAT_EQ(r.weight[0], 2.0f * r.affinity[2] / sum);
  EXPECT_FLOAT_EQ(r.weight[2], 2.0f * r.affinity[3] / sum);
  // The bias chooses without weighing: +1 on expert 4 makes its group and it the best.
  const float bias[8] = {0, 0, 0, 0, 1.0f, 0, 0, 0};
  RouteTokens(config, logits, bias, 1, &r);
  EXPECT_EQ(r.expert[0], 4);
  const float biased_sum =
      r.affinity[r.expert[0]] + r.affinity[r.expert[1]] + r.affinity[r.expert[2]];
  EXPECT_FLOAT_EQ(r.weight[0], 2.0f * r.affinity[4] / biased_sum);
}

TEST(MoeRouting, LaysTheRowsOutByExpertThenToken) {
  const MoeRouterConfig config = Router(4, 2, 1, 1, false, 1.0f);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  const int64_t N = 37;
  std::vector<float> logits(N * 4);
  for (float& x : logits) x = normal(rng);
  MoeRouting r;
  RouteTokens(config, logits.data(), nullptr, N, &r);
  EXPECT_EQ(r.expert_begin.front(), 0);
  EXPECT_EQ(r.expert_begin.back(), N * 2);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t k = 0; k < 2; ++k) {
      const int64_t row = r.row[t * 2 + k], e = r.expert[t * 2 + k];
      EXPECT_EQ(r.row_token[row], t);
      EXPECT_GE(row, r.expert_begin[e]);
      EXPECT_LT(row, r.expert_begin[e + 1]);
    }
  for (int64_t e = 0; e < 4; ++e)
    for (int64_t row = r.expert_begin[e] + 1; row < r.expert_begin[e + 1]; ++row)
      EXPECT_LT(r.row_token[row - 1], r.row_token[row]);
}

// RouteBackward against central differences of sum_k g_k w_k(z) in double.
TEST(MoeRouting, TheBackwardIsTheDerivativeOfTheWeights) {
  for (bool normalize : {true, false}) {
    const MoeRouterConfig config = Router(6, 3, 1, 1, normalize, 2.5f);
    const float z[6] = {0.3f, -1.2f, 0.8f, 0.05f, -0.4f, 1.1f};
    const float g[3] = {0.7f, -0.2f, 1.3f};
    MoeRouting r;
    RouteTokens(config, z, nullptr, 1, &r);
    float dz[6];
    RouteBackward(config, r, g, dz);
    auto objective = [&](int e, double h) {
      double s[6], sum = 0;
      for (int j = 0; j < 6; ++j) s[j] = 1.0 / (1.0 + std::exp(-(z[j] + (j == e ? h : 0.0))));
      for (int k = 0; k < 3; ++k) sum += s[r.expert[k]];
      double value = 0;
      for (int k = 0; k < 3; ++k) value += g[k] * 2.5 * s[r.expert[k]] / (normalize ? sum : 1.0);
      return value;
    };
    for (int e = 0; e < 6; ++e) {
      const double numeric = (objective(e, 1e-5) - objective(e, -1e-5)) / 2e-5;
      EXPECT_NEAR(dz[e], numeric, 1e-5) << "expert " << e << " normalize " << normalize;
    }
    EXPECT_EQ(dz[1], 0.0f);  // not chosen (the lowest affinity)
  }
}

// ---- kernels ----

TEST(DeepSeekV3Kernels, AStridedRopeIsRopeOnItsPartAndLeavesTheRestAlone) {
  const int64_t B = 2, T = 5, H = 3, D = 8, stride = 20, offset = 12;
  std::vector<float> cos_table(T * D / 2), sin_table(T * D / 2);
  kernels::rope_tables(cos_table.data(), sin_table.data(), T, D, 10000.0);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> x(B * T * H * stride), part(B * T * H * D);
  for (float& v : x) v = normal(rng);
  for (int64_t i = 0; i < B * T * H; ++i)
    std::copy_n(x.data() + i * stride + offset, D, part.data() + i * D);
  std::vector<float> rotated = x;
  kernels::rope_forward_strided(rotated.data(), cos_table.data(), sin_table.data(), B, T, H, D,
                                stride, offset);
  kernels::rope_forward(part.data(), cos_table.data(), sin_table.data(), B, T, H, D);
  for (int64_t i = 0; i < B * T * H; ++i)
    for (int64_t j = 0; j < stride; ++j) {
      const float expected =
          j >= offset && j < offset + D ? part[i * D + j - offset] : x[i * stride + j];
      ASSERT_EQ(rotated[i * stride + j], expected) << i << " " << j;
    }
  kernels::rope_backward_strided(rotated.data(), cos_table.data(), sin_table.data(), B, T, H, D,
                                 stride, offset);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(rotated[i], x[i], 1e-6);
}

// A token's combined output and its gradients depend on its own rows only: the same bits
// whatever other tokens are routed beside it (what expert parallelism will rely on).
TEST(DeepSeekV3Kernels, ATokensCombineDoesNotDependOnTheOtherTokens) {
  const int64_t K = 2, C = 37;
  std::mt19937 rng(2);
  std::normal_distribution<float> normal;
  std::vector<float> y_token(K * C), w_token(K), d_token(C);
  for (float& v : y_token) v = normal(rng);
  for (float& v : w_token) v = normal(rng);
  for (float& v : d_token) v = normal(rng);
  std::vector<std::vector<float>> outs, dweights;
  for (int64_t N : {1, 5}) {
    // The token of interest is token N - 1, its rows last in the layout.
    std::vector<float> y(N * K * C), w(N * K), out(N * C, 0.5f), d(N * C);
    std::vector<int32_t> rows(N * K);
    for (float& v : y) v = normal(rng);
    for (float& v : w) v = normal(rng);
    for (float& v : d) v = normal(rng);
    for (int64_t i = 0; i < N * K; ++i) rows[i] = static_cast<int32_t>(N * K - 1 - i);
    for (int64_t k = 0; k < K; ++k) {
      std::copy_n(y_token.data() + k * C, C, y.data() + rows[(N - 1) * K + k] * C);
      w[(N - 1) * K + k] = w_token[k];
    }
    std::copy_n(d_token.data(), C, d.data() + (N - 1) * C);
    kernels::moe_combine(out.data(), y.data(), rows.data(), w.data(), N, K, C);
    std::vector<float> dy(N * K * C), dw(N * K);
    kernels::moe_combine_backward(dy.data(), dw.data(), d.data(), y.data(), rows.data(), w.data(),
                                  N, K, C);
    outs.emplace_back(out.end() - C, out.end());
    dweights.emplace_back(dw.end() - K, dw.end());
  }
  EXPECT_EQ(outs[0], outs[1]);
  EXPECT_EQ(dweights[0], dweights[1]);
}

}  // namespace
}  // namespace crucible
