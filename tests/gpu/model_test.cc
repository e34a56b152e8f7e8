// A whole Llama forward and backward on cuda against cpu: the loss and every gradient tensor
// (named on failure). fp32 within a stated tolerance; bf16 compute within bf16's tolerance of
// the fp32 CPU (loss relative 2e-2, each gradient's cosine with the CPU's above 0.99).
#include <gtest/gtest.h>

#include <cmath>

#include "common/config.h"
#include "gpu_test_support.h"
#include "model/llama.h"
#include "model/parameters.h"

namespace crucible::gpu_test {
namespace {

struct Pass {
  LossSum sum;
  std::vector<float> grads;
};

class GpuModel : public ::testing::Test {
 protected:
  static constexpr int64_t B = 2, T = 40;
  void SetUp() override {
    Config config = Config::Defaults();
    for (const char* o : {"model.vocab_size=300", "model.dim=64", "model.n_heads=4",
                          "model.n_kv_heads=2", "model.n_layers=2", "model.ffn_hidden_dim=96"})
      config.ApplyOverride(o);
    spec_ = BuildModelSpec(config);
    auto table = spec_->BuildTable();
    weights_.resize(table.total());
    spec_->InitWeights(table, 3, 0, weights_.size(), weights_.data());
    Philox rng(11, 0);
    tokens_.resize(B * T);
    targets_.resize(B * T);
    for (int64_t i = 0; i < B * T; ++i) {
      tokens_[i] = static_cast<int32_t>(rng.NextU32() % 300);
      targets_[i] = i % 7 == 6 ? -1 : static_cast<int32_t>(rng.NextU32() % 300);
    }
  }
  Pass Run(std::shared_ptr<ComputeBackend> backend) {
    auto model = spec_->Build(B, T, std::move(backend));
    Pass pass;
    pass.grads.assign(weights_.size(), 0.0f);
    FlatParameterAccess access(model->table(), weights_.data(), pass.grads.data());
    pass.sum =
        model->Forward(access, tokens_.data(), targets_.data(), nullptr, ForwardOptions::Logits());
    model->Backward(access, 1.0f / static_cast<float>(pass.sum.weight));
    return pass;
  }
  std::vector<float> Tensor(const Pass& pass, const ParamInfo& info) {
    return std::vector<float>(pass.grads.begin() + info.offset,
                              pass.grads.begin() + info.offset + info.numel);
  }

  std::shared_ptr<const ModelSpec> spec_;
  std::vector<float> weights_;
  std::vector<int32_t> tokens_, targets_;
};

TEST_F(GpuModel, Fp32ForwardAndBackwardMatchTheCpu) {
  Pass cpu = Run(DefaultCpuBackend());
  Pass gpu = Run(Cuda(ComputePrecision::kFloat32));
  Pass again = Run(Cuda(ComputePrecision::kFloat32));
  EXPECT_NEAR(gpu.sum.loss / gpu.sum.weight, cpu.sum.loss / cpu.sum.weight, 1e-5);
  EXPECT_EQ(gpu.sum.weight, cpu.sum.weight);
  const ParameterTable table = spec_->BuildTable();
  for (const auto& info : table.params()) {
    auto want = Tensor(cpu, info);
    double scale = 0;
    for (float g : want) scale = std::max(scale, static_cast<double>(std::fabs(g)));
    ExpectClose("gradient of " + info.name, Tensor(gpu, info), want, 1e-4 * scale, 1e-3);
  }
  ExpectSameBits("every gradient, two GPU runs", gpu.grads, again.grads);
  EXPECT_EQ(gpu.sum.loss, again.sum.loss);
}

TEST_F(GpuModel, Bf16ForwardAndBackwardStayNearTheFp32Cpu) {
  Pass cpu = Run(DefaultCpuBackend());
  Pass gpu = Run(Cuda(ComputePrecision::kBfloat16));
  Pass again = Run(Cuda(ComputePrecision::kBfloat16));
  const double cpu_loss = cpu.sum.loss / cpu.sum.weight, gpu_loss = gpu.sum.loss / gpu.sum.weight;
  EXPECT_NEAR(gpu_loss, cpu_loss, 2e-2 * cpu_loss);
  const ParameterTable table = spec_->BuildTable();
  for (const auto& info : table.params()) {
    auto want = Tensor(cpu, info), got = Tensor(gpu, info);
    double dot = 0, a2 = 0, b2 = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      dot += static_cast<double>(got[i]) * want[i];
      a2 += static_cast<double>(got[i]) * got[i];
      b2 += static_cast<double>(want[i]) * want[i];
    }
    EXPECT_GT(dot / std::sqrt(a2 * b2 + 1e-300), 0.99) << "gradient of " << info.name;
  }
  ExpectSameBits("every bf16 gradient, two GPU runs", gpu.grads, again.grads);
}

}  // namespace
}  // namespace crucible::gpu_test
