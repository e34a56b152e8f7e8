// The compute backend: where a model's activations live and what runs its kernels. Model code is
// written once against this interface (model/llama.cc); `[training] device` picks the
// implementation:
//
//   "cpu"   compute/cpu_backend.cc: host memory, the OpenMP kernels of kernels/cpu/ (fp32, or
//           bf16 operands with fp32 accumulation when the run asks for bfloat16 compute).
//   "cuda"  compute/cuda/: device memory on the GPU that LOCAL_RANK picks, CUDA kernels and
//           cuBLASLt. Registered only by a build made with the CUDA toolkit (-DCRUCIBLE_CUDA=AUTO,
//           the default, builds it where nvcc is found; ON requires nvcc, OFF never builds it);
//           a build without it refuses "cuda" in one line.
//
// Every pointer a kernel takes is a device pointer of this backend: memory from Allocate (or a
// DeviceArray), never host memory unless host_memory() says the two are the same. Shapes are
// those of kernels/cpu/kernels.h, which documents each kernel; every backend keeps its
// promises: bit-identical results run to run on one device model, independent of the thread
// (or block) count, no floating-point atomics.
//
// Precision: `compute` is the precision of the operands of the matrix products and of
// attention. kFloat32 is plain fp32. kBfloat16 rounds both operands of every product to
// bfloat16 (ties to even) and accumulates in fp32; outputs, norms, softmax, RoPE, SwiGLU and
// the loss stay fp32 (torchtitan's mixed_precision_param = "bfloat16" with fp32 reductions).
// The CPU's bf16 path is the numerical oracle of the GPU's. Exactly, the rounded operands are:
//   MatmulForward   inp, weight            MatmulBackward  dout, weight (dinp); dout, inp (dweight)
//   AttentionForward  Q K^T: q, k;  P V: v and P = exp(s - m), the tile's unnormalised
//                     probabilities, rounded after their fp32 row sum (flash style)
//   AttentionBackward dO V^T: dout, v;  P^T dO: P = exp(s - lse), dout;  dS K, dS^T Q: the score
//                     gradient dS = P (dP - delta) / sqrt(D), k, q; delta = rowsum(dout * out)
//                     in fp32 on the unrounded values
// Every output and gradient buffer stays fp32. The CPU runs this as exact emulation (bf16 values
// held in fp32 through the fp32 kernels) or, on AVX-512 BF16 or AMX CPUs, the linear layers (and
// on AMX attention's tiles) natively ([debug] bf16_path; kernels/cpu/gemm_bf16.h states how its
// sums differ).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/head_dims.h"
#include "kernels/row_weights.h"

namespace crucible {

enum class ComputePrecision { kFloat32, kBfloat16 };
const char* ComputePrecisionName(ComputePrecision precision);  // "float32", "bfloat16"

struct BackendOptions {
  std::string device = "cpu";  // the registered backend's name
  int local_rank = 0;          // picks the GPU of a multi-GPU node (LOCAL_RANK)
  ComputePrecision compute = ComputePrecision::kFloat32;
  // [debug] portable_exact: the kernels of compute/portable/ (fixed order, no BLAS, no libm), the
  // same bits on every device. The CPU backend then builds compute/portable_backend.h's.
  bool portable_exact = false;
  // [debug] share_gpu (tests): ranks on a node with more ranks than GPUs share them (GPU =
  // local rank modulo the GPU count) instead of being refused.
  bool share_gpu = false;
  // The CPU's bf16 products ([debug] bf16_path): "auto" (native where the CPU has AMX-BF16 or
  // AVX-512 BF16, the former first), "emulated", "native" (as auto, refused where the CPU has
  // neither), "avx512_bf16" or "amx" (that kernel, refused where the CPU lacks it).
  std::string bf16_path = "auto";
  // The fp32 products' library ([debug] gemm_library, kernels/cpu/gemm_library.h): "auto" (the
  // measured table for this CPU's ISA and the product's shape), "openblas", "onednn".
  std::string gemm_library = "auto";
};

// D.qk, for an attention kernel with one head width; an internal error when D.v differs.
int64_t OneHeadWidth(HeadDims D);
// For an attention kernel without packed documents: UsageError naming the backend when
// `positions` is not nullptr (sft.packing).
void RefusePackedDocuments(const int32_t* positions, const std::string& backend);

class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;

  // ---- what it is ----
  virtual std::string name() const = 0;  // "cpu", "cuda"
  // key=value pairs for the phase=start line, e.g. "device=cpu compute=bfloat16
  // bf16_path=avx512_bf16" or "device=cpu compute=float32 gemm=auto gemm_isa=avx512".
  virtual std::string Summary() const = 0;
  virtual ComputePrecision compute() const = 0;
  // True when device pointers are host pointers (the CPU): a model then reads weights and writes
  // gradients in place instead of copying them through device buffers.
  virtual bool host_memory() const = 0;

  // ---- memory ----
  // `bytes` of device memory, zero-filled; Error (exit 1) naming the size and what is free when
  // the device has not enough.
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* pointer) noexcept = 0;
  virtual void CopyToDevice(void* device, const void* host, size_t bytes) = 0;
  virtual void CopyToHost(void* host, const void* device, size_t bytes) = 0;
  // Waits for every kernel and copy issued so far (a no-op on the CPU).
  virtual void Synchronize() = 0;
  // The free and total bytes of the device's own memory, and the device's name for messages
  // ("GPU 0 (NVIDIA H200)"); false where device memory is the host's (the host's memory check
  // covers it).
  virtual bool DeviceMemory(double* free_bytes, double* total_bytes, std::string* where) const {
    (void)free_bytes, (void)total_bytes, (void)where;
    return false;
  }

  // ---- elementwise helpers ----
  virtual void Fill(float* x, size_t n, float value) = 0;
  // y[i] += x[i]
  virtual void Add(float* y, const float* x, size_t n) = 0;

  // ---- the kernels (shapes and contracts: kernels/cpu/kernels.h) ----
  virtual void MatmulForward(float* out, const float* inp, const float* weight, int64_t N,
                             int64_t C, int64_t OC) = 0;
  virtual void MatmulBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                              const float* weight, int64_t N, int64_t C, int64_t OC,
                              bool accumulate_dinp, bool accumulate_dweight) = 0;
  virtual void EmbeddingForward(float* out, const int32_t* tokens, const float* table, int64_t N,
                                int64_t C) = 0;
  virtual void EmbeddingBackward(float* dtable, const float* dout, const int32_t* tokens, int64_t N,
                                 int64_t C) = 0;
  virtual void RmsnormForward(float* out, float* rstd, const float* inp, const float* weight,
                              int64_t N, int64_t C, float eps) = 0;
  virtual void RmsnormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                               const float* weight, const float* rstd, int64_t N, int64_t C) = 0;
  // cos/sin (T, D/2) device tables, as kernels::rope_tables computes them on the host.
  virtual void RopeForward(float* x, const float* cos_table, const float* sin_table, int64_t B,
                           int64_t T, int64_t heads, int64_t D) = 0;
  virtual void RopeBackward(float* dx, const float* cos_table, const float* sin_table, int64_t B,
                            int64_t T, int64_t heads, int64_t D) = 0;
  // kernels::attention_forward/_backward's shapes: D.qk the query and key heads' width, D.v the
  // value and output heads' (one width converts to both). A backend without a kernel for
  // D.v != D.qk throws an internal error (its model refuses the backend first). `positions`
  // (B,T) host memory, or nullptr: packed documents, each attending only to itself
  // (kernels::attention_forward); a backend without them refuses non-null positions with
  // RefusePackedDocuments.
  virtual void AttentionForward(float* out, float* lse, const float* q, const float* k,
                                const float* v, int64_t B, int64_t T, int64_t H, int64_t KV,
                                HeadDims D, const int32_t* positions) = 0;
  virtual void AttentionBackward(float* dq, float* dk, float* dv, const float* dout,
                                 const float* out, const float* lse, const float* q, const float* k,
                                 const float* v, int64_t B, int64_t T, int64_t H, int64_t KV,
                                 HeadDims D, const int32_t* positions) = 0;
  virtual void SwigluForward(float* out, const float* gate, const float* up, int64_t N,
                             int64_t F) = 0;
  virtual void SwigluBackward(float* dgate, float* dup, const float* dout, const float* gate,
                              const float* up, int64_t N, int64_t F) = 0;
  // Targets are checked by the caller: every one is -1 or in [0, V).
  virtual void CrossEntropyForward(float* losses, float* lse, const float* logits,
                                   const int32_t* targets, int64_t N, int64_t V) = 0;
  virtual void CrossEntropyBackward(float* logits_to_dlogits, const float* lse,
                                    const int32_t* targets, int64_t N, int64_t V, float scale,
                                    const float* weights) = 0;

  // ---- kernels with one host implementation (backend.cc) ----
  // A backend without its own version inherits these: on host memory they run the kernels of
  // kernels/cpu/ in place; off the host they stage their operands through host copies (correct,
  // not fast). A backend whose inherited kernels would break its promises (the portable one's
  // bits, the GPU's speed) says why in inherited_kernels_refused(), and each of them then throws
  // UsageError naming the backend, the kernel and that reason. Tensor parallelism
  // (model/parallelism.h) is what calls them.
  //
  // The products of a chunk of a weight: `weight` (OC, C) with rows `ldw` floats apart (a
  // column block of a wider matrix, ldw >= C), and its gradient `dweight` in the same layout.
  // With ldw == C they are MatmulForward and MatmulBackward; otherwise the chunk is packed into
  // a contiguous copy first, so the bits are those of MatmulForward on that copy.
  virtual void MatmulForwardStrided(float* out, const float* inp, const float* weight, int64_t ldw,
                                    int64_t N, int64_t C, int64_t OC);
  virtual void MatmulBackwardStrided(float* dinp, float* dweight, const float* dout,
                                     const float* inp, const float* weight, int64_t ldw, int64_t N,
                                     int64_t C, int64_t OC, bool accumulate_dinp,
                                     bool accumulate_dweight);
  // kernels::embedding_forward_rows / embedding_backward_rows (rows [first, first + rows) of the
  // vocabulary), row_max, row_exp_sum, target_logits, cross_entropy_backward_rows (a slice of
  // the vocabulary starting at `first`).
  virtual void EmbeddingForwardRows(float* out, const int32_t* tokens, const float* table,
                                    int64_t N, int64_t C, int64_t first, int64_t rows);
  virtual void EmbeddingBackwardRows(float* dtable, const float* dout, const int32_t* tokens,
                                     int64_t N, int64_t C, int64_t first, int64_t rows);
  virtual void RowMax(float* max, const float* x, int64_t N, int64_t V);
  virtual void RowExpSum(float* sum, const float* x, const float* max, int64_t N, int64_t V);
  virtual void TargetLogits(float* out, const float* x, const int32_t* targets, int64_t N,
                            int64_t V, int64_t first);
  virtual void CrossEntropyBackwardRows(float* x_to_dx, const float* lse, const int32_t* targets,
                                        int64_t N, int64_t V, int64_t first, float scale,
                                        const float* weights);
  // The kernels of a second model family (model/deepseek_v3.h: MLA and a mixture of experts),
  // shapes and contracts in kernels/cpu/kernels.h: rope_forward_strided / rope_backward_strided
  // (a RoPE on part of each head), copy_columns, gather_rows, moe_combine, moe_combine_backward,
  // scatter_add_rows. `rows` is device memory like every other pointer.
  virtual void RopeForwardStrided(float* x, const float* cos_table, const float* sin_table,
                                  int64_t B, int64_t T, int64_t heads, int64_t D, int64_t stride,
                                  int64_t offset);
  virtual void RopeBackwardStrided(float* dx, const float* cos_table, const float* sin_table,
                                   int64_t B, int64_t T, int64_t heads, int64_t D, int64_t stride,
                                   int64_t offset);
  virtual void CopyColumns(float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows,
                           int64_t cols, bool accumulate);
  virtual void GatherRows(float* out, const float* x, const int32_t* rows, int64_t N, int64_t K,
                          int64_t C);
  virtual void MoeCombine(float* out, const float* y, const int32_t* rows, const float* weights,
                          int64_t N, int64_t K, int64_t C);
  virtual void MoeCombineBackward(float* dy, float* dweights, const float* dout, const float* y,
                                  const int32_t* rows, const float* weights, int64_t N, int64_t K,
                                  int64_t C);
  virtual void ScatterAddRows(float* dx, const float* drows, const int32_t* rows, int64_t N,
                              int64_t K, int64_t C);
  // kernels::grouped_matmul_forward / grouped_matmul_backward: the experts' products, one
  // grouped GEMM per product. `weights` and `dweights` hold G pointers to device memory; `begin`
  // (G + 1 row offsets) is host memory. With bfloat16 compute, one MatmulForward /
  // MatmulBackward per group (the bf16 products have no grouped form yet).
  virtual void GroupedMatmulForward(float* out, const float* inp, const float* const* weights,
                                    const int64_t* begin, int64_t G, int64_t C, int64_t OC);
  virtual void GroupedMatmulBackward(float* dinp, float* const* dweights, const float* dout,
                                     const float* inp, const float* const* weights,
                                     const int64_t* begin, int64_t G, int64_t C, int64_t OC,
                                     bool accumulate_dinp);
  // The decode step's kernels (kernels/cpu/decode.h; model/model.h InferenceModel): a product
  // and an attention whose bits for one row depend on that row alone, never on the other rows of
  // the batch. fp32 whatever compute() is. `keys`, `values` (N pointers to device memory) and
  // `lengths` (N) are host memory; D as AttentionForward's (values may be narrower or wider).
  // MatmulRows reads float32 or 16-bit weights (kernels/row_weights.h); MatmulRowsMany runs
  // several products of one input (each as MatmulRows computes it) in one pass of the threads.
  virtual void MatmulRows(float* out, const float* inp, RowWeights weight, int64_t N, int64_t C,
                          int64_t OC);
  struct RowProduct {
    float* out;         // (N, OC), device memory
    RowWeights weight;  // (OC, C), device memory
    int64_t OC;
  };
  virtual void MatmulRowsMany(const RowProduct* products, int count, const float* inp, int64_t N,
                              int64_t C);
  virtual void DecodeAttention(float* out, const float* q, const float* const* keys,
                               const float* const* values, const int64_t* lengths, int64_t N,
                               int64_t H, int64_t KV, HeadDims D);
  // Why this backend refuses the inherited kernels above (the strided products excepted: they
  // are built from its own); empty when it runs them.
  virtual std::string inherited_kernels_refused() const { return ""; }

 private:
  void RefuseInherited(const char* kernel) const;  // UsageError when this backend refuses them
};

// An array of T in one backend's memory, zero-filled, freed with it. Movable, not copyable.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(ComputeBackend& backend, size_t size)
      : backend_(&backend),
        data_(size ? static_cast<T*>(backend.Allocate(size * sizeof(T))) : nullptr),
        size_(size) {}
  ~DeviceArray() {
    if (data_) backend_->Free(data_);
  }
  DeviceArray(DeviceArray&& other) noexcept { *this = std::move(other); }
  DeviceArray& operator=(DeviceArray&& other) noexcept {
    if (this != &other) {
      if (data_) backend_->Free(data_);
      backend_ = other.backend_;
      data_ = other.data_;
      size_ = other.size_;
      other.data_ = nullptr;
      other.size_ = 0;
    }
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  void CopyFrom(const T* host, size_t count) {
    backend_->CopyToDevice(data_, host, count * sizeof(T));
  }
  void CopyTo(T* host, size_t count) const { backend_->CopyToHost(host, data_, count * sizeof(T)); }

 private:
  ComputeBackend* backend_ = nullptr;
  T* data_ = nullptr;
  size_t size_ = 0;
};

// ---- the registry ----

// Builds a backend; Error naming the device and what to do when it cannot run here (no GPU,
// the GPU LOCAL_RANK names does not exist, a precision it lacks).
using BackendFactory = std::unique_ptr<ComputeBackend> (*)(const BackendOptions& options);
// A static instance in a backend's .cc file registers it under `name`.
struct BackendRegistrar {
  BackendRegistrar(const char* name, BackendFactory build);
};
std::vector<std::string> RegisteredBackends();  // sorted
// The backend `options.device` names. UsageError (exit 2) for a name no backend has ("cuda" in
// a build without the CUDA toolkit says how to build one).
std::shared_ptr<ComputeBackend> MakeBackend(const BackendOptions& options);
// The fp32 CPU backend, shared: what a model is built on when nobody asks for another (eval,
// the `crucible model` tools, tests).
std::shared_ptr<ComputeBackend> DefaultCpuBackend();

}  // namespace crucible
