// The backend registry, and the names of the precisions.
#include "compute/backend.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "common/registry.h"
#include "kernels/cpu/decode.h"
#include "kernels/cpu/kernels.h"

namespace crucible {

int64_t OneHeadWidth(HeadDims D) {
  if (D.v != D.qk)
    throw Error(kExitFailure,
                "internal: this backend's attention has one head width (value heads of another "
                "width run on training.device = \"cpu\")");
  return D.qk;
}

void RefusePackedDocuments(const int32_t* positions, const std::string& backend) {
  if (positions)
    throw UsageError("training.device = \"" + backend +
                     "\" has no attention kernel for packed conversations yet: set "
                     "sft.packing = false, or train on training.device = \"cpu\"");
}

namespace {

Registry<BackendFactory>& Backends() {
  static Registry<BackendFactory> registry("device");
  return registry;
}

// Host copies of a backend's device arrays for an inherited kernel: In() copies an input to the
// host, Out() an output (and its contents, for the kernels that add to it), Finish() copies the
// outputs back. On host memory every pointer is used as it is.
class Staging {
 public:
  explicit Staging(ComputeBackend& backend) : backend_(backend) {}
  template <typename T>
  const T* In(const T* device, size_t count) {
    if (backend_.host_memory() || !device) return device;
    auto& copy = buffers_.emplace_back(count * sizeof(T));
    backend_.CopyToHost(copy.data(), device, count * sizeof(T));
    return reinterpret_cast<const T*>(copy.data());
  }
  template <typename T>
  T* Out(T* device, size_t count) {
    if (backend_.host_memory()) return device;
    T* host = const_cast<T*>(In(device, count));
    outputs_.push_back({device, host, count * sizeof(T)});
    return host;
  }
  void Finish() {
    for (const Output& o : outputs_) backend_.CopyToDevice(o.device, o.host, o.bytes);
  }

 private:
  struct Output {
    void* device;
    const void* host;
    size_t bytes;
  };
  ComputeBackend& backend_;
  std::vector<std::vector<std::byte>> buffers_;  // never reallocated: a list of vectors
  std::vector<Output> outputs_;
};

// Copies rows of `cols` floats, `from_ld` apart, into rows `to_ld` apart (device memory).
void CopyRows(ComputeBackend& backend, float* to, int64_t to_ld, const float* from, int64_t from_ld,
              int64_t rows, int64_t cols) {
  Staging staging(backend);
  const float* source = staging.In(from, static_cast<size_t>((rows - 1) * from_ld + cols));
  float* target = staging.Out(to, static_cast<size_t>((rows - 1) * to_ld + cols));
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(target + r * to_ld, source + r * from_ld, cols * sizeof(float));
  staging.Finish();
}

}  // namespace

void ComputeBackend::RefuseInherited(const char* kernel) const {
  const std::string why = inherited_kernels_refused();
  if (!why.empty())
    throw UsageError("training.device = \"" + name() + "\": this backend has no " + kernel +
                     " kernel: " + why);
}

void ComputeBackend::MatmulForwardStrided(float* out, const float* inp, const float* weight,
                                          int64_t ldw, int64_t N, int64_t C, int64_t OC) {
  if (ldw == C) return MatmulForward(out, inp, weight, N, C, OC);
  DeviceArray<float> packed(*this, static_cast<size_t>(OC * C));
  CopyRows(*this, packed.data(), C, weight, ldw, OC, C);
  MatmulForward(out, inp, packed.data(), N, C, OC);
}

void ComputeBackend::MatmulBackwardStrided(float* dinp, float* dweight, const float* dout,
                                           const float* inp, const float* weight, int64_t ldw,
                                           int64_t N, int64_t C, int64_t OC, bool accumulate_dinp,
                                           bool accumulate_dweight) {
  if (ldw == C)
    return MatmulBackward(dinp, dweight, dout, inp, weight, N, C, OC, accumulate_dinp,
                          accumulate_dweight);
  DeviceArray<float> packed(*this, static_cast<size_t>(OC * C)),
      dpacked(*this, static_cast<size_t>(OC * C));
  CopyRows(*this, packed.data(), C, weight, ldw, OC, C);
  if (accumulate_dweight) CopyRows(*this, dpacked.data(), C, dweight, ldw, OC, C);
  MatmulBackward(dinp, dpacked.data(), dout, inp, packed.data(), N, C, OC, accumulate_dinp,
                 accumulate_dweight);
  CopyRows(*this, dweight, ldw, dpacked.data(), C, OC, C);
}

void ComputeBackend::EmbeddingForwardRows(float* out, const int32_t* tokens, const float* table,
                                          int64_t N, int64_t C, int64_t first, int64_t rows) {
  RefuseInherited("EmbeddingForwardRows");
  Staging s(*this);
  float* o = s.Out(out, N * C);
  kernels::embedding_forward_rows(o, s.In(tokens, N), s.In(table, rows * C), N, C, first, rows);
  s.Finish();
}

void ComputeBackend::EmbeddingBackwardRows(float* dtable, const float* dout, const int32_t* tokens,
                                           int64_t N, int64_t C, int64_t first, int64_t rows) {
  RefuseInherited("EmbeddingBackwardRows");
  Staging s(*this);
  float* d = s.Out(dtable, rows * C);
  kernels::embedding_backward_rows(d, s.In(dout, N * C), s.In(tokens, N), N, C, first, rows);
  s.Finish();
}

void ComputeBackend::RowMax(float* max, const float* x, int64_t N, int64_t V) {
  RefuseInherited("RowMax");
  Staging s(*this);
  float* m = s.Out(max, N);
  kernels::row_max(m, s.In(x, N * V), N, V);
  s.Finish();
}

void ComputeBackend::RowExpSum(float* sum, const float* x, const float* max, int64_t N, int64_t V) {
  RefuseInherited("RowExpSum");
  Staging s(*this);
  float* o = s.Out(sum, N);
  kernels::row_exp_sum(o, s.In(x, N * V), s.In(max, N), N, V);
  s.Finish();
}

void ComputeBackend::TargetLogits(float* out, const float* x, const int32_t* targets, int64_t N,
                                  int64_t V, int64_t first) {
  RefuseInherited("TargetLogits");
  Staging s(*this);
  float* o = s.Out(out, N);
  kernels::target_logits(o, s.In(x, N * V), s.In(targets, N), N, V, first);
  s.Finish();
}

void ComputeBackend::CrossEntropyBackwardRows(float* x_to_dx, const float* lse,
                                              const int32_t* targets, int64_t N, int64_t V,
                                              int64_t first, float scale, const float* weights) {
  RefuseInherited("CrossEntropyBackwardRows");
  Staging s(*this);
  float* x = s.Out(x_to_dx, N * V);
  kernels::cross_entropy_backward_rows(x, s.In(lse, N), s.In(targets, N), N, V, first, scale,
                                       s.In(weights, N));
  s.Finish();
}

void ComputeBackend::RopeForwardStrided(float* x, const float* cos_table, const float* sin_table,
                                        int64_t B, int64_t T, int64_t heads, int64_t D,
                                        int64_t stride, int64_t offset) {
  RefuseInherited("RopeForwardStrided");
  Staging s(*this);
  float* o = s.Out(x, B * T * heads * stride);
  kernels::rope_forward_strided(o, s.In(cos_table, T * D / 2), s.In(sin_table, T * D / 2), B, T,
                                heads, D, stride, offset);
  s.Finish();
}

void ComputeBackend::RopeBackwardStrided(float* dx, const float* cos_table, const float* sin_table,
                                         int64_t B, int64_t T, int64_t heads, int64_t D,
                                         int64_t stride, int64_t offset) {
  RefuseInherited("RopeBackwardStrided");
  Staging s(*this);
  float* o = s.Out(dx, B * T * heads * stride);
  kernels::rope_backward_strided(o, s.In(cos_table, T * D / 2), s.In(sin_table, T * D / 2), B, T,
                                 heads, D, stride, offset);
  s.Finish();
}

void ComputeBackend::CopyColumns(float* dst, int64_t ldd, const float* src, int64_t lds,
                                 int64_t rows, int64_t cols, bool accumulate) {
  RefuseInherited("CopyColumns");
  if (rows == 0) return;
  Staging s(*this);
  float* d = s.Out(dst, (rows - 1) * ldd + cols);
  kernels::copy_columns(d, ldd, s.In(src, (rows - 1) * lds + cols), lds, rows, cols, accumulate);
  s.Finish();
}

void ComputeBackend::MatmulRows(float* out, const float* inp, RowWeights weight, int64_t N,
                                int64_t C, int64_t OC) {
  const RowProduct product{out, weight, OC};
  MatmulRowsMany(&product, 1, inp, N, C);
}

void ComputeBackend::MatmulRowsMany(const RowProduct* products, int count, const float* inp,
                                    int64_t N, int64_t C) {
  RefuseInherited("MatmulRows");
  Staging s(*this);
  std::vector<kernels::RowProduct> staged;
  for (int p = 0; p < count; ++p) {
    const RowProduct& product = products[p];
    const size_t weight_bytes =
        static_cast<size_t>(product.OC * C) * WeightTypeBytes(product.weight.type);
    const void* weight = s.In(static_cast<const char*>(product.weight.data), weight_bytes);
    staged.push_back(
        {s.Out(product.out, N * product.OC), RowWeights(weight, product.weight.type), product.OC});
  }
  kernels::matmul_rows(staged.data(), count, s.In(inp, N * C), N, C);
  s.Finish();
}

void ComputeBackend::DecodeAttention(float* out, const float* q, const float* const* keys,
                                     const float* const* values, const int64_t* lengths, int64_t N,
                                     int64_t H, int64_t KV, HeadDims D) {
  RefuseInherited("DecodeAttention");
  Staging s(*this);
  float* o = s.Out(out, N * H * D.v);
  std::vector<const float*> k(static_cast<size_t>(N)), v(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) {
    k[i] = s.In(keys[i], lengths[i] * KV * D.qk);
    v[i] = s.In(values[i], lengths[i] * KV * D.v);
  }
  kernels::decode_attention(o, s.In(q, N * H * D.qk), k.data(), v.data(), lengths, N, H, KV, D);
  s.Finish();
}

void ComputeBackend::GatherRows(float* out, const float* x, const int32_t* rows, int64_t N,
                                int64_t K, int64_t C) {
  RefuseInherited("GatherRows");
  Staging s(*this);
  float* o = s.Out(out, N * K * C);
  kernels::gather_rows(o, s.In(x, N * C), s.In(rows, N * K), N, K, C);
  s.Finish();
}

void ComputeBackend::MoeCombine(float* out, const float* y, const int32_t* rows,
                                const float* weights, int64_t N, int64_t K, int64_t C) {
  RefuseInherited("MoeCombine");
  Staging s(*this);
  float* o = s.Out(out, N * C);
  kernels::moe_combine(o, s.In(y, N * K * C), s.In(rows, N * K), s.In(weights, N * K), N, K, C);
  s.Finish();
}

void ComputeBackend::MoeCombineBackward(float* dy, float* dweights, const float* dout,
                                        const float* y, const int32_t* rows, const float* weights,
                                        int64_t N, int64_t K, int64_t C) {
  RefuseInherited("MoeCombineBackward");
  Staging s(*this);
  float* d = s.Out(dy, N * K * C);
  float* dw = s.Out(dweights, N * K);
  kernels::moe_combine_backward(d, dw, s.In(dout, N * C), s.In(y, N * K * C), s.In(rows, N * K),
                                s.In(weights, N * K), N, K, C);
  s.Finish();
}

void ComputeBackend::ScatterAddRows(float* dx, const float* drows, const int32_t* rows, int64_t N,
                                    int64_t K, int64_t C) {
  RefuseInherited("ScatterAddRows");
  Staging s(*this);
  float* d = s.Out(dx, N * C);
  kernels::scatter_add_rows(d, s.In(drows, N * K * C), s.In(rows, N * K), N, K, C);
  s.Finish();
}

void ComputeBackend::GroupedMatmulForward(float* out, const float* inp, const float* const* weights,
                                          const int64_t* begin, int64_t G, int64_t C, int64_t OC) {
  RefuseInherited("GroupedMatmulForward");
  if (compute() != ComputePrecision::kFloat32) {  // the bf16 products: one call per group
    for (int64_t g = 0; g < G; ++g)
      if (begin[g + 1] > begin[g])
        MatmulForward(out + begin[g] * OC, inp + begin[g] * C, weights[g], begin[g + 1] - begin[g],
                      C, OC);
    return;
  }
  Staging s(*this);
  const int64_t rows = begin[G];
  std::vector<const float*> w(G);
  for (int64_t g = 0; g < G; ++g) w[g] = s.In(weights[g], OC * C);
  float* o = s.Out(out, rows * OC);
  kernels::grouped_matmul_forward(o, s.In(inp, rows * C), w.data(), begin, G, C, OC);
  s.Finish();
}

void ComputeBackend::GroupedMatmulBackward(float* dinp, float* const* dweights, const float* dout,
                                           const float* inp, const float* const* weights,
                                           const int64_t* begin, int64_t G, int64_t C, int64_t OC,
                                           bool accumulate_dinp) {
  RefuseInherited("GroupedMatmulBackward");
  if (compute() != ComputePrecision::kFloat32) {  // the bf16 products: one call per group
    for (int64_t g = 0; g < G; ++g) {
      const int64_t n = begin[g + 1] - begin[g];
      if (n == 0)
        Fill(dweights[g], static_cast<size_t>(OC * C), 0.0f);
      else
        MatmulBackward(dinp ? dinp + begin[g] * C : nullptr, dweights[g], dout + begin[g] * OC,
                       inp + begin[g] * C, weights[g], n, C, OC, accumulate_dinp, false);
    }
    return;
  }
  Staging s(*this);
  const int64_t rows = begin[G];
  std::vector<const float*> w(G);
  std::vector<float*> dw(G);
  for (int64_t g = 0; g < G; ++g) {
    w[g] = s.In(weights[g], OC * C);
    dw[g] = s.Out(dweights[g], OC * C);
  }
  float* di = dinp ? s.Out(dinp, rows * C) : nullptr;
  kernels::grouped_matmul_backward(di, dw.data(), s.In(dout, rows * OC), s.In(inp, rows * C),
                                   w.data(), begin, G, C, OC, accumulate_dinp);
  s.Finish();
}

const char* ComputePrecisionName(ComputePrecision precision) {
  return precision == ComputePrecision::kBfloat16 ? "bfloat16" : "float32";
}

BackendRegistrar::BackendRegistrar(const char* name, BackendFactory build) {
  Backends().Add(name, build);
}

std::vector<std::string> RegisteredBackends() {
  return Backends().Names();
}

std::shared_ptr<ComputeBackend> MakeBackend(const BackendOptions& options) {
  const auto& entries = Backends().entries();
  if (options.device == "cuda" && !entries.count("cuda"))
    throw UsageError(
        "training.device = \"cuda\": this crucible was built without the CUDA backend; rebuild "
        "where the CUDA toolkit (nvcc) is installed (cmake -DCRUCIBLE_CUDA=ON), or set "
        "training.device = \"cpu\"");
  return Backends().Find(options.device, "training.device")(options);
}

std::shared_ptr<ComputeBackend> DefaultCpuBackend() {
  static const std::shared_ptr<ComputeBackend> cpu = MakeBackend(BackendOptions{});
  return cpu;
}

}  // namespace crucible
