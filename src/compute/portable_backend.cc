// The portable exact CPU backend (`[debug] portable_exact = true` with device = "cpu"): host
// memory, and the per-element kernels of compute/portable/portable_kernels.h run under OpenMP,
// one output element or row per iteration, so the bits depend on neither the thread count nor the
// device (a GPU backend running the same header gives the same bits). No BLAS, no libm, no
// contraction (this file is compiled with -ffp-contract=off, like the whole build). Slow: it is
// for the smoke configs and regression runs, not for training.
#include "compute/portable_backend.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "common/error.h"
#include "compute/host_backend.h"
#include "compute/portable/portable_kernels.h"

namespace crucible {
namespace {

namespace p = portable;

class PortableBackend final : public HostMemoryBackend {
 public:
  explicit PortableBackend(const BackendOptions& options) { RequirePortableFloat32(options); }

  std::string name() const override { return "cpu"; }
  // The inherited kernels use the CPU's vectorised exp, not this backend's portable one.
  std::string inherited_kernels_refused() const override {
    return "debug.portable_exact has no portable version of tensor parallelism's kernels yet "
           "(set parallelism.tensor_parallel_degree = 1, or debug.portable_exact = false)";
  }
  std::string Summary() const override { return "device=cpu compute=float32 portable_exact=true"; }
  ComputePrecision compute() const override { return ComputePrecision::kFloat32; }

  void Add(float* y, const float* x, size_t n) override {
    const int64_t count = static_cast<int64_t>(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; ++i) y[i] = p::Add(y[i], x[i]);
  }

  void MatmulForward(float* out, const float* inp, const float* weight, int64_t N, int64_t C,
                     int64_t OC) override {
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < N * OC; ++e)
      p::MatmulForwardElement(out, inp, weight, e / OC, e % OC, C, OC);
  }
  void MatmulBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, int64_t N, int64_t C, int64_t OC, bool accumulate_dinp,
                      bool accumulate_dweight) override {
    if (dinp) {
#pragma omp parallel for schedule(static)
      for (int64_t e = 0; e < N * C; ++e)
        p::MatmulBackwardInputElement(dinp, dout, weight, e / C, e % C, C, OC, accumulate_dinp);
    }
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < OC * C; ++e)
      p::MatmulBackwardWeightElement(dweight, dout, inp, e / C, e % C, N, C, OC,
                                     accumulate_dweight);
  }
  void EmbeddingForward(float* out, const int32_t* tokens, const float* table, int64_t N,
                        int64_t C) override {
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < N * C; ++e)
      p::EmbeddingForwardElement(out, tokens, table, e / C, e % C, C);
  }
  void EmbeddingBackward(float* dtable, const float* dout, const int32_t* tokens, int64_t N,
                         int64_t C) override {
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < C; ++c) p::EmbeddingBackwardChannel(dtable, dout, tokens, c, N, C);
  }
  void RmsnormForward(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                      int64_t C, float eps) override {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) p::RmsnormForwardRow(out, rstd, inp, weight, i, C, eps);
  }
  void RmsnormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                       const float* weight, const float* rstd, int64_t N, int64_t C) override {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) p::RmsnormBackwardInputRow(dinp, dout, inp, weight, rstd, i, C);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < C; ++c)
      p::RmsnormBackwardWeightChannel(dweight, dout, inp, rstd, c, N, C);
  }
  void RopeForward(float* x, const float* cos_table, const float* sin_table, int64_t B, int64_t T,
                   int64_t heads, int64_t D) override {
    Rotate(x, cos_table, sin_table, B, T, heads, D, 1.0f);
  }
  void RopeBackward(float* dx, const float* cos_table, const float* sin_table, int64_t B, int64_t T,
                    int64_t heads, int64_t D) override {
    Rotate(dx, cos_table, sin_table, B, T, heads, D, -1.0f);
  }
  // Packed documents: query t attends keys from its document's start t - positions[t]; key j
  // receives gradient from queries up to its document's end.
  void AttentionForward(float* out, float* lse, const float* q, const float* k, const float* v,
                        int64_t B, int64_t T, int64_t H, int64_t KV, HeadDims dims,
                        const int32_t* positions) override {
    const int64_t D = OneHeadWidth(dims);
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < B * H * T; ++row) {
      const int64_t b = row / (H * T), h = row / T % H, t = row % T;
      const int64_t first = positions ? t - positions[b * T + t] : 0;
      p::AttentionForwardRow(out, lse, q, k, v, b, h, t, T, H, KV, D, first);
    }
  }
  void AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                         const float* lse, const float* q, const float* k, const float* v,
                         int64_t B, int64_t T, int64_t H, int64_t KV, HeadDims dims,
                         const int32_t* positions) override {
    const int64_t D = OneHeadWidth(dims);
    std::vector<float> delta(static_cast<size_t>(B * H * T));
    // Where each row's document ends (exclusive).
    std::vector<int64_t> end(static_cast<size_t>(B * T));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = T - 1; t >= 0; --t)
        end[b * T + t] = !positions                                    ? T
                         : t + 1 == T || positions[b * T + t + 1] == 0 ? t + 1
                                                                       : end[b * T + t + 1];
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < B * H * T; ++row) {
      const int64_t b = row / (H * T), h = row / T % H, t = row % T;
      p::AttentionBackwardDeltaRow(delta.data(), dout, out, b, h, t, T, H, D);
    }
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < B * H * T; ++row) {
      const int64_t b = row / (H * T), h = row / T % H, t = row % T;
      const int64_t first = positions ? t - positions[b * T + t] : 0;
      p::AttentionBackwardQueryRow(dq, dout, lse, delta.data(), q, k, v, b, h, t, T, H, KV, D,
                                   first);
    }
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < B * KV * T; ++row) {
      const int64_t b = row / (KV * T), g = row / T % KV, j = row % T;
      p::AttentionBackwardKeyRow(dk, dv, dout, lse, delta.data(), q, k, v, b, g, j, T, H, KV, D,
                                 end[b * T + j]);
    }
  }
  void SwigluForward(float* out, const float* gate, const float* up, int64_t N,
                     int64_t F) override {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N * F; ++i) p::SwigluForwardElement(out, gate, up, i);
  }
  void SwigluBackward(float* dgate, float* dup, const float* dout, const float* gate,
                      const float* up, int64_t N, int64_t F) override {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N * F; ++i) p::SwigluBackwardElement(dgate, dup, dout, gate, up, i);
  }
  void CrossEntropyForward(float* losses, float* lse, const float* logits, const int32_t* targets,
                           int64_t N, int64_t V) override {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) p::CrossEntropyForwardRow(losses, lse, logits, targets, i, V);
  }
  void CrossEntropyBackward(float* logits_to_dlogits, const float* lse, const int32_t* targets,
                            int64_t N, int64_t V, float scale, const float* weights) override {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i)
      p::CrossEntropyBackwardRow(logits_to_dlogits, lse, targets, i, V, scale, weights);
  }

 private:
  static void Rotate(float* x, const float* cos_table, const float* sin_table, int64_t B, int64_t T,
                     int64_t heads, int64_t D, float sine_sign) {
    const int64_t half = D / 2;
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < B * T * heads * half; ++e)
      p::RopeRotatePair(x, cos_table, sin_table, e / (heads * half), e / half % heads, e % half, T,
                        heads, D, sine_sign);
  }
};

}  // namespace

const BackendOptions& RequirePortableFloat32(const BackendOptions& options) {
  if (options.compute != ComputePrecision::kFloat32)
    throw UsageError(std::string("training.mixed_precision_param = \"") +
                     ComputePrecisionName(options.compute) +
                     "\": debug.portable_exact computes in float32 only; set "
                     "mixed_precision_param = \"float32\" or portable_exact = false");
  return options;
}

std::unique_ptr<ComputeBackend> BuildPortableBackend(const BackendOptions& options) {
  return std::make_unique<PortableBackend>(options);
}

}  // namespace crucible
