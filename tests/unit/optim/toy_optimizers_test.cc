// Two toy optimizers, registered in this file and nowhere else: a new optimizer is its class and
// one registration line. Each trains a tiny Llama through RunTraining, the code path of
// `crucible train`, and resumes bit-exactly from a checkpoint of the state it declared. (They
// also run in optimizers_test.cc's checks of every registered optimizer.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "ckpt/model_weights.h"
#include "ckpt/safetensors.h"
#include "common/files.h"
#include "model/llama.h"
#include "optim/optimizer.h"
#include "support/tiny_training.h"
#include "train/trainer.h"

namespace crucible {
namespace {

// ---- the toys ----

// What the whole-matrix toy was handed, to check that it always saw whole tensors.
std::set<std::string> g_tensors_updated;
int64_t g_partial_updates = 0;

// Normalised SGD with a per-matrix running average of the gradient's Frobenius norm:
//   a = beta2 a + (1 - beta2) ||G||_F;  W = W (1 - lr wd) - lr G / (a / (1 - beta2^t))
// The norm is a sum over the whole tensor (in double, in element order), so the update of one
// element depends on all of them: kWholeMatrix, with a per-tensor state.
class ToyNormalizedSgd final : public Optimizer {
 public:
  ShardMode shard_mode() const override { return ShardMode::kWholeMatrix; }
  std::vector<StateSpec> state() const override { return {{"grad_norm_avg", 1}}; }
  void Update(const TensorUpdate& u) const override {
    g_tensors_updated.insert(u.param.name);
    if (u.first != 0 || u.weights.size() != u.param.numel) ++g_partial_updates;
    double sum = 0;
    for (float g : u.grads) sum += static_cast<double>(g) * g;
    const double beta2 = u.group.beta2;
    const double average = beta2 * u.state[0][0] + (1 - beta2) * std::sqrt(sum);
    u.state[0][0] = static_cast<float>(average);
    const double corrected = average / (1 - std::pow(beta2, static_cast<double>(u.step)));
    const float scale = static_cast<float>(u.lr / std::max(corrected, 1e-30));
    const float decay = 1.0f - static_cast<float>(u.lr * u.group.weight_decay);
    for (size_t i = 0; i < u.weights.size(); ++i)
      u.weights[i] = u.weights[i] * decay - scale * u.grads[i];
  }
};
OptimizerRegistrar toy_normalized_sgd("ToyNormalizedSgd",
                                      [](const Config&) -> std::unique_ptr<Optimizer> {
                                        return std::make_unique<ToyNormalizedSgd>();
                                      });

// Adagrad (Duchi et al. 2011) with decoupled weight decay: s = s + g^2;
// w = w (1 - lr wd) - lr g / (sqrt(s) + eps). Elementwise, with a per-element state.
class ToyAdagrad final : public Optimizer {
 public:
  ShardMode shard_mode() const override { return ShardMode::kElementwise; }
  std::vector<StateSpec> state() const override { return {{"sum_sq"}}; }
  void Update(const TensorUpdate& u) const override {
    const float lr = static_cast<float>(u.lr), eps = static_cast<float>(u.group.eps);
    const float decay = 1.0f - lr * static_cast<float>(u.group.weight_decay);
    float* s = u.state[0].data();
    for (size_t i = 0; i < u.weights.size(); ++i) {
      s[i] += u.grads[i] * u.grads[i];
      u.weights[i] = u.weights[i] * decay - lr * u.grads[i] / (std::sqrt(s[i]) + eps);
    }
  }
};
OptimizerRegistrar toy_adagrad("ToyAdagrad", [](const Config&) -> std::unique_ptr<Optimizer> {
  return std::make_unique<ToyAdagrad>();
});

// ---- training them ----

namespace fs = std::filesystem;

class ToyTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = test_support::FreshTestFolder("toy_optimizers");
    // Learnable data: one random sequence of 29 tokens, repeated.
    std::vector<uint32_t> tokens;
    for (int r = 0; r < 60; ++r)
      for (uint32_t t = 0; t < 29; ++t) tokens.push_back((t * 37 + 11) % 64);
    std::ofstream(root_ / "tokens.bin", std::ios::binary)
        .write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(uint32_t));
  }
  void TearDown() override { fs::remove_all(root_); }

  // A tiny Llama trained by `optimizer` for 12 steps with checkpoints every 6, in `folder`.
  Config TrainConfig(const std::string& optimizer, const std::string& folder) const {
    Config config = test_support::TinyTrainingConfig(root_ / folder, 12);
    for (const char* o :
         {"training.dataset=tokens", "training.token_dtype=uint32", "checkpoint.interval=6",
          "checkpoint.keep_latest_k=0", "lr_scheduler.decay_type=constant", "optimizer.lr=0.02"})
      config.ApplyOverride(o);
    config.ApplyOverride("optimizer.name=" + optimizer);
    config.ApplyOverride("training.dataset_path=\"" + (root_ / "tokens.bin").string() + "\"");
    return config;
  }
  std::vector<double> Losses(const std::string& folder) const {
    return test_support::LoggedLosses(root_ / folder);
  }
  std::vector<float> FinalWeights(const Config& config, const std::string& folder) const {
    return test_support::FinalWeights(config, root_ / folder);
  }
  // Trains `optimizer` in `folder`, then again from its step-6 checkpoint (the later ones and
  // the final weights removed); returns both runs' final weights.
  std::pair<std::vector<float>, std::vector<float>> TrainAndResume(const std::string& optimizer,
                                                                   const std::string& folder) {
    const Config config = TrainConfig(optimizer, folder);
    EXPECT_EQ(RunTraining(config, "none"), 0);
    const std::vector<float> straight = FinalWeights(config, folder);
    fs::remove_all(root_ / folder / "ckpt" / "step-12");
    fs::remove(root_ / folder / "model.safetensors");
    AtomicWriteFile((root_ / folder / "ckpt" / "latest").string(), "step-6\n");
    EXPECT_EQ(RunTraining(config, "auto"), 0);
    return {straight, FinalWeights(config, folder)};
  }

  fs::path root_;
};

TEST_F(ToyTraining, AWholeMatrixToyLearnsThroughTheTrainerSeeingEveryTensorWhole) {
  g_tensors_updated.clear();
  g_partial_updates = 0;
  const Config config = TrainConfig("ToyNormalizedSgd", "run");
  ASSERT_EQ(RunTraining(config, "none"), 0);
  const std::vector<double> losses = Losses("run");
  ASSERT_EQ(losses.size(), 12u);
  EXPECT_LT(losses.back(), losses.front() - 0.5) << losses.front() << " -> " << losses.back();
  Config resolved = config;
  EXPECT_EQ(g_tensors_updated.size(),
            LlamaParameterTable(BuildLlamaConfig(resolved)).params().size());
  EXPECT_EQ(g_partial_updates, 0);
  // Its per-matrix state is in the checkpoint under the name it declared, one float per tensor.
  SafetensorsReader state((root_ / "run/ckpt/step-6/optimizer.safetensors").string());
  float average = 0;
  state.ReadFloat32("grad_norm_avg.model.layers.1.mlp.down_proj.weight", {1}, &average);
  EXPECT_GT(average, 0.0f);
}

TEST_F(ToyTraining, AWholeMatrixToyResumesBitExactFromItsPerMatrixState) {
  const auto [straight, resumed] = TrainAndResume("ToyNormalizedSgd", "run");
  EXPECT_EQ(resumed, straight);
}

TEST_F(ToyTraining, AnElementwiseToyLearnsAndResumesBitExact) {
  const auto [straight, resumed] = TrainAndResume("ToyAdagrad", "run");
  EXPECT_EQ(resumed, straight);
  const std::vector<double> losses = Losses("run");
  ASSERT_EQ(losses.size(), 12u);
  EXPECT_LT(losses.back(), losses.front() - 0.5) << losses.front() << " -> " << losses.back();
  SafetensorsReader state((root_ / "run/ckpt/step-6/optimizer.safetensors").string());
  ASSERT_NE(state.Find("sum_sq.model.embed_tokens.weight"), nullptr);
}

}  // namespace
}  // namespace crucible
