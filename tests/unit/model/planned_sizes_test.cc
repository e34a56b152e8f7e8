#include <gtest/gtest.h>

#include <cmath>

#include "model/llama.h"

namespace crucible {
namespace {

LlamaConfig Model(const std::vector<std::string>& overrides) {
  Config config = Config::Defaults();
  for (const auto& o : overrides) config.ApplyOverride(o);
  return BuildLlamaConfig(config);
}

std::vector<LlamaConfig> Models() {
  return {Model({}), Model({"model.flavor=tiny"}), Model({"model.flavor=small"}),
          Model({"model.flavor=base"}),
          Model({"model.dim=64", "model.n_heads=8", "model.n_kv_heads=1", "model.n_layers=1",
                 "model.tie_embeddings=true", "model.vocab_size=300", "model.ffn_hidden_dim=96"})};
}

TEST(PlannedSizes, AreTheParameterTableOfEveryFlavor) {
  for (const LlamaConfig& c : Models()) {
    const ParameterTable table = LlamaParameterTable(c);
    const LlamaSizes sizes = PlannedLlamaSizes(c);
    EXPECT_EQ(sizes.parameters, static_cast<double>(table.total())) << c.flavor;
    EXPECT_EQ(sizes.embedding, static_cast<double>(table.units()[0].size())) << c.flavor;
    EXPECT_EQ(sizes.layer, static_cast<double>(table.units()[1].size())) << c.flavor;
    EXPECT_EQ(sizes.tail, static_cast<double>(table.units().back().size())) << c.flavor;
    EXPECT_EQ(sizes.largest_unit, static_cast<double>(table.max_unit_size())) << c.flavor;
    // Per kind, as the optimizer state carried by some kinds only is planned.
    const ParameterSizes planned = LlamaSpec(c).PlannedSizes();
    std::array<double, kParamKindCount> elements{}, tensors{};
    for (const ParamInfo& p : table.params()) {
      elements[static_cast<size_t>(p.kind)] += static_cast<double>(p.numel);
      tensors[static_cast<size_t>(p.kind)] += 1;
    }
    EXPECT_EQ(planned.kind_parameters, elements) << c.flavor;
    EXPECT_EQ(planned.kind_tensors, tensors) << c.flavor;
    EXPECT_EQ(planned.tensors, static_cast<double>(table.params().size())) << c.flavor;
  }
}

// Under tensor parallelism: a rank's parts, as its table lays them out, at every degree and rank.
TEST(PlannedSizes, AreTheTableOfEachTensorParallelRank) {
  for (const LlamaConfig& c :
       {Model({"model.n_kv_heads=4"}), Model({"model.flavor=small"}),
        Model({"model.dim=64", "model.n_heads=4", "model.n_kv_heads=4", "model.n_layers=2",
               "model.tie_embeddings=true", "model.vocab_size=256", "model.ffn_hidden_dim=96"})}) {
    const LlamaSpec spec(c);
    for (int degree : {1, 2, 4})
      for (int rank = 0; rank < degree; ++rank) {
        const ModelParallelism layout = ModelParallelism::Layout(degree, rank, 4);
        const ParameterTable table = spec.BuildTable(layout);
        const ParameterSizes planned = spec.PlannedSizes(layout);
        const std::string where = c.flavor + " degree " + std::to_string(degree);
        EXPECT_EQ(planned.parameters, static_cast<double>(table.total())) << where;
        EXPECT_EQ(planned.first_unit, static_cast<double>(table.units()[0].size())) << where;
        EXPECT_EQ(planned.largest_unit, static_cast<double>(table.max_unit_size())) << where;
        std::array<double, kParamKindCount> elements{}, tensors{};
        for (const ParamInfo& p : table.params()) {
          elements[static_cast<size_t>(p.kind)] += static_cast<double>(p.numel);
          tensors[static_cast<size_t>(p.kind)] += 1;
        }
        EXPECT_EQ(planned.kind_parameters, elements) << where;
        EXPECT_EQ(planned.kind_tensors, tensors) << where;
      }
  }
}

TEST(PlannedSizes, ActivationBytesAreWhatTheModelAllocates) {
  for (const LlamaConfig& c : Models()) {
    for (auto [batch, seq_len] : {std::pair<int64_t, int64_t>{1, 8}, {3, 16}}) {
      const LlamaModel model(c, batch, seq_len, DefaultCpuBackend());
      EXPECT_EQ(PlannedLlamaActivationBytes(c, batch, seq_len),
                static_cast<double>(model.activation_bytes()))
          << c.flavor << " " << batch << "x" << seq_len;
    }
  }
}

TEST(PlannedSizes, AbsurdConfigsDoNotOverflow) {
  const LlamaConfig c = Model({"model.dim=2147483644", "model.n_heads=2", "model.n_kv_heads=2",
                               "model.vocab_size=2147483647", "model.n_layers=2147483647",
                               "model.ffn_hidden_dim=2147483647"});
  const double parameters = PlannedLlamaSizes(c).parameters;  // about 2^31 x 2^31 x 2^31 x 6
  EXPECT_GT(parameters, 5e28);
  const double activations = PlannedLlamaActivationBytes(c, 2147483647.0, 2147483647.0);
  EXPECT_TRUE(std::isfinite(activations) && activations > 1e38) << activations;
}

}  // namespace
}  // namespace crucible
