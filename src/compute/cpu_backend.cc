// The CPU backend: host memory and the OpenMP kernels of kernels/cpu/ (their contracts and
// determinism: kernels/cpu/kernels.h).
#include <cstdlib>
#include <cstring>
#include <new>

#include "common/error.h"
#include "common/strings.h"
#include "compute/backend.h"
#include "compute/portable_backend.h"
#include "kernels/cpu/kernels.h"

namespace crucible {
namespace {

namespace k = kernels;

class CpuBackend final : public ComputeBackend {
 public:
  explicit CpuBackend(const BackendOptions& options) : compute_(options.compute) {
    if (compute_ != ComputePrecision::kFloat32)
      throw UsageError(std::string("training.mixed_precision_param = \"") +
                       ComputePrecisionName(compute_) +
                       "\": the CPU backend computes in float32 only");
  }

  std::string name() const override { return "cpu"; }
  std::string Summary() const override {
    return std::string("device=cpu compute=") + ComputePrecisionName(compute_);
  }
  ComputePrecision compute() const override { return compute_; }
  bool host_memory() const override { return true; }

  void* Allocate(size_t bytes) override {
    // 64-byte aligned (one cache line, one AVX-512 vector), zeroed like std::vector's floats.
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* pointer = std::aligned_alloc(64, rounded);
    if (!pointer) throw std::bad_alloc();
    std::memset(pointer, 0, rounded);
    return pointer;
  }
  void Free(void* pointer) noexcept override { std::free(pointer); }
  void CopyToDevice(void* device, const void* host, size_t bytes) override {
    if (device != host) std::memcpy(device, host, bytes);
  }
  void CopyToHost(void* host, const void* device, size_t bytes) override {
    if (device != host) std::memcpy(host, device, bytes);
  }
  void Synchronize() override {}

  void Fill(float* x, size_t n, float value) override {
    for (size_t i = 0; i < n; ++i) x[i] = value;
  }
  void Add(float* y, const float* x, size_t n) override {
    const int64_t count = static_cast<int64_t>(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; ++i) y[i] += x[i];
  }

  void MatmulForward(float* out, const float* inp, const float* weight, int64_t N, int64_t C,
                     int64_t OC) override {
    k::matmul_forward(out, inp, weight, N, C, OC);
  }
  void MatmulBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, int64_t N, int64_t C, int64_t OC, bool accumulate_dinp,
                      bool accumulate_dweight) override {
    k::matmul_backward(dinp, dweight, dout, inp, weight, N, C, OC, accumulate_dinp,
                       accumulate_dweight);
  }
  void EmbeddingForward(float* out, const int32_t* tokens, const float* table, int64_t N,
                        int64_t C) override {
    k::embedding_forward(out, tokens, table, N, C);
  }
  void EmbeddingBackward(float* dtable, const float* dout, const int32_t* tokens, int64_t N,
                         int64_t C) override {
    k::embedding_backward(dtable, dout, tokens, N, C);
  }
  void RmsnormForward(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                      int64_t C, float eps) override {
    k::rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
  }
  void RmsnormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                       const float* weight, const float* rstd, int64_t N, int64_t C) override {
    k::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
  }
  void RopeForward(float* x, const float* cos_table, const float* sin_table, int64_t B, int64_t T,
                   int64_t heads, int64_t D) override {
    k::rope_forward(x, cos_table, sin_table, B, T, heads, D);
  }
  void RopeBackward(float* dx, const float* cos_table, const float* sin_table, int64_t B, int64_t T,
                    int64_t heads, int64_t D) override {
    k::rope_backward(dx, cos_table, sin_table, B, T, heads, D);
  }
  void AttentionForward(float* out, float* lse, const float* q, const float* k, const float* v,
                        int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) override {
    k::attention_forward(out, lse, q, k, v, B, T, H, KV, D);
  }
  void AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                         const float* lse, const float* q, const float* k, const float* v,
                         int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) override {
    k::attention_backward(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, D);
  }
  void SwigluForward(float* out, const float* gate, const float* up, int64_t N,
                     int64_t F) override {
    k::swiglu_forward(out, gate, up, N, F);
  }
  void SwigluBackward(float* dgate, float* dup, const float* dout, const float* gate,
                      const float* up, int64_t N, int64_t F) override {
    k::swiglu_backward(dgate, dup, dout, gate, up, N, F);
  }
  void CrossEntropyForward(float* losses, float* lse, const float* logits, const int32_t* targets,
                           int64_t N, int64_t V) override {
    k::cross_entropy_forward(losses, lse, logits, targets, N, V);
  }
  void CrossEntropyBackward(float* logits_to_dlogits, const float* lse, const int32_t* targets,
                            int64_t N, int64_t V, float scale, const float* weights) override {
    k::cross_entropy_backward(logits_to_dlogits, lse, targets, N, V, scale, weights);
  }

 private:
  ComputePrecision compute_;
};

std::unique_ptr<ComputeBackend> BuildCpuBackend(const BackendOptions& options) {
  if (options.portable_exact) return BuildPortableBackend(options);
  return std::make_unique<CpuBackend>(options);
}

BackendRegistrar cpu_registrar("cpu", BuildCpuBackend);

}  // namespace
}  // namespace crucible
