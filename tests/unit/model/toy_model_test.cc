// The model seam: a toy model family defined in this file alone and registered with one line
// is built by name through the registry, runs forward and backward through a ParameterAccess
// (its gradients checked against finite differences), and trains through the real trainer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <vector>

#include "ckpt/safetensors.h"
#include "common/error.h"
#include "common/files.h"
#include "common/philox.h"
#include "common/strings.h"
#include "model/model.h"
#include "train/trainer.h"

namespace crucible {
namespace {

// A bigram softmax regression: logits_i = W e(token_i), e the embedding row. Unit 0 holds the
// embedding E (V,C); unit 1 the output scale s (C) before the head W (V,C), so the two units are
// laid out differently: logits_i = W (s * e(token_i)).
struct ToyShape {
  int64_t V = 0, C = 0;
};

class ToyModel final : public Model {
 public:
  ToyModel(ToyShape shape, int64_t batch_size, int64_t seq_len)
      : shape_(shape),
        B_(batch_size),
        T_(seq_len),
        logits_(B_ * T_ * shape.V),
        losses_(B_ * T_),
        hidden_(B_ * T_ * shape.C),
        dhidden_(B_ * T_ * shape.C),
        tokens_(B_ * T_),
        targets_(B_ * T_) {
    table_.Add("toy.embedding", {shape.V, shape.C}, ParamKind::kEmbedding, -1);
    table_.EndUnit();
    table_.Add("toy.scale", {shape.C}, ParamKind::kNorm, 0);
    table_.Add("toy.head", {shape.V, shape.C}, ParamKind::kHead, 0);
    table_.EndUnit();
  }
  const ParameterTable& table() const override { return table_; }
  int64_t batch_size() const override { return B_; }
  int64_t seq_len() const override { return T_; }
  size_t activation_bytes() const override {
    return 4 * (logits_.size() + losses_.size()) + 8 * (hidden_.size() + dhidden_.size());
  }

  // Serves ForwardOptions::kFused as kLogits: its whole head runs in Backward.
  LossSum Forward(ParameterAccess& access, const int32_t* tokens, const int32_t* targets,
                  const float* loss_weights, const ForwardOptions&) override {
    const int64_t N = B_ * T_, V = shape_.V, C = shape_.C;
    std::copy(tokens, tokens + N, tokens_.begin());
    std::copy(targets, targets + N, targets_.begin());
    loss_weights_ = loss_weights;
    const float* E = access.AcquireWeights(0);
    const float* u1 = access.AcquireWeights(1);
    const float *s = u1, *W = u1 + C;
    LossSum sum;
    for (int64_t i = 0; i < N; ++i) {
      for (int64_t c = 0; c < C; ++c) hidden_[i * C + c] = double(s[c]) * E[tokens[i] * C + c];
      double max = -HUGE_VAL;
      for (int64_t v = 0; v < V; ++v) {
        double logit = 0;
        for (int64_t c = 0; c < C; ++c) logit += double(W[v * C + c]) * hidden_[i * C + c];
        logits_[i * V + v] = static_cast<float>(logit);
        max = std::max(max, logit);
      }
      double total = 0;
      for (int64_t v = 0; v < V; ++v) total += std::exp(double(logits_[i * V + v]) - max);
      losses_[i] = 0;
      if (targets[i] < 0) continue;
      const double loss = max + std::log(total) - logits_[i * V + targets[i]];
      losses_[i] = static_cast<float>(loss);
      const double w = loss_weights ? loss_weights[i] : 1.0;
      sum.loss += w * loss;
      sum.weight += w;
    }
    access.ReleaseWeights(1);
    access.ReleaseWeights(0);
    return sum;
  }
  const float* logits() const override { return logits_.data(); }
  const float* losses() const override { return losses_.data(); }

  void Backward(ParameterAccess& access, float loss_scale) override {
    const int64_t N = B_ * T_, V = shape_.V, C = shape_.C;
    const float* u1 = access.AcquireWeights(1);
    const float *s = u1, *W = u1 + C;
    float* g1 = access.Gradients(1);
    float *gs = g1, *gW = g1 + C;
    std::fill(g1, g1 + C + V * C, 0.0f);
    std::vector<double>& dhidden = dhidden_;
    std::fill(dhidden.begin(), dhidden.end(), 0.0);
    for (int64_t i = 0; i < N; ++i) {
      if (targets_[i] < 0) continue;
      const double w = loss_scale * (loss_weights_ ? loss_weights_[i] : 1.0f);
      double max = -HUGE_VAL, total = 0;
      for (int64_t v = 0; v < V; ++v) max = std::max(max, double(logits_[i * V + v]));
      for (int64_t v = 0; v < V; ++v) total += std::exp(logits_[i * V + v] - max);
      for (int64_t v = 0; v < V; ++v) {
        const double dlogit =
            w * (std::exp(logits_[i * V + v] - max) / total - (v == targets_[i] ? 1.0 : 0.0));
        for (int64_t c = 0; c < C; ++c) {
          gW[v * C + c] += static_cast<float>(dlogit * hidden_[i * C + c]);
          dhidden[i * C + c] += dlogit * W[v * C + c];
        }
      }
    }
    const float* E = access.AcquireWeights(0);
    float* gE = access.Gradients(0);
    std::fill(gE, gE + V * C, 0.0f);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t c = 0; c < C; ++c) {
        gs[c] += static_cast<float>(dhidden[i * C + c] * E[tokens_[i] * C + c]);
        gE[tokens_[i] * C + c] += static_cast<float>(dhidden[i * C + c] * s[c]);
      }
    access.ReleaseWeights(1);
    access.GradientsReady(1);
    access.ReleaseWeights(0);
    access.GradientsReady(0);
  }

 private:
  ToyShape shape_;
  ParameterTable table_;
  int64_t B_, T_;
  std::vector<float> logits_, losses_;
  std::vector<double> hidden_, dhidden_;
  std::vector<int32_t> tokens_, targets_;
  const float* loss_weights_ = nullptr;
};

class ToySpec final : public ModelSpec {
 public:
  explicit ToySpec(ToyShape shape) : shape_(shape) {}
  std::string name() const override { return "toy_linear"; }
  int64_t vocab_size() const override { return shape_.V; }
  std::string Summary() const override {
    return StrFormat("vocab=%lld dim=%lld", (long long)shape_.V, (long long)shape_.C);
  }
  std::string SizeKeys() const override { return Summary(); }
  std::map<std::string, std::string> WeightsMetadata() const override {
    return {{"crucible.dim", std::to_string(shape_.C)}};
  }
  using ModelSpec::PlannedSizes;
  ParameterSizes PlannedSizes(const ModelParallelism&) const override {  // no tensor parallelism
    const double V = static_cast<double>(shape_.V), C = static_cast<double>(shape_.C);
    return {2 * V * C + C, V * C, V * C + C, V * C + C, 3};
  }
  using ModelSpec::PlannedBuffers;
  BufferSizes PlannedBuffers(double B, double T, const ModelParallelism&) const override {
    const double N = B * T, V = static_cast<double>(shape_.V), C = static_cast<double>(shape_.C);
    const double activations = 4 * (N * V + N) + 8 * (2 * N * C);
    return {activations, activations + 8 * N};  // and the copies of tokens and targets
  }
  using ModelSpec::BuildTable;
  // No tensor-parallel layers: CheckParallelism's default refuses a cut.
  ParameterTable BuildTable(const ModelParallelism&) const override {
    return ToyModel(shape_, 1, 1).table();
  }
  void InitWeights(const ParameterTable& table, uint64_t seed, size_t begin, size_t end,
                   float* out) const override {
    for (size_t i = begin; i < end; ++i) {
      Philox rng(seed, i);
      out[i - begin] = static_cast<float>(0.5 * rng.NextNormal());
    }
    (void)table;
  }
  double TrainFlopsPerToken(const ParameterTable& table, int64_t) const override {
    return 6.0 * static_cast<double>(table.FlopParams());
  }
  using ModelSpec::Build;
  std::unique_ptr<Model> Build(int64_t batch_size, int64_t seq_len,
                               std::shared_ptr<ComputeBackend> backend,
                               const ModelParallelism&) const override {
    if (!backend->host_memory()) throw UsageError("the toy model runs on the CPU only");
    return std::make_unique<ToyModel>(shape_, batch_size, seq_len);
  }

 private:
  ToyShape shape_;
};

std::shared_ptr<const ModelSpec> BuildToySpec(Config& config) {
  const ToyShape shape{config.Int("model.vocab_size"), config.Int("model.dim")};
  if (shape.V <= 0 || shape.C <= 0)
    throw UsageError("toy_linear needs model.vocab_size and model.dim");
  return std::make_shared<ToySpec>(shape);
}

ModelRegistrar toy_registrar("toy_linear", BuildToySpec);  // the one registration line

Config ToyConfig() {
  Config config = Config::Defaults();
  for (const char* o : {"model.name=toy_linear", "model.vocab_size=7", "model.dim=3"})
    config.ApplyOverride(o);
  return config;
}

// Every unit in a buffer of its own, gathered on acquire and handed back on GradientsReady, as
// ZeRO-3 does: the model sees nothing but what the access gives it, one unit at a time.
class UnitByUnitAccess : public ParameterAccess {
 public:
  UnitByUnitAccess(const ParameterTable& table, const std::vector<float>& weights)
      : grads(weights.size(), NAN), table_(table), weights_(weights) {}
  const float* AcquireWeights(int unit) override {
    const ParamUnit& u = table_.units()[unit];
    gathered_[unit].assign(weights_.begin() + u.begin, weights_.begin() + u.end);
    return gathered_[unit].data();
  }
  float* Gradients(int unit) override {
    unit_grads_[unit].assign(table_.units()[unit].size(), NAN);  // the model writes every one
    return unit_grads_[unit].data();
  }
  void GradientsReady(int unit) override {
    std::copy(unit_grads_[unit].begin(), unit_grads_[unit].end(),
              grads.begin() + table_.units()[unit].begin);
    ++ready[unit];
  }
  std::vector<float> grads;
  std::map<int, int> ready;

 private:
  const ParameterTable& table_;
  const std::vector<float>& weights_;
  std::map<int, std::vector<float>> gathered_, unit_grads_;
};

TEST(ModelRegistry, BuildsARegisteredModelByName) {
  Config config = ToyConfig();
  const std::shared_ptr<const ModelSpec> spec = BuildModelSpec(config);
  EXPECT_EQ(spec->name(), "toy_linear");
  EXPECT_EQ(spec->vocab_size(), 7);
  EXPECT_EQ(spec->hf(), nullptr);
  const ParameterTable table = spec->BuildTable();
  ASSERT_EQ(table.units().size(), 2u);
  EXPECT_EQ(table.units()[0].size(), 21u);
  EXPECT_EQ(table.Find("toy.scale").offset, 21u);  // first in unit 1, before the head
  EXPECT_EQ(spec->PlannedSizes().parameters, static_cast<double>(table.total()));
  EXPECT_EQ(spec->PlannedSizes().largest_unit, static_cast<double>(table.max_unit_size()));
  EXPECT_EQ(spec->PlannedSizes().tensors, static_cast<double>(table.params().size()));
  EXPECT_EQ(spec->PlannedBuffers(2, 5).activation_bytes,
            static_cast<double>(spec->Build(2, 5)->activation_bytes()));
}

TEST(ModelRegistry, ListsTheRegisteredNamesAndRefusesAnUnknownOne) {
  const std::vector<std::string> names = RegisteredModels();
  EXPECT_EQ(names, (std::vector<std::string>{"deepseek_v3", "llama", "toy_linear"}));
  Config config = Config::Defaults();
  config.ApplyOverride("model.name=gpt");
  try {
    BuildModelSpec(config);
    FAIL() << "an unknown model was built";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    EXPECT_STREQ(e.what(), "model.name: unknown model 'gpt' (choose one of deepseek_v3, llama, toy_linear)");
  }
}

TEST(ModelRegistry, RefusesTwoModelsOfOneName) {
  EXPECT_DEATH(ModelRegistrar("toy_linear", BuildToySpec), "two models registered as 'toy_linear'");
}

TEST(ToyModel, GradientsThroughAUnitByUnitAccessMatchFiniteDifferences) {
  Config config = ToyConfig();
  const std::shared_ptr<const ModelSpec> spec = BuildModelSpec(config);
  const int64_t B = 2, T = 3;
  std::unique_ptr<Model> model = spec->Build(B, T);
  const ParameterTable& table = model->table();
  std::vector<float> weights(table.total());
  spec->InitWeights(table, 5, 0, table.total(), weights.data());
  const std::vector<int32_t> tokens = {0, 3, 6, 2, 2, 5}, targets = {3, -1, 2, 5, 1, 0};
  const std::vector<float> loss_weights = {1.0f, 9.0f, 0.5f, 2.0f, 0.0f, -1.0f};
  const float loss_scale = 0.25f;
  UnitByUnitAccess access(table, weights);
  const LossSum sum = model->Forward(access, tokens.data(), targets.data(), loss_weights.data(),
                                     ForwardOptions::Fused(loss_scale));
  EXPECT_DOUBLE_EQ(sum.weight, 1.0 + 0.5 + 2.0 + 0.0 - 1.0);  // the ignored target's 9 is not
  model->Backward(access, loss_scale);
  EXPECT_EQ(access.ready, (std::map<int, int>{{0, 1}, {1, 1}}));
  // loss_scale * sum of w_i l_i, differentiated by central differences.
  auto loss_at = [&](const std::vector<float>& w) {
    UnitByUnitAccess probe(table, w);
    return loss_scale * model
                            ->Forward(probe, tokens.data(), targets.data(), loss_weights.data(),
                                      ForwardOptions::Logits())
                            .loss;
  };
  double largest = 0;
  for (float g : access.grads) largest = std::max(largest, std::fabs(double(g)));
  ASSERT_GT(largest, 0.01);
  for (size_t i = 0; i < weights.size(); ++i) {
    std::vector<float> plus = weights, minus = weights;
    plus[i] += 1e-2f;
    minus[i] -= 1e-2f;
    const double numeric = (loss_at(plus) - loss_at(minus)) / (double(plus[i]) - minus[i]);
    EXPECT_NEAR(access.grads[i], numeric, 1e-4 * largest) << "element " << i;
  }
}

TEST(ToyModel, TrainsThroughTheRealTrainer) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("toy_model_test_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  Config config = ToyConfig();
  for (const std::string& o : std::vector<std::string>{
           "training.steps=3", "training.seq_len=8", "training.local_batch_size=2",
           "metrics.peak_gflops=1000", "job.dump_folder=" + dir.string()})
    config.ApplyOverride(o);
  EXPECT_EQ(RunTraining(config, "none"), kExitOk);
  SafetensorsReader weights((dir / "model.safetensors").string());
  for (const char* name : {"toy.embedding", "toy.scale", "toy.head"})
    EXPECT_NE(weights.Find(name), nullptr) << name;
  EXPECT_TRUE(FileExists((dir / "ckpt/step-3/COMPLETE").string()));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace crucible
