// The CPU backend: host memory and the OpenMP kernels of kernels/cpu/ (their contracts and
// determinism: kernels/cpu/kernels.h).
//
// bf16 compute (compute/backend.h "Precision") takes one of three paths, chosen once from
// [debug] bf16_path and cpuid and named in Summary():
//   emulated     the linear layers' operands are rounded to bf16 into scratch this backend owns
//                (grown to the largest product, then reused), then the fp32 kernels run on them;
//   avx512_bf16  the linear layers run kernels/cpu/gemm_bf16.h's vdpbf16ps tiles;
//   amx          the linear layers run its tdpbf16ps tiles (AMX-BF16).
// "auto" and "native" take the fastest native kernel the CPU has (amx, then avx512_bf16); "auto"
// falls back to emulated, "native" (like a named kernel) is refused where there is none.
// The fp32 products' library ([debug] gemm_library) is set process-wide here (gemm_library.h) and
// named in Summary() ("gemm=auto gemm_isa=avx512").
// Attention rounds its operands inside the kernel (bf16_operands) on every path; on amx its tiles'
// products run on AMX too (kernels/cpu/attention.cc), on the others on the fp32 micro-kernels.
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "common/bfloat16.h"
#include "common/error.h"
#include "common/strings.h"
#include "compute/backend.h"
#include "compute/host_backend.h"
#include "compute/portable_backend.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/gemm_library.h"
#include "kernels/cpu/kernels.h"

namespace crucible {
namespace {

namespace k = kernels;

// [debug] bf16_path (validated in train/training_config.cc) -> the native kernel, kOff: emulated.
k::Bf16Gemm ChooseBf16Gemm(const std::string& path) {
  if (path == "emulated") return k::Bf16Gemm::kOff;
  if (path == "avx512_bf16" || path == "amx") {
    const k::Bf16Gemm gemm = path == "amx" ? k::Bf16Gemm::kAmx : k::Bf16Gemm::kAvx512Bf16;
    if (!k::Bf16GemmAvailable(gemm))
      throw UsageError("debug.bf16_path = \"" + path + "\": this CPU has no " +
                       (path == "amx" ? "AMX-BF16 (cpuid, or Linux refused the tile state)"
                                      : "AVX-512 BF16 (cpuid)") +
                       "; use \"auto\" or \"emulated\"");
    return gemm;
  }
  const k::Bf16Gemm best = k::cpu_has_amx_bf16()      ? k::Bf16Gemm::kAmx
                           : k::cpu_has_avx512_bf16() ? k::Bf16Gemm::kAvx512Bf16
                                                      : k::Bf16Gemm::kOff;
  if (path == "native" && best == k::Bf16Gemm::kOff)
    throw UsageError(
        "debug.bf16_path = \"native\": this CPU has no AVX-512 BF16 or AMX-BF16 (cpuid); use "
        "\"auto\" or \"emulated\"");
  return best;
}

class CpuBackend final : public HostMemoryBackend {
 public:
  explicit CpuBackend(const BackendOptions& options) : compute_(options.compute) {
    k::SetGemmLibraryRule(options.gemm_library);
    // A kernel this CPU lacks is refused under float32 as under bfloat16, though only bf16 runs it.
    const k::Bf16Gemm gemm = ChooseBf16Gemm(options.bf16_path);
    if (compute_ == ComputePrecision::kBfloat16) gemm_ = gemm;
  }

  std::string name() const override { return "cpu"; }
  std::string Summary() const override {
    std::string summary = std::string("device=cpu compute=") + ComputePrecisionName(compute_);
    const bool native = gemm_ != k::Bf16Gemm::kOff;
    if (bf16()) summary.append(" bf16_path=").append(native ? k::Bf16GemmName(gemm_) : "emulated");
    if (!native) summary.append(" ").append(k::GemmLibrarySummary());  // native: its own
    return summary;
  }
  ComputePrecision compute() const override { return compute_; }

  void Add(float* y, const float* x, size_t n) override {
    const int64_t count = static_cast<int64_t>(n);
    // Below 64 Ki elements (a decode step's rows) one thread: a fork and join would cost more.
#pragma omp parallel for schedule(static) if (count >= (int64_t{1} << 16))
    for (int64_t i = 0; i < count; ++i) y[i] += x[i];
  }

  void MatmulForward(float* out, const float* inp, const float* weight, int64_t N, int64_t C,
                     int64_t OC) override {
    if (bf16() && gemm_ == k::Bf16Gemm::kOff) {
      inp = Rounded(0, inp, N * C);
      weight = Rounded(1, weight, OC * C);
    }
    k::matmul_forward(out, inp, weight, N, C, OC, gemm_);
  }
  // A chunk of a weight in place; the emulated bf16 path rounds contiguous copies, so it packs
  // the chunk first (the inherited version).
  void MatmulForwardStrided(float* out, const float* inp, const float* weight, int64_t ldw,
                            int64_t N, int64_t C, int64_t OC) override {
    if (bf16() && gemm_ == k::Bf16Gemm::kOff)
      return ComputeBackend::MatmulForwardStrided(out, inp, weight, ldw, N, C, OC);
    k::matmul_forward_strided(out, inp, weight, ldw, N, C, OC, gemm_);
  }
  void MatmulBackwardStrided(float* dinp, float* dweight, const float* dout, const float* inp,
                             const float* weight, int64_t ldw, int64_t N, int64_t C, int64_t OC,
                             bool accumulate_dinp, bool accumulate_dweight) override {
    if (bf16() && gemm_ == k::Bf16Gemm::kOff)
      return ComputeBackend::MatmulBackwardStrided(dinp, dweight, dout, inp, weight, ldw, N, C, OC,
                                                   accumulate_dinp, accumulate_dweight);
    k::matmul_backward_strided(dinp, dweight, dout, inp, weight, ldw, N, C, OC, accumulate_dinp,
                               accumulate_dweight, gemm_);
  }
  void MatmulBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, int64_t N, int64_t C, int64_t OC, bool accumulate_dinp,
                      bool accumulate_dweight) override {
    if (bf16() && gemm_ == k::Bf16Gemm::kOff) {
      dout = Rounded(0, dout, N * OC);
      inp = Rounded(1, inp, N * C);
      if (dinp) weight = Rounded(2, weight, OC * C);
    }
    k::matmul_backward(dinp, dweight, dout, inp, weight, N, C, OC, accumulate_dinp,
                       accumulate_dweight, gemm_);
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
                        int64_t B, int64_t T, int64_t H, int64_t KV, HeadDims D,
                        const int32_t* positions) override {
    k::attention_forward(out, lse, q, k, v, B, T, H, KV, D, bf16(), gemm_, positions);
  }
  void AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                         const float* lse, const float* q, const float* k, const float* v,
                         int64_t B, int64_t T, int64_t H, int64_t KV, HeadDims D,
                         const int32_t* positions) override {
    k::attention_backward(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, D, bf16(), gemm_,
                          positions);
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
  bool bf16() const {
    return compute_ == ComputePrecision::kBfloat16;
  }
  // x[0, n) rounded to bf16 into scratch slot `slot` (one per operand of a product).
  const float* Rounded(int slot, const float* x, int64_t n) {
    std::vector<float>& buffer = scratch_[slot];
    if (buffer.size() < static_cast<size_t>(n)) buffer.resize(n);
    RoundToBfloat16(x, buffer.data(), n);
    return buffer.data();
  }

  ComputePrecision compute_;
  k::Bf16Gemm gemm_ = k::Bf16Gemm::kOff;  // the bf16 linear layers' native kernel, or emulated
  std::vector<float> scratch_[3];
};

std::unique_ptr<ComputeBackend> BuildCpuBackend(const BackendOptions& options) {
  if (options.portable_exact) return BuildPortableBackend(options);
  return std::make_unique<CpuBackend>(options);
}

BackendRegistrar cpu_registrar("cpu", BuildCpuBackend);

}  // namespace
}  // namespace crucible
