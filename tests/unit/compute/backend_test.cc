// The compute seam: the backend registry, DeviceArray, and a model run on a backend whose memory
// is not the host's (support/staged_backend.h). A model that handed a host pointer (a weight, a
// gradient, the caller's tokens) to a kernel fails here, without a GPU; one that copies
// everything it should gets the CPU's bits exactly.
#include "compute/backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "common/error.h"
#include "common/philox.h"
#include "kernels/cpu/gemm_library.h"
#include "model/llama.h"
#include "support/staged_backend.h"

namespace crucible {
namespace {

TEST(BackendRegistry, TheCpuBackendIsRegisteredAndAnUnknownDeviceListsTheKnownOnes) {
  const std::vector<std::string> names = RegisteredBackends();
  EXPECT_NE(std::find(names.begin(), names.end(), "cpu"), names.end());
  BackendOptions options;
  options.device = "tpu";
  try {
    MakeBackend(options);
    FAIL() << "an unknown device was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    EXPECT_NE(std::string(e.what()).find("training.device: unknown device 'tpu'"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("cpu"), std::string::npos) << e.what();
  }
  EXPECT_EQ(DefaultCpuBackend()->name(), "cpu");
  EXPECT_TRUE(DefaultCpuBackend()->host_memory());
  EXPECT_EQ(DefaultCpuBackend()->Summary(),
            "device=cpu compute=float32 " + kernels::GemmLibrarySummary());
}

TEST(DeviceArray, IsZeroFilledAndMovesItsMemory) {
  ComputeBackend& cpu = *DefaultCpuBackend();
  DeviceArray<float> a(cpu, 1000);
  std::vector<float> host(1000, 1.0f);
  a.CopyTo(host.data(), host.size());
  for (float v : host) ASSERT_EQ(v, 0.0f);
  const float* data = a.data();
  DeviceArray<float> b = std::move(a);
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(b.size(), 1000u);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.size(), 0u);
}

struct Pass {
  LossSum sum, retargeted;
  std::vector<float> grads, logits, losses;
};

// One forward and backward of a small Llama on `backend`. kLogits: also the logits, and with
// `retarget` the gradient against other targets (Retarget); kFused: the training forward's
// chunked head.
Pass RunLlama(const std::vector<std::string>& overrides, std::shared_ptr<ComputeBackend> backend,
              bool weighted, ForwardOptions::Head head, bool retarget, int64_t T = 8,
              const ModelParallelism& parallelism = {}) {
  constexpr int64_t B = 2;
  constexpr float kLossScale = 0.125f;
  Config config = Config::Defaults();
  for (const auto& o : overrides) config.ApplyOverride(o);
  const std::shared_ptr<const ModelSpec> spec = BuildModelSpec(config);
  const std::unique_ptr<Model> model = spec->Build(B, T, std::move(backend), parallelism);
  const int64_t V = spec->vocab_size();
  std::vector<float> weights(model->table().total());
  spec->InitWeights(model->table(), 5, 0, weights.size(), weights.data());
  Philox rng(7, 0);
  std::vector<int32_t> tokens(B * T), targets(B * T), other(B * T);
  std::vector<float> loss_weights(B * T);
  for (int64_t i = 0; i < B * T; ++i) {
    tokens[i] = static_cast<int32_t>(rng.NextU32() % V);
    targets[i] = i % 5 == 4 ? -1 : static_cast<int32_t>(rng.NextU32() % V);
    other[i] = static_cast<int32_t>(rng.NextU32() % V);
    loss_weights[i] = 0.25f * static_cast<float>(i % 4);
  }
  Pass pass;
  pass.grads.assign(weights.size(), 0.0f);
  FlatParameterAccess access(model->table(), weights.data(), pass.grads.data());
  const bool fused = head == ForwardOptions::Head::kFused;
  pass.sum = model->Forward(access, tokens.data(), targets.data(),
                            weighted ? loss_weights.data() : nullptr,
                            fused ? ForwardOptions::Fused(kLossScale) : ForwardOptions::Logits());
  pass.losses.assign(model->losses(), model->losses() + B * T);
  if (!fused) {
    pass.logits.assign(model->logits(), model->logits() + B * T * V);
    if (retarget) pass.retargeted = model->Retarget(other.data());
  }
  model->Backward(access, kLossScale);
  return pass;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
}

const std::vector<std::string> kUntied = {"model.vocab_size=64",       "model.dim=32",
                                          "model.n_heads=4",           "model.n_kv_heads=2",
                                          "model.n_layers=2",          "model.ffn_hidden_dim=48",
                                          "model.tie_embeddings=false"};

TEST(StagedBackend, ALlamaOffTheHostGivesTheCpuBitsAndHandsItsKernelsOnlyDeviceMemory) {
  for (const bool tied : {false, true}) {
    for (const bool weighted : {false, true}) {
      SCOPED_TRACE(std::string(tied ? "tied" : "untied") + (weighted ? ", weighted" : ""));
      std::vector<std::string> overrides = kUntied;
      if (tied) overrides.back() = "model.tie_embeddings=true";
      const Pass cpu =
          RunLlama(overrides, DefaultCpuBackend(), weighted, ForwardOptions::Head::kLogits, true);
      auto staged = std::make_shared<StagedBackend>();
      const Pass off = RunLlama(overrides, staged, weighted, ForwardOptions::Head::kLogits, true);
      EXPECT_GT(staged->copies(), 0);
      EXPECT_EQ(cpu.sum.loss, off.sum.loss);
      EXPECT_EQ(cpu.sum.weight, off.sum.weight);
      EXPECT_EQ(cpu.retargeted.loss, off.retargeted.loss);
      EXPECT_TRUE(SameBits(cpu.logits, off.logits));
      EXPECT_TRUE(SameBits(cpu.losses, off.losses));
      EXPECT_TRUE(SameBits(cpu.grads, off.grads));
      // Not vacuous: the gradient is not all zeros.
      EXPECT_NE(std::count(cpu.grads.begin(), cpu.grads.end(), 0.0f),
                static_cast<long>(cpu.grads.size()));
    }
  }
}

// The kernels a backend inherits (compute/backend.h: the strided products, the vocabulary's
// pieces) staged through host copies off the host: a chunked model (model/parallelism.h) gets the
// CPU's bits there, the fused head's and its gradients, weighted or not.
TEST(StagedBackend, InheritsTheHostKernelsOfAChunkedModelWithTheCpuBits) {
  for (const bool weighted : {false, true}) {
    SCOPED_TRACE(weighted ? "weighted" : "unweighted");
    const ModelParallelism chunks = ModelParallelism::Layout(1, 0, 2);
    const Pass cpu = RunLlama(kUntied, DefaultCpuBackend(), weighted, ForwardOptions::Head::kFused,
                              false, 8, chunks);
    auto staged = std::make_shared<StagedBackend>();
    const Pass off =
        RunLlama(kUntied, staged, weighted, ForwardOptions::Head::kFused, false, 8, chunks);
    EXPECT_GT(staged->copies(), 0);
    EXPECT_EQ(std::memcmp(&cpu.sum.loss, &off.sum.loss, sizeof(double)), 0);
    EXPECT_TRUE(SameBits(cpu.losses, off.losses));
    EXPECT_TRUE(SameBits(cpu.grads, off.grads));
    EXPECT_NE(std::count(cpu.grads.begin(), cpu.grads.end(), 0.0f),
              static_cast<long>(cpu.grads.size()));
  }
}

// A backend that refuses the inherited kernels says so in one line, naming the kernel and why.
TEST(PortableBackend, RefusesTheInheritedKernelsInOneLine) {
  BackendOptions options;
  options.portable_exact = true;
  const std::shared_ptr<ComputeBackend> portable = MakeBackend(options);
  std::vector<float> x(8, 1.0f), m(2);
  try {
    portable->RowMax(m.data(), x.data(), 2, 4);
    ADD_FAILURE() << "the portable backend ran an inherited kernel";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    EXPECT_NE(std::string(e.what()).find("no RowMax kernel: debug.portable_exact"),
              std::string::npos)
        << e.what();
  }
}

// The fused head against the whole logits: the loss sum, every position's loss and every
// gradient, tied and untied, weighted and not (weights 0 and ignored targets included), in one
// chunk and in two (vocabulary 8192: 512-row chunks of 640 rows, the second ragged). The losses
// come from the same row kernels: the same bits. In one chunk every gradient has the bits of the
// whole product; in two the head's weight gradient adds its rows chunk by chunk, a different
// summation order (observed: 4.3e-7 of the largest gradient at most).
TEST(FusedHead, MatchesTheWholeLogitsOnTheCpuAndOffTheHost) {
  for (const int64_t T : {int64_t{8}, int64_t{320}}) {
    for (const bool tied : {false, true}) {
      for (const bool weighted : {false, true}) {
        SCOPED_TRACE(std::string(tied ? "tied" : "untied") + (weighted ? ", weighted" : "") +
                     ", T=" + std::to_string(T));
        std::vector<std::string> overrides = kUntied;
        if (tied) overrides.back() = "model.tie_embeddings=true";
        if (T > 8) overrides.front() = "model.vocab_size=8192";
        const Pass whole = RunLlama(overrides, DefaultCpuBackend(), weighted,
                                    ForwardOptions::Head::kLogits, false, T);
        const Pass fused = RunLlama(overrides, DefaultCpuBackend(), weighted,
                                    ForwardOptions::Head::kFused, false, T);
        EXPECT_EQ(whole.sum.weight, fused.sum.weight);
        EXPECT_EQ(std::memcmp(&whole.sum.loss, &fused.sum.loss, sizeof(double)), 0);
        EXPECT_TRUE(SameBits(whole.losses, fused.losses));
        if (T == 8) {
          EXPECT_TRUE(SameBits(whole.grads, fused.grads));
        }
        float largest = 0;
        for (float g : whole.grads) largest = std::max(largest, std::fabs(g));
        ASSERT_GT(largest, 0.0f);
        ASSERT_EQ(whole.grads.size(), fused.grads.size());
        for (size_t i = 0; i < whole.grads.size(); ++i)
          ASSERT_NEAR(whole.grads[i], fused.grads[i], 2e-6f * largest) << "parameter " << i;
        // Off the host: the CPU's fused bits, through device memory only.
        auto staged = std::make_shared<StagedBackend>();
        const Pass off =
            RunLlama(overrides, staged, weighted, ForwardOptions::Head::kFused, false, T);
        EXPECT_EQ(std::memcmp(&off.sum.loss, &fused.sum.loss, sizeof(double)), 0);
        EXPECT_TRUE(SameBits(off.losses, fused.losses));
        EXPECT_TRUE(SameBits(off.grads, fused.grads));
      }
    }
  }
}

// The scorer's forward (ForwardOptions::Scored) against the whole logits: the loss sum and every
// position's loss bit for bit, and each scored position's prediction the argmax std::max_element
// takes over its whole row of logits (-1 where the target is ignored), in one chunk and in two
// (vocabulary 8192, the second chunk ragged), on the CPU and off the host. What would need the
// logits is refused after it.
TEST(ScoredHead, GivesTheWholeLogitsLossesAndTheirArgmaxWithoutKeepingThem) {
  for (const int64_t T : {int64_t{8}, int64_t{320}}) {
    for (const bool staged : {false, true}) {
      SCOPED_TRACE(std::string(staged ? "staged" : "cpu") + ", T=" + std::to_string(T));
      std::vector<std::string> overrides = kUntied;
      if (T > 8) overrides.front() = "model.vocab_size=8192";
      constexpr int64_t B = 2;
      Config config = Config::Defaults();
      for (const auto& o : overrides) config.ApplyOverride(o);
      const std::shared_ptr<const ModelSpec> spec = BuildModelSpec(config);
      const int64_t V = spec->vocab_size();
      std::vector<int32_t> tokens(B * T), targets(B * T);
      Philox rng(3, 0);
      for (int64_t i = 0; i < B * T; ++i) {
        tokens[i] = static_cast<int32_t>(rng.NextU32() % V);
        targets[i] = i % 3 == 2 ? -1 : static_cast<int32_t>(rng.NextU32() % V);
      }
      const std::unique_ptr<Model> whole = spec->Build(B, T, DefaultCpuBackend());
      std::vector<float> weights(whole->table().total());
      spec->InitWeights(whole->table(), 5, 0, weights.size(), weights.data());
      FlatParameterAccess access(whole->table(), weights.data(), nullptr);
      const LossSum want =
          whole->Forward(access, tokens.data(), targets.data(), nullptr, ForwardOptions::Logits());
      const std::vector<float> want_losses(whole->losses(), whole->losses() + B * T);
      const float* logits = whole->logits();

      const std::unique_ptr<Model> model =
          staged ? spec->Build(B, T, std::make_shared<StagedBackend>())
                 : spec->Build(B, T, DefaultCpuBackend());
      const LossSum got =
          model->Forward(access, tokens.data(), targets.data(), nullptr, ForwardOptions::Scored());
      EXPECT_EQ(std::memcmp(&want.loss, &got.loss, sizeof(double)), 0);
      EXPECT_EQ(want.weight, got.weight);
      EXPECT_TRUE(
          SameBits(want_losses, std::vector<float>(model->losses(), model->losses() + B * T)));
      const int32_t* predictions = model->predictions();
      ASSERT_NE(predictions, nullptr);
      int64_t hits = 0;
      for (int64_t i = 0; i < B * T; ++i) {
        if (targets[i] < 0) {
          EXPECT_EQ(predictions[i], -1) << "position " << i;
          continue;
        }
        const float* row = logits + i * V;
        ASSERT_EQ(predictions[i], std::max_element(row, row + V) - row) << "position " << i;
        hits += predictions[i] == targets[i];
      }
      EXPECT_LT(hits, B * T);  // not vacuous: the predictions are not the targets
      EXPECT_THROW(model->logits(), Error);
      EXPECT_THROW(model->Retarget(targets.data()), Error);
      std::vector<float> grads(weights.size());
      FlatParameterAccess with_grads(model->table(), weights.data(), grads.data());
      EXPECT_THROW(model->Backward(with_grads, 1.0f), Error);
    }
  }
}

TEST(StagedBackend, ABadTargetIsRefusedOnTheHostNamingItsPosition) {
  constexpr int64_t B = 1, T = 4;
  Config config = Config::Defaults();
  for (const auto& o : kUntied) config.ApplyOverride(o);
  const auto spec = BuildModelSpec(config);
  const auto model = spec->Build(B, T, std::make_shared<StagedBackend>());
  std::vector<float> weights(model->table().total()), grads(weights.size());
  spec->InitWeights(model->table(), 5, 0, weights.size(), weights.data());
  FlatParameterAccess access(model->table(), weights.data(), grads.data());
  const std::vector<int32_t> tokens = {1, 2, 3, 4}, targets = {1, 64, 2, 3};
  try {
    model->Forward(access, tokens.data(), targets.data(), nullptr, ForwardOptions::Fused(1.0f));
    FAIL() << "a target outside the vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitBadData);
    EXPECT_NE(std::string(e.what()).find("target token 64 at position 1"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace crucible
