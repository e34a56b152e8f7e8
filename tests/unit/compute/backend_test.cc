// The compute seam: the backend registry, DeviceArray, and a model run on a backend whose memory
// is not the host's. `StagedBackend` is the CPU backend behind a wall: its memory is its own
// (host_memory() is false) and every kernel checks that each pointer it is given lies inside one
// of its allocations, as a GPU's kernels need, before it runs the CPU kernel. A model that handed
// a host pointer (a weight, a gradient, the caller's tokens) to a kernel fails here, without a
// GPU; one that copies everything it should gets the CPU's bits exactly.
#include "compute/backend.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <vector>

#include "common/error.h"
#include "common/philox.h"
#include "model/llama.h"

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
  EXPECT_EQ(DefaultCpuBackend()->Summary(), "device=cpu compute=float32");
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

class StagedBackend final : public ComputeBackend {
 public:
  std::string name() const override { return "staged"; }
  std::string Summary() const override { return "device=staged"; }
  ComputePrecision compute() const override { return ComputePrecision::kFloat32; }
  bool host_memory() const override { return false; }

  void* Allocate(size_t bytes) override {
    void* p = cpu_->Allocate(bytes);
    ranges_[static_cast<char*>(p)] = bytes;
    return p;
  }
  void Free(void* pointer) noexcept override {
    ranges_.erase(static_cast<char*>(pointer));
    cpu_->Free(pointer);
  }
  void CopyToDevice(void* device, const void* host, size_t bytes) override {
    Check(device, bytes);
    EXPECT_FALSE(Inside(host, bytes)) << "CopyToDevice from device memory";
    std::memcpy(device, host, bytes);
    ++copies_;
  }
  void CopyToHost(void* host, const void* device, size_t bytes) override {
    Check(device, bytes);
    EXPECT_FALSE(Inside(host, bytes)) << "CopyToHost into device memory";
    std::memcpy(host, device, bytes);
    ++copies_;
  }
  void Synchronize() override {}
  void Fill(float* x, size_t n, float value) override {
    Check(x, 4 * n);
    cpu_->Fill(x, n, value);
  }
  void Add(float* y, const float* x, size_t n) override {
    Check(y, 4 * n), Check(x, 4 * n);
    cpu_->Add(y, x, n);
  }
  void MatmulForward(float* out, const float* inp, const float* weight, int64_t N, int64_t C,
                     int64_t OC) override {
    Check(out, 4 * N * OC), Check(inp, 4 * N * C), Check(weight, 4 * OC * C);
    cpu_->MatmulForward(out, inp, weight, N, C, OC);
  }
  void MatmulBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, int64_t N, int64_t C, int64_t OC, bool accumulate_dinp,
                      bool accumulate_dweight) override {
    if (dinp) Check(dinp, 4 * N * C);
    Check(dweight, 4 * OC * C), Check(dout, 4 * N * OC), Check(inp, 4 * N * C);
    Check(weight, 4 * OC * C);
    cpu_->MatmulBackward(dinp, dweight, dout, inp, weight, N, C, OC, accumulate_dinp,
                         accumulate_dweight);
  }
  void EmbeddingForward(float* out, const int32_t* tokens, const float* table, int64_t N,
                        int64_t C) override {
    Check(out, 4 * N * C), Check(tokens, 4 * N), Check(table, 4 * C);
    cpu_->EmbeddingForward(out, tokens, table, N, C);
  }
  void EmbeddingBackward(float* dtable, const float* dout, const int32_t* tokens, int64_t N,
                         int64_t C) override {
    Check(dtable, 4 * C), Check(dout, 4 * N * C), Check(tokens, 4 * N);
    cpu_->EmbeddingBackward(dtable, dout, tokens, N, C);
  }
  void RmsnormForward(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                      int64_t C, float eps) override {
    Check(out, 4 * N * C), Check(rstd, 4 * N), Check(inp, 4 * N * C), Check(weight, 4 * C);
    cpu_->RmsnormForward(out, rstd, inp, weight, N, C, eps);
  }
  void RmsnormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                       const float* weight, const float* rstd, int64_t N, int64_t C) override {
    Check(dinp, 4 * N * C), Check(dweight, 4 * C), Check(dout, 4 * N * C), Check(inp, 4 * N * C);
    Check(weight, 4 * C), Check(rstd, 4 * N);
    cpu_->RmsnormBackward(dinp, dweight, dout, inp, weight, rstd, N, C);
  }
  void RopeForward(float* x, const float* cos_table, const float* sin_table, int64_t B, int64_t T,
                   int64_t heads, int64_t D) override {
    Check(x, 4 * B * T * heads * D), Check(cos_table, 4 * T * D / 2);
    Check(sin_table, 4 * T * D / 2);
    cpu_->RopeForward(x, cos_table, sin_table, B, T, heads, D);
  }
  void RopeBackward(float* dx, const float* cos_table, const float* sin_table, int64_t B, int64_t T,
                    int64_t heads, int64_t D) override {
    Check(dx, 4 * B * T * heads * D), Check(cos_table, 4 * T * D / 2);
    Check(sin_table, 4 * T * D / 2);
    cpu_->RopeBackward(dx, cos_table, sin_table, B, T, heads, D);
  }
  void AttentionForward(float* out, float* lse, const float* q, const float* k, const float* v,
                        int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) override {
    Check(out, 4 * B * T * H * D), Check(lse, 4 * B * H * T), Check(q, 4 * B * T * H * D);
    Check(k, 4 * B * T * KV * D), Check(v, 4 * B * T * KV * D);
    cpu_->AttentionForward(out, lse, q, k, v, B, T, H, KV, D);
  }
  void AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                         const float* lse, const float* q, const float* k, const float* v,
                         int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) override {
    Check(dq, 4 * B * T * H * D), Check(dk, 4 * B * T * KV * D), Check(dv, 4 * B * T * KV * D);
    Check(dout, 4 * B * T * H * D), Check(out, 4 * B * T * H * D), Check(lse, 4 * B * H * T);
    Check(q, 4 * B * T * H * D), Check(k, 4 * B * T * KV * D), Check(v, 4 * B * T * KV * D);
    cpu_->AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, D);
  }
  void SwigluForward(float* out, const float* gate, const float* up, int64_t N,
                     int64_t F) override {
    Check(out, 4 * N * F), Check(gate, 4 * N * F), Check(up, 4 * N * F);
    cpu_->SwigluForward(out, gate, up, N, F);
  }
  void SwigluBackward(float* dgate, float* dup, const float* dout, const float* gate,
                      const float* up, int64_t N, int64_t F) override {
    Check(dgate, 4 * N * F), Check(dup, 4 * N * F), Check(dout, 4 * N * F);
    Check(gate, 4 * N * F), Check(up, 4 * N * F);
    cpu_->SwigluBackward(dgate, dup, dout, gate, up, N, F);
  }
  void CrossEntropyForward(float* losses, float* lse, const float* logits, const int32_t* targets,
                           int64_t N, int64_t V) override {
    Check(losses, 4 * N), Check(lse, 4 * N), Check(logits, 4 * N * V), Check(targets, 4 * N);
    cpu_->CrossEntropyForward(losses, lse, logits, targets, N, V);
  }
  void CrossEntropyBackward(float* logits_to_dlogits, const float* lse, const int32_t* targets,
                            int64_t N, int64_t V, float scale, const float* weights) override {
    Check(logits_to_dlogits, 4 * N * V), Check(lse, 4 * N), Check(targets, 4 * N);
    if (weights) Check(weights, 4 * N);
    cpu_->CrossEntropyBackward(logits_to_dlogits, lse, targets, N, V, scale, weights);
  }

  int copies() const { return copies_; }

 private:
  // [p, p + bytes) lies inside one allocation.
  bool Inside(const void* p, size_t bytes) const {
    const char* c = static_cast<const char*>(p);
    auto it = ranges_.upper_bound(const_cast<char*>(c));
    if (it == ranges_.begin()) return false;
    --it;
    return c >= it->first && c + bytes <= it->first + it->second;
  }
  void Check(const void* p, size_t bytes) const {
    ASSERT_TRUE(Inside(p, bytes)) << "a kernel was given memory that is not the device's";
  }
  std::shared_ptr<ComputeBackend> cpu_ = DefaultCpuBackend();
  std::map<char*, size_t> ranges_;
  int copies_ = 0;
};

struct Pass {
  LossSum sum, retargeted;
  std::vector<float> grads, logits, losses;
};

Pass RunLlama(const std::vector<std::string>& overrides, std::shared_ptr<ComputeBackend> backend,
              bool weighted) {
  constexpr int64_t B = 2, T = 8;
  Config config = Config::Defaults();
  for (const auto& o : overrides) config.ApplyOverride(o);
  const std::shared_ptr<const ModelSpec> spec = BuildModelSpec(config);
  const std::unique_ptr<Model> model = spec->Build(B, T, std::move(backend));
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
  pass.sum = model->Forward(access, tokens.data(), targets.data(),
                            weighted ? loss_weights.data() : nullptr);
  pass.logits.assign(model->logits(), model->logits() + B * T * V);
  pass.losses.assign(model->losses(), model->losses() + B * T);
  pass.retargeted = model->Retarget(other.data());
  model->Backward(access, 0.125f);
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
      const Pass cpu = RunLlama(overrides, DefaultCpuBackend(), weighted);
      auto staged = std::make_shared<StagedBackend>();
      const Pass off = RunLlama(overrides, staged, weighted);
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
    model->Forward(access, tokens.data(), targets.data(), nullptr);
    FAIL() << "a target outside the vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitBadData);
    EXPECT_NE(std::string(e.what()).find("target token 64 at position 1"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace crucible
