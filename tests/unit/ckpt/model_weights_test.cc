// Loading model weights: a file whose values are not all finite, or that holds tensors the model
// does not have, is refused at load, naming it.
#include "ckpt/model_weights.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "ckpt/safetensors.h"
#include "common/config.h"
#include "common/error.h"

namespace crucible {
namespace {

namespace fs = std::filesystem;

class ModelWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (fs::temp_directory_path() /
             ("weights_test_" + std::to_string(::getpid()) + "_" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".safetensors"))
                .string();
    Config config = Config::Defaults();
    for (const char* o : {"model.vocab_size=64", "model.dim=16", "model.n_layers=2",
                          "model.n_heads=2", "model.n_kv_heads=1", "model.ffn_hidden_dim=32"})
      config.ApplyOverride(o);
    model_ = BuildModelSpec(config);
    table_ = std::make_unique<ParameterTable>(model_->BuildTable());
    weights_.assign(table_->total(), 0.25f);
  }
  void TearDown() override { fs::remove(path_); }
  std::pair<int, std::string> LoadError() {
    SaveModelWeights(path_, *table_, *model_, weights_.data());
    std::vector<float> loaded(table_->total());
    try {
      LoadModelWeights(path_, *table_, loaded.data());
    } catch (const Error& e) {
      return {e.exit_code(), e.what()};
    }
    EXPECT_EQ(loaded, weights_);
    return {0, ""};
  }
  std::string path_;
  std::shared_ptr<const ModelSpec> model_;
  std::unique_ptr<ParameterTable> table_;
  std::vector<float> weights_;
};

TEST_F(ModelWeightsTest, NonFiniteValuesAreBadDataNamingTheFileTheFirstTensorAndTheCount) {
  EXPECT_EQ(LoadError().first, 0);
  const auto& second = table_->params()[1];
  const auto& last = table_->params().back();
  weights_[second.offset + 3] = std::numeric_limits<float>::quiet_NaN();
  weights_[second.offset + 5] = std::numeric_limits<float>::infinity();
  weights_[last.offset] = -std::numeric_limits<float>::infinity();
  auto [code, message] = LoadError();
  EXPECT_EQ(code, kExitBadData);
  EXPECT_EQ(message.find(path_ + ": tensor '" + second.name + "' holds 2 non-finite values"), 0u)
      << message;
  EXPECT_NE(message.find("3 in all, in 2 tensors"), std::string::npos) << message;
}

// A file from another model (one with attention biases) holds every tensor of this one and more:
// loading it would drop the biases and score another model, so it is refused like a file that
// lacks a tensor.
TEST_F(ModelWeightsTest, TensorsTheModelDoesNotHaveAreBadDataNamingTheFileAndTheFirstOne) {
  std::vector<TensorView> views;
  for (const auto& p : table_->params())
    views.push_back({p.name, p.shape, weights_.data() + p.offset});
  const std::vector<float> bias(16, 0.5f);
  views.push_back({"model.layers.0.self_attn.q_proj.bias", {16}, bias.data()});
  views.push_back({"model.layers.1.self_attn.q_proj.bias", {16}, bias.data()});
  WriteSafetensors(path_, views, {{"format", "pt"}});
  std::vector<float> loaded(table_->total());
  try {
    LoadModelWeights(path_, *table_, loaded.data());
    FAIL() << "loaded a file with tensors the model does not have";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(e.exit_code(), kExitBadData);
    EXPECT_EQ(message.find(path_ + ": tensor 'model.layers.0.self_attn.q_proj.bias' is not in the "
                                   "model (2 tensors are not)"),
              0u)
        << message;
  }
}

}  // namespace
}  // namespace crucible
