// Llama behind the model interface: its per-unit layout, loss weights, the spec's plans and
// initialisation, and its Hugging Face mapping.
#include "model/llama.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/error.h"
#include "common/philox.h"

namespace crucible {
namespace {

std::shared_ptr<const ModelSpec> Spec(const std::vector<std::string>& overrides) {
  Config config = Config::Defaults();
  for (const auto& o : overrides) config.ApplyOverride(o);
  return BuildModelSpec(config);
}

const std::vector<std::string> kSmall = {"model.vocab_size=64", "model.dim=32",
                                         "model.n_heads=4",     "model.n_kv_heads=2",
                                         "model.n_layers=2",    "model.ffn_hidden_dim=48"};

// One forward and backward of a Llama on fixed tokens: the loss sum and the gradient.
struct Pass {
  LossSum sum;
  std::vector<float> grads;
};

class LlamaPasses : public ::testing::Test {
 protected:
  static constexpr int64_t B = 2, T = 8;
  void SetUp() override {
    spec_ = Spec(kSmall);
    model_ = spec_->Build(B, T);
    weights_.resize(model_->table().total());
    spec_->InitWeights(model_->table(), 3, 0, weights_.size(), weights_.data());
    Philox rng(11, 0);
    tokens_.resize(B * T);
    targets_.resize(B * T);
    for (int64_t i = 0; i < B * T; ++i) {
      tokens_[i] = static_cast<int32_t>(rng.NextU32() % 64);
      targets_[i] = i % 5 == 4 ? -1 : static_cast<int32_t>(rng.NextU32() % 64);
    }
  }
  Pass Run(const std::vector<int32_t>& targets, const float* loss_weights, float loss_scale) {
    Pass pass;
    pass.grads.assign(weights_.size(), 0.0f);
    FlatParameterAccess access(model_->table(), weights_.data(), pass.grads.data());
    pass.sum = model_->Forward(access, tokens_.data(), targets.data(), loss_weights,
                               ForwardOptions::Fused(loss_scale));
    model_->Backward(access, loss_scale);
    return pass;
  }
  static bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
  }

  std::shared_ptr<const ModelSpec> spec_;
  std::unique_ptr<Model> model_;
  std::vector<float> weights_;
  std::vector<int32_t> tokens_, targets_;
};

TEST_F(LlamaPasses, AllOnesLossWeightsGiveTheBitsOfNoWeights) {
  const std::vector<float> ones(B * T, 1.0f);
  const Pass none = Run(targets_, nullptr, 0.1f), weighted = Run(targets_, ones.data(), 0.1f);
  EXPECT_EQ(none.sum.weight, 13.0);  // 16 positions, 3 ignored
  EXPECT_EQ(weighted.sum.weight, none.sum.weight);
  EXPECT_EQ(std::memcmp(&weighted.sum.loss, &none.sum.loss, sizeof(double)), 0);
  EXPECT_TRUE(SameBits(weighted.grads, none.grads));
}

TEST_F(LlamaPasses, AZeroWeightIsAnIgnoredTarget) {
  std::vector<float> weights(B * T, 1.0f);
  std::vector<int32_t> fewer = targets_;
  for (int64_t i : {1, 6, 10}) weights[i] = 0.0f, fewer[i] = -1;
  const Pass zero = Run(targets_, weights.data(), 0.1f), ignored = Run(fewer, nullptr, 0.1f);
  EXPECT_EQ(zero.sum.weight, 10.0);
  EXPECT_EQ(zero.sum.weight, ignored.sum.weight);
  EXPECT_EQ(std::memcmp(&zero.sum.loss, &ignored.sum.loss, sizeof(double)), 0);
  EXPECT_TRUE(SameBits(zero.grads, ignored.grads));
}

TEST_F(LlamaPasses, AWeightScalesItsTokensLossAndGradient) {
  const std::vector<float> twos(B * T, 2.0f);
  const Pass doubled = Run(targets_, twos.data(), 0.1f), plain = Run(targets_, nullptr, 0.2f);
  EXPECT_EQ(doubled.sum.loss, 2 * plain.sum.loss);
  EXPECT_EQ(doubled.sum.weight, 26.0);
  EXPECT_TRUE(SameBits(doubled.grads, plain.grads));
  // One token's weight moves the gradient: not every weight is ignored.
  std::vector<float> one(B * T, 1.0f);
  one[0] = 3.0f;
  EXPECT_FALSE(SameBits(Run(targets_, one.data(), 0.1f).grads, Run(targets_, nullptr, 0.1f).grads));
}

TEST_F(LlamaPasses, AFusedForwardKeepsNoLogitsAndRefusesWhatWouldNeedThem) {
  std::vector<float> grads(weights_.size());
  FlatParameterAccess access(model_->table(), weights_.data(), grads.data());
  const size_t planned = model_->activation_bytes();
  model_->Forward(access, tokens_.data(), targets_.data(), nullptr, ForwardOptions::Fused(0.5f));
  EXPECT_EQ(model_->activation_bytes(), planned);  // no whole logits
  auto refused = [](auto call, const char* what) {
    try {
      call();
      ADD_FAILURE() << what << " was served after a fused forward";
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), kExitFailure);
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused([&] { model_->logits(); }, "logits()");
  refused([&] { model_->Retarget(targets_.data()); }, "Retarget");
  refused([&] { model_->Backward(access, 0.25f); }, "loss scale");
  // A whole-logits forward allocates them once, as the plan says.
  model_->Forward(access, tokens_.data(), targets_.data(), nullptr, ForwardOptions::Logits());
  EXPECT_EQ(static_cast<double>(model_->activation_bytes() - planned),
            spec_->PlannedBuffers(B, T).whole_logits_bytes);
  EXPECT_NE(model_->logits(), nullptr);
}

// ForwardOptions::seq_len: rows shorter than the model was built for, laid out (B, seq_len), give
// the bits of a model built for that length, and the full length afterwards is unchanged.
TEST_F(LlamaPasses, ShorterRowsGiveTheBitsOfAModelBuiltForThem) {
  constexpr int64_t kShort = 5;
  std::vector<int32_t> tokens(B * kShort), targets(B * kShort);
  std::vector<float> weights(B * kShort);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < kShort; ++t) {
      tokens[b * kShort + t] = tokens_[b * T + t];
      targets[b * kShort + t] = targets_[b * T + t];
      weights[b * kShort + t] = 0.5f + 0.25f * static_cast<float>(t);
    }
  auto pass = [&](Model& model, int64_t seq_len) {
    Pass p;
    p.grads.assign(weights_.size(), 0.0f);
    FlatParameterAccess access(model.table(), weights_.data(), p.grads.data());
    ForwardOptions options = ForwardOptions::Fused(0.1f);
    options.seq_len = seq_len;
    p.sum = model.Forward(access, tokens.data(), targets.data(), weights.data(), options);
    model.Backward(access, 0.1f);
    return p;
  };
  const Pass full = Run(targets_, nullptr, 0.1f);
  std::unique_ptr<Model> built_short = spec_->Build(B, kShort);
  const Pass shorter = pass(*model_, kShort), reference = pass(*built_short, 0);
  EXPECT_EQ(model_->seq_len(), T);  // what it was built for
  EXPECT_EQ(std::memcmp(&shorter.sum.loss, &reference.sum.loss, sizeof(double)), 0);
  EXPECT_EQ(shorter.sum.weight, reference.sum.weight);
  EXPECT_TRUE(SameBits(shorter.grads, reference.grads));
  EXPECT_FALSE(SameBits(shorter.grads, full.grads));
  const Pass again = Run(targets_, nullptr, 0.1f);  // seq_len 0: the built length again
  EXPECT_EQ(std::memcmp(&again.sum.loss, &full.sum.loss, sizeof(double)), 0);
  EXPECT_TRUE(SameBits(again.grads, full.grads));
  // Longer than built: an internal error naming both lengths.
  try {
    pass(*built_short, T);
    ADD_FAILURE() << "rows longer than the model were served";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitFailure);
    EXPECT_NE(std::string(e.what()).find("rows of 8 positions on a model built for 5"),
              std::string::npos)
        << e.what();
  }
}

// Reweight after a whole-logits forward: the loss and the gradient of a forward that had been
// given those weights, bit for bit; the targets and the forward are unchanged.
TEST_F(LlamaPasses, ReweightGivesTheBitsOfAForwardWithThoseWeights) {
  std::vector<float> first(B * T), second(B * T);
  for (int64_t i = 0; i < B * T; ++i) {
    first[i] = 1.0f + 0.1f * static_cast<float>(i % 3);
    second[i] = -0.5f + 0.2f * static_cast<float>(i % 7);
  }
  auto pass = [&](const float* forward_weights, const float* reweight) {
    Pass p;
    p.grads.assign(weights_.size(), 0.0f);
    FlatParameterAccess access(model_->table(), weights_.data(), p.grads.data());
    p.sum = model_->Forward(access, tokens_.data(), targets_.data(), forward_weights,
                            ForwardOptions::Logits());
    if (reweight) p.sum = model_->Reweight(reweight);
    model_->Backward(access, 0.1f);
    return p;
  };
  const Pass reweighted = pass(first.data(), second.data()), direct = pass(second.data(), nullptr);
  EXPECT_EQ(std::memcmp(&reweighted.sum.loss, &direct.sum.loss, sizeof(double)), 0);
  EXPECT_EQ(reweighted.sum.weight, direct.sum.weight);
  EXPECT_TRUE(SameBits(reweighted.grads, direct.grads));
  EXPECT_FALSE(SameBits(reweighted.grads, pass(first.data(), nullptr).grads));
  // After a fused forward there are no logits to reweigh.
  std::vector<float> grads(weights_.size());
  FlatParameterAccess access(model_->table(), weights_.data(), grads.data());
  model_->Forward(access, tokens_.data(), targets_.data(), nullptr, ForwardOptions::Fused(0.5f));
  EXPECT_THROW(model_->Reweight(second.data()), Error);
}

TEST(LlamaFusedHead, ChunksAreAFunctionOfTheShapesWithinTheirBounds) {
  EXPECT_EQ(FusedHeadRows(4096, 8192), 512);   // small: 16 MiB of logits a chunk
  EXPECT_EQ(FusedHeadRows(4096, 32000), 512);  // base: at least 512 rows
  EXPECT_EQ(FusedHeadRows(16, 64), 16);        // never more than the rows
}

TEST(LlamaLayout, EveryLayerReadsItsTensorsWhereTheTableLaysThemOutInItsUnit) {
  for (const char* flavor : {"debug", "tiny", "small"}) {
    Config config = Config::Defaults();
    config.ApplyOverride(std::string("model.flavor=") + flavor);
    const LlamaModel model(BuildLlamaConfig(config), 1, 4, DefaultCpuBackend());
    const ParameterTable& table = model.table();
    for (int64_t l = 0; l < model.config().n_layers; ++l) {
      const LlamaModel::LayerOffsets& o = model.layer_offsets(l);
      const size_t base = table.units()[1 + l].begin;
      const std::string p = "model.layers." + std::to_string(l) + ".";
      const std::pair<const char*, size_t> expected[] = {
          {"input_layernorm.weight", o.ln1}, {"self_attn.q_proj.weight", o.q},
          {"self_attn.k_proj.weight", o.k},  {"self_attn.v_proj.weight", o.v},
          {"self_attn.o_proj.weight", o.o},  {"post_attention_layernorm.weight", o.ln2},
          {"mlp.gate_proj.weight", o.gate},  {"mlp.up_proj.weight", o.up},
          {"mlp.down_proj.weight", o.down}};
      for (const auto& [name, offset] : expected) {
        const ParamInfo& tensor = table.Find(p + name);
        EXPECT_EQ(base + offset, tensor.offset) << flavor << " " << p << name;
        EXPECT_LE(tensor.offset + tensor.numel, table.units()[1 + l].end) << p << name;
      }
    }
  }
}

TEST(LlamaSpec, PlansWhatItBuildsAndInitialisesAShardAsTheWhole) {
  std::vector<std::string> tied = kSmall;
  tied.push_back("model.tie_embeddings=true");
  for (const auto& overrides : {kSmall, tied}) {
    const std::shared_ptr<const ModelSpec> spec = Spec(overrides);
    EXPECT_EQ(spec->name(), "llama");
    const std::unique_ptr<Model> model = spec->Build(3, 16);
    const ParameterTable& table = model->table();
    const ParameterSizes sizes = spec->PlannedSizes();
    EXPECT_EQ(sizes.parameters, static_cast<double>(table.total()));
    EXPECT_EQ(sizes.first_unit, static_cast<double>(table.units()[0].size()));
    EXPECT_EQ(sizes.largest_unit, static_cast<double>(table.max_unit_size()));
    size_t largest_other = 0;
    for (size_t u = 1; u < table.units().size(); ++u)
      largest_other = std::max(largest_other, table.units()[u].size());
    EXPECT_EQ(sizes.largest_other_unit, static_cast<double>(largest_other));
    EXPECT_EQ(sizes.tensors, static_cast<double>(table.params().size()));
    const BufferSizes buffers = spec->PlannedBuffers(3, 16);
    EXPECT_EQ(buffers.activation_bytes, static_cast<double>(model->activation_bytes()));
    EXPECT_GT(buffers.total_bytes, buffers.activation_bytes);
    // Two shards, cut inside a tensor, hold the bits of one full initialisation.
    std::vector<float> whole(table.total()), shards(table.total());
    spec->InitWeights(table, 9, 0, table.total(), whole.data());
    const size_t cut = table.total() / 2 + 7;
    spec->InitWeights(table, 9, 0, cut, shards.data());
    spec->InitWeights(table, 9, cut, table.total(), shards.data() + cut);
    EXPECT_EQ(std::memcmp(whole.data(), shards.data(), 4 * whole.size()), 0);
  }
}

// `crucible config keys` documents tie_embeddings as true, false or flavor: a TOML boolean is
// taken as --set takes the word.
TEST(LlamaSpec, TieEmbeddingsTakesATomlBoolean) {
  for (const std::string value : {"true", "false"}) {
    Config config = Config::Parse("[model]\ntie_embeddings = " + value + "\n", "tied.toml");
    const ParameterTable table = BuildModelSpec(config)->BuildTable();
    bool has_head = false;
    for (const auto& p : table.params()) has_head |= p.name == "lm_head.weight";
    EXPECT_EQ(has_head, value == "false") << value;
    EXPECT_EQ(config.String("model.tie_embeddings"), value);
  }
  try {
    Config::Parse("[model]\ntie_embeddings = 1\n", "tied.toml");
    FAIL() << "an integer was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    EXPECT_STREQ(e.what(),
                 "tied.toml:2: model.tie_embeddings: expected true, false or a string, got an "
                 "integer");
  }
}

TEST(LlamaHf, ConfigJsonReadsBackAsTheSameModel) {
  const std::shared_ptr<const ModelSpec> spec = Spec(kSmall);
  ASSERT_NE(spec->hf(), nullptr);
  EXPECT_EQ(spec->hf()->architecture(), "LlamaForCausalLM");
  const nlohmann::json config =
      nlohmann::json::parse(spec->hf()->ConfigJson(64, 1, nullptr).dump());
  EXPECT_EQ(ModelNameForHfConfig(config, "config.json"), "llama");
  const std::shared_ptr<const ModelSpec> read = ModelSpecFromHfConfig(config, "config.json");
  EXPECT_TRUE(spec->hf()->Differences(config, "config.json").empty());
  EXPECT_TRUE(read->hf()->Differences(config, "config.json").empty());
  EXPECT_EQ(read->BuildTable().total(), spec->BuildTable().total());
  nlohmann::json wider = config;
  wider["hidden_size"] = 64;
  wider["head_dim"] = 16;  // hidden_size / heads, as transformers writes it
  EXPECT_EQ(spec->hf()->Differences(wider, "config.json"),
            std::vector<std::string>{"hidden_size=64 vs model.dim=32"});
}

TEST(LlamaHf, AModelTypeNoFamilyReadsIsRefusedNamingTheOnesThatAre) {
  nlohmann::json config = {{"model_type", "qwen2"}};
  try {
    ModelNameForHfConfig(config, "x/config.json");
    FAIL() << "qwen2 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitBadData);
    EXPECT_STREQ(e.what(),
                 "x/config.json: model_type 'qwen2' is not supported: crucible reads only "
                 "model_type 'deepseek_v3' (DeepseekV3ForCausalLM) or 'llama' (LlamaForCausalLM)");
  }
  config.erase("model_type");  // no model_type: the default [model] name
  EXPECT_EQ(ModelNameForHfConfig(config, "x/config.json"), "llama");
}

}  // namespace
}  // namespace crucible

namespace crucible {
namespace {

const std::vector<std::string> kSplittable = {"model.vocab_size=64", "model.dim=32",
                                              "model.n_heads=4",     "model.n_kv_heads=4",
                                              "model.n_layers=2",    "model.ffn_hidden_dim=48"};

// One fused forward and backward of `model` on the same weights and a batch drawn from `seed`
// (every fifth target ignored): the loss and the gradients.
struct FusedPass {
  LossSum loss;
  std::vector<float> grads;
};
FusedPass RunFused(Model& model, const std::vector<float>& weights, int64_t rows, uint64_t seed) {
  Philox rng(seed, 0);
  std::vector<int32_t> tokens(rows), targets(rows);
  for (int64_t i = 0; i < rows; ++i) {
    tokens[i] = static_cast<int32_t>(rng.NextU32() % 64);
    targets[i] = i % 5 == 4 ? -1 : static_cast<int32_t>(rng.NextU32() % 64);
  }
  FusedPass pass;
  pass.grads.assign(weights.size(), 0.0f);
  FlatParameterAccess access(model.table(), weights.data(), pass.grads.data());
  pass.loss =
      model.Forward(access, tokens.data(), targets.data(), nullptr, ForwardOptions::Fused(0.1f));
  model.Backward(access, 0.1f);
  return pass;
}

// A tensor-parallel rank's table: each tensor a part of the whole one, cut where Megatron cuts
// it, and the parts of every rank put together are the whole table's elements, each once.
TEST(LlamaTensorParallel, ThePartsOfEveryRankMakeUpTheWholeTable) {
  const std::shared_ptr<const ModelSpec> spec = Spec(kSplittable);
  const ParameterTable whole = spec->BuildTable();
  std::vector<float> values(whole.total()), rebuilt(whole.total(), -1.0f);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  for (int rank = 0; rank < 2; ++rank) {
    const ParameterTable part = spec->BuildTable(ModelParallelism::Layout(2, rank, 4));
    EXPECT_TRUE(part.sliced());
    EXPECT_EQ(part.FlopParams(), whole.FlopParams());  // the model's, not the part's
    const ParamInfo& q = part.Find("model.layers.0.self_attn.q_proj.weight");
    EXPECT_EQ(q.split_dim, 0);
    EXPECT_EQ(q.shape, (std::vector<int64_t>{16, 32}));
    EXPECT_EQ(q.global_shape, (std::vector<int64_t>{32, 32}));
    EXPECT_EQ(q.slice_begin, 16 * rank);
    const ParamInfo& o = part.Find("model.layers.0.self_attn.o_proj.weight");
    EXPECT_EQ(o.split_dim, 1);
    EXPECT_EQ(o.shape, (std::vector<int64_t>{32, 16}));
    // Element (row 1, column 2) of rank r's part is (1, 16 r + 2) of the whole.
    EXPECT_EQ(o.GlobalIndex(1 * 16 + 2), static_cast<size_t>(1 * 32 + 16 * rank + 2));
    EXPECT_FALSE(part.Find("model.norm.weight").sliced());
    std::vector<float> mine(part.total());
    CopyWholeToParts(whole, values.data(), part, mine.data());
    CopyPartsToWhole(part, mine.data(), whole, rebuilt.data());
  }
  EXPECT_EQ(std::memcmp(values.data(), rebuilt.data(), 4 * values.size()), 0);
}

// The blocks of the exact gradient sum's grid start at each piece of a layout-free run
// (distributed/exact_sum.h). Every degree must cut the same elements of the whole model into the
// same pieces: o_proj and down_proj are cut along their columns, so a rank's part of one is laid
// out otherwise at each degree and only a piece within one chunk of one row stays the same.
TEST(LlamaTensorParallel, LayoutFreeRunsCutTheSameElementsOfTheWholeModelAtEveryDegree) {
  const std::shared_ptr<const ModelSpec> spec = Spec(kSplittable);
  // Each piece as the (tensor, element of the whole tensor) pairs it holds, in its order.
  using Piece = std::vector<std::pair<size_t, size_t>>;
  auto pieces_at = [&](int degree) {
    std::vector<Piece> pieces;
    for (int rank = 0; rank < degree; ++rank) {
      const ParameterTable table = spec->BuildTable(ModelParallelism::Layout(degree, rank, 4));
      EXPECT_TRUE(table.chunked());
      for (int unit = 0; unit < static_cast<int>(table.units().size()); ++unit) {
        size_t covered = table.units()[unit].begin;
        for (const LayoutFreeRun& run : table.LayoutFreeRuns(unit)) {
          EXPECT_EQ(run.begin, covered);  // the runs cover the unit in order
          covered = run.end;
          for (size_t first = run.begin; first < run.end; first += run.piece) {
            Piece piece;
            for (size_t i = first; i < std::min(run.end, first + run.piece); ++i)
              for (size_t t = 0; t < table.params().size(); ++t) {
                const ParamInfo& p = table.params()[t];
                if (i >= p.offset && i < p.offset + p.numel)
                  piece.emplace_back(t, p.GlobalIndex(i - p.offset));
              }
            // A tensor every rank holds whole (a norm) counts once, from rank 0.
            if (rank == 0 || table.params()[piece.front().first].sliced()) pieces.push_back(piece);
          }
        }
        EXPECT_EQ(covered, table.units()[unit].end);
      }
    }
    std::sort(pieces.begin(), pieces.end());
    return pieces;
  };
  const std::vector<Piece> one = pieces_at(1);
  EXPECT_EQ(pieces_at(2), one);
  EXPECT_EQ(pieces_at(4), one);
  // A row-major piece of o_proj is one chunk of one row: 32 / 4 columns.
  const ParameterTable table = spec->BuildTable(ModelParallelism::Layout(2, 1, 4));
  EXPECT_EQ(table.Find("model.layers.0.self_attn.o_proj.weight").ChunkRun(), 8u);
  EXPECT_EQ(table.Find("model.layers.0.self_attn.q_proj.weight").ChunkRun(), 8u * 32);
  EXPECT_EQ(table.Find("model.norm.weight").ChunkRun(), 32u);
  // Without chunks a unit is one run, as data parallelism alone lays it out.
  const ParameterTable plain = spec->BuildTable();
  EXPECT_FALSE(plain.chunked());
  const std::vector<LayoutFreeRun> runs = plain.LayoutFreeRuns(1);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].begin, plain.units()[1].begin);
  EXPECT_EQ(runs[0].piece, plain.units()[1].size());
}

// The chunked model (every split dimension cut in 4, model/parallelism.h) computes the plain
// model's loss and gradients in another summation order: equal to rounding, not to the bit.
TEST(LlamaTensorParallel, ChunksComputeThePlainModelToRounding) {
  const std::shared_ptr<const ModelSpec> spec = Spec(kSplittable);
  constexpr int64_t B = 2, T = 8;
  const std::unique_ptr<Model> plain = spec->Build(B, T);
  const std::unique_ptr<Model> chunked =
      spec->Build(B, T, DefaultCpuBackend(), ModelParallelism::Layout(1, 0, 4));
  EXPECT_EQ(spec->PlannedBuffers(B, T).activation_bytes,
            static_cast<double>(plain->activation_bytes()));
  EXPECT_EQ(PlannedLlamaActivationBytes(static_cast<const LlamaSpec&>(*spec).config(), B, T,
                                        ModelParallelism::Layout(1, 0, 4)),
            static_cast<double>(chunked->activation_bytes()));
  std::vector<float> weights(plain->table().total());
  spec->InitWeights(plain->table(), 3, 0, weights.size(), weights.data());
  const FusedPass one = RunFused(*plain, weights, B * T, 5);
  const FusedPass two = RunFused(*chunked, weights, B * T, 5);
  const LossSum &l1 = one.loss, &l2 = two.loss;
  const std::vector<float>&g1 = one.grads, &g2 = two.grads;
  EXPECT_EQ(l1.weight, l2.weight);
  EXPECT_NEAR(l1.loss, l2.loss, 1e-5 * l1.loss);
  float largest = 0;
  for (float g : g1) largest = std::max(largest, std::fabs(g));
  ASSERT_GT(largest, 0.0f);
  for (size_t i = 0; i < g1.size(); ++i) ASSERT_NEAR(g1[i], g2[i], 1e-5f * largest) << i;
  std::vector<float> grads(weights.size());
  FlatParameterAccess access(chunked->table(), weights.data(), grads.data());
  const std::vector<int32_t> tokens(B * T, 1);
  EXPECT_THROW(
      chunked->Forward(access, tokens.data(), tokens.data(), nullptr, ForwardOptions::Logits()),
      Error);
}

// Sequence parallelism (model/parallelism.h) computes the chunked model's bits: at degree 1 it
// keeps every row, and differs from the chunked model only in its buffers and exchanges. Its
// plan equals what it allocates, and on 2 ranks it plans less than the same layout without it.
TEST(LlamaTensorParallel, SequenceParallelismHasTheChunkedModelsBits) {
  const std::shared_ptr<const ModelSpec> spec = Spec(kSplittable);
  const LlamaConfig& config = static_cast<const LlamaSpec&>(*spec).config();
  constexpr int64_t B = 2, T = 8;
  ModelParallelism sp = ModelParallelism::Layout(1, 0, 4);
  sp.sequence_parallel = true;
  const std::unique_ptr<Model> chunked =
      spec->Build(B, T, DefaultCpuBackend(), ModelParallelism::Layout(1, 0, 4));
  const std::unique_ptr<Model> split = spec->Build(B, T, DefaultCpuBackend(), sp);
  EXPECT_EQ(PlannedLlamaActivationBytes(config, B, T, sp),
            static_cast<double>(split->activation_bytes()));
  ModelParallelism two = ModelParallelism::Layout(2, 1, 4), two_sp = two;
  two_sp.sequence_parallel = true;
  EXPECT_LT(PlannedLlamaActivationBytes(config, B, T, two_sp),
            PlannedLlamaActivationBytes(config, B, T, two));
  std::vector<float> weights(chunked->table().total());
  spec->InitWeights(chunked->table(), 3, 0, weights.size(), weights.data());
  const FusedPass whole_rows = RunFused(*chunked, weights, B * T, 6);
  const FusedPass row_blocks = RunFused(*split, weights, B * T, 6);
  EXPECT_EQ(std::memcmp(&whole_rows.loss, &row_blocks.loss, sizeof(LossSum)), 0);
  ASSERT_EQ(whole_rows.grads.size(), row_blocks.grads.size());
  EXPECT_EQ(std::memcmp(whole_rows.grads.data(), row_blocks.grads.data(),
                        sizeof(float) * whole_rows.grads.size()),
            0);
  EXPECT_GT(*std::max_element(row_blocks.grads.begin(), row_blocks.grads.end()), 0.0f);
}

TEST(LlamaTensorParallel, ADimensionTheChunksDoNotDivideIsRefusedNamingItsKey) {
  // kSmall has 2 KV heads: 4 chunks cannot cut them.
  const std::shared_ptr<const ModelSpec> spec = Spec(kSmall);
  const std::string why = spec->CheckParallelism(ModelParallelism::Layout(2, 0, 4));
  EXPECT_NE(why.find("model.n_kv_heads = 2"), std::string::npos) << why;
  try {
    spec->BuildTable(ModelParallelism::Layout(2, 0, 4));
    ADD_FAILURE() << "a table the chunks cannot cut was built";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
  }
  EXPECT_EQ(spec->CheckParallelism(ModelParallelism::Layout(2, 1, 2)), "");
  EXPECT_NE(spec->CheckParallelism(ModelParallelism::Layout(3, 0, 3)).find("power of two"),
            std::string::npos);
  EXPECT_NE(spec->CheckParallelism(ModelParallelism::Layout(4, 0, 2)).find("degree 4"),
            std::string::npos);
}

}  // namespace
}  // namespace crucible
