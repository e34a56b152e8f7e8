// The CUDA backend (what it promises: cuda_backend.h).
#include "compute/cuda/cuda_backend.h"

#include <cstdio>
#include <optional>
#include <vector>

#include "common/profile.h"
#include "compute/cuda/cuda_check.h"
#include "compute/cuda/cuda_kernels.h"
#include "compute/cuda/gemm.h"
#include "compute/cuda/portable_launch.h"
#include "compute/portable_backend.h"
#include "kernels/kernel_costs.h"

namespace crucible::cuda {
namespace {

constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;

std::string Gib(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
  return text;
}

// The GPU's memory, stream, copies and errors, and the fast kernels (cuda_kernels.h, cuBLASLt).
// PortableCudaBackend below replaces the kernels and keeps the rest.
class CudaBackend : public ComputeBackend, protected Workspace {
 public:
  // with_gemm false: no cuBLASLt handle or workspace (a subclass that does its own products).
  explicit CudaBackend(const BackendOptions& options, bool with_gemm = true)
      : compute_(options.compute), gpu_(options.local_rank) {
    int count = 0;
    cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess || count == 0)
      throw UsageError(std::string("training.device = \"cuda\": no usable CUDA GPU here "
                                   "(cudaGetDeviceCount: ") +
                       (status == cudaSuccess ? "0 devices" : cudaGetErrorString(status)) +
                       "); set training.device = \"cpu\" or run where an NVIDIA GPU and its "
                       "driver are present");
    if (options.share_gpu && gpu_ >= 0) gpu_ %= count;  // tests: ranks share the GPUs there are
    if (gpu_ < 0 || gpu_ >= count)
      throw UsageError("training.device = \"cuda\": LOCAL_RANK " + std::to_string(gpu_) +
                       " names GPU " + std::to_string(gpu_) + " but cudaGetDeviceCount found " +
                       std::to_string(count) + "; start at most " + std::to_string(count) +
                       " ranks per node (or, for tests, set debug.share_gpu = true)");
    CRUCIBLE_CUDA_CHECK(cudaSetDevice(gpu_));
    cudaDeviceProp properties{};
    CRUCIBLE_CUDA_CHECK(cudaGetDeviceProperties(&properties, gpu_));
    gpu_name_ = properties.name;
    for (char& c : gpu_name_)
      if (c == ' ') c = '_';
    sm_ = properties.major * 10 + properties.minor;
    total_bytes_ = properties.totalGlobalMem;
    CRUCIBLE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    slots_.assign(kSlotCount, {nullptr, 0});
    if (!with_gemm) return;
    gemm_workspace_ = Allocate(kGemmWorkspaceBytes);
    gemm_ = std::make_unique<LtGemm>(stream_, gemm_workspace_, kGemmWorkspaceBytes);
  }

  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    gemm_.reset();
    for (auto& slot : slots_) Free(slot.first);
    Free(gemm_workspace_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "cuda"; }
  // Tensor parallelism's kernels have no CUDA version yet: staged through the host they would
  // run, slowly, where a GPU run expects its own speed.
  std::string inherited_kernels_refused() const override {
    return "tensor parallelism runs on the CPU backend only so far (set training.device = "
           "\"cpu\", or parallelism.tensor_parallel_degree = 1)";
  }
  std::string Summary() const override {
    return "device=cuda gpu=" + std::to_string(gpu_) + " gpu_name=" + gpu_name_ +
           " sm=" + std::to_string(sm_) + " gpu_memory_gib=" + std::to_string(total_bytes_ >> 30) +
           " compute=" + ComputePrecisionName(compute_);
  }
  ComputePrecision compute() const override { return compute_; }
  bool host_memory() const override { return false; }

  void* Allocate(size_t bytes) override {
    void* pointer = nullptr;
    if (bytes == 0) bytes = 1;
    if (cudaMalloc(&pointer, bytes) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error so later calls are not blamed
      size_t free_bytes = 0, total_bytes = 0;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      throw Error(kExitFailure, "cuda: cannot allocate " + std::to_string(bytes) + " bytes (" +
                                    Gib(bytes) + ") on GPU " + std::to_string(gpu_) + ": " +
                                    Gib(free_bytes) + " free of " + Gib(total_bytes) +
                                    "; lower training.local_batch_size or training.seq_len");
    }
    CRUCIBLE_CUDA_CHECK(cudaMemsetAsync(pointer, 0, bytes, stream_));
    return pointer;
  }
  void Free(void* pointer) noexcept override {
    if (pointer) cudaFree(pointer);  // cudaFree waits for the work that may still use it
  }
  void CopyToDevice(void* device, const void* host, size_t bytes) override {
    if (!bytes) return;
    CRUCIBLE_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream_));
    Synchronize();
  }
  void CopyToHost(void* host, const void* device, size_t bytes) override {
    if (!bytes) return;
    CRUCIBLE_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream_));
    Synchronize();
  }
  void Synchronize() override { CRUCIBLE_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  bool DeviceMemory(double* free_bytes, double* total_bytes, std::string* where) const override {
    size_t free_now = 0, total = 0;
    CRUCIBLE_CUDA_CHECK(cudaMemGetInfo(&free_now, &total));
    *free_bytes = static_cast<double>(free_now), *total_bytes = static_cast<double>(total);
    *where = "GPU " + std::to_string(gpu_) + " (" + gpu_name_ + ")";
    return true;
  }

  void Fill(float* x, size_t n, float value) override { cuda::Fill(stream_, x, n, value); }
  void Add(float* y, const float* x, size_t n) override { cuda::Add(stream_, y, x, n); }

  // Row-major (N,C) is column-major (C,N): out^T (OC,N) = W (OC,C) inp^T, with W^T stored.
  void MatmulForward(float* out, const float* inp, const float* weight, int64_t N, int64_t C,
                     int64_t OC) override {
    Timed timed(*this, kernels::MatmulForwardCost(N, C, OC));
    const void* a = Operand(kSlotBf16A, weight, OC * C);
    const void* b = Operand(kSlotBf16B, inp, N * C);
    gemm_->Multiply(bf16(), true, false, OC, N, C, a, C, b, C, out, OC, 0.0f);
  }
  // dinp^T (C,N) = W^T (C,OC) dout^T (OC,N); dweight^T (C,OC) = inp^T (C,N) dout (N,OC).
  void MatmulBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, int64_t N, int64_t C, int64_t OC, bool accumulate_dinp,
                      bool accumulate_dweight) override {
    Timed timed(*this, kernels::MatmulBackwardCost(N, C, OC, dinp != nullptr));
    const void* d = Operand(kSlotBf16A, dout, N * OC);
    if (dinp) {
      const void* w = Operand(kSlotBf16B, weight, OC * C);
      gemm_->Multiply(bf16(), false, false, C, N, OC, w, C, d, OC, dinp, C,
                      accumulate_dinp ? 1.0f : 0.0f);
    }
    const void* x = Operand(kSlotBf16B, inp, N * C);  // stream order: after the dinp product
    gemm_->Multiply(bf16(), false, true, C, OC, N, x, C, d, OC, dweight, C,
                    accumulate_dweight ? 1.0f : 0.0f);
  }
  void EmbeddingForward(float* out, const int32_t* tokens, const float* table, int64_t N,
                        int64_t C) override {
    Timed timed(*this, kernels::EmbeddingForwardCost(N, C));
    cuda::EmbeddingForward(stream_, out, tokens, table, N, C);
  }
  void EmbeddingBackward(float* dtable, const float* dout, const int32_t* tokens, int64_t N,
                         int64_t C) override {
    Timed timed(*this, kernels::EmbeddingBackwardCost(N, C));
    cuda::EmbeddingBackward(stream_, *this, dtable, dout, tokens, N, C);
  }
  void RmsnormForward(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                      int64_t C, float eps) override {
    Timed timed(*this, kernels::RmsnormForwardCost(N, C));
    cuda::RmsnormForward(stream_, out, rstd, inp, weight, N, C, eps);
  }
  void RmsnormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                       const float* weight, const float* rstd, int64_t N, int64_t C) override {
    Timed timed(*this, kernels::RmsnormBackwardCost(N, C));
    cuda::RmsnormBackward(stream_, *this, dinp, dweight, dout, inp, weight, rstd, N, C);
  }
  void RopeForward(float* x, const float* cos_table, const float* sin_table, int64_t B, int64_t T,
                   int64_t heads, int64_t D) override {
    Timed timed(*this, kernels::RopeCost(false, B, T, heads, D));
    cuda::RopeForward(stream_, x, cos_table, sin_table, B, T, heads, D);
  }
  void RopeBackward(float* dx, const float* cos_table, const float* sin_table, int64_t B, int64_t T,
                    int64_t heads, int64_t D) override {
    Timed timed(*this, kernels::RopeCost(true, B, T, heads, D));
    cuda::RopeBackward(stream_, dx, cos_table, sin_table, B, T, heads, D);
  }
  void AttentionForward(float* out, float* lse, const float* q, const float* k, const float* v,
                        int64_t B, int64_t T, int64_t H, int64_t KV, HeadDims D,
                        const int32_t* positions) override {
    RefusePackedDocuments(positions, name());
    Timed timed(*this, kernels::AttentionForwardCost(B, T, H, KV, D));
    cuda::AttentionForward(stream_, bf16(), out, lse, q, k, v, B, T, H, KV, OneHeadWidth(D));
  }
  void AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                         const float* lse, const float* q, const float* k, const float* v,
                         int64_t B, int64_t T, int64_t H, int64_t KV, HeadDims D,
                         const int32_t* positions) override {
    RefusePackedDocuments(positions, name());
    Timed timed(*this, kernels::AttentionBackwardCost(B, T, H, KV, D));
    cuda::AttentionBackward(stream_, *this, bf16(), dq, dk, dv, dout, out, lse, q, k, v, B, T, H,
                            KV, OneHeadWidth(D));
  }
  void SwigluForward(float* out, const float* gate, const float* up, int64_t N,
                     int64_t F) override {
    Timed timed(*this, kernels::SwigluForwardCost(N, F));
    cuda::SwigluForward(stream_, out, gate, up, N, F);
  }
  void SwigluBackward(float* dgate, float* dup, const float* dout, const float* gate,
                      const float* up, int64_t N, int64_t F) override {
    Timed timed(*this, kernels::SwigluBackwardCost(N, F));
    cuda::SwigluBackward(stream_, dgate, dup, dout, gate, up, N, F);
  }
  void CrossEntropyForward(float* losses, float* lse, const float* logits, const int32_t* targets,
                           int64_t N, int64_t V) override {
    Timed timed(*this, kernels::CrossEntropyForwardCost(N, V));
    cuda::CrossEntropyForward(stream_, losses, lse, logits, targets, N, V);
  }
  void CrossEntropyBackward(float* logits_to_dlogits, const float* lse, const int32_t* targets,
                            int64_t N, int64_t V, float scale, const float* weights) override {
    Timed timed(*this, kernels::CrossEntropyBackwardCost(N, V));
    cuda::CrossEntropyBackward(stream_, logits_to_dlogits, lse, targets, N, V, scale, weights);
  }

 protected:
  // metrics.profile: a kernel is timed on the host between two waits for the stream, so the
  // profile holds the GPU's time of each kernel (launches are serialised while profiling; with
  // the profile off nothing waits).
  class Timed {
   public:
    Timed(CudaBackend& backend, const KernelCost& cost)
        : stream_(KernelProfileEnabled() ? backend.stream_ : nullptr) {
      if (!stream_) return;
      backend.Synchronize();
      timer_.emplace(cost);
    }
    ~Timed() {
      if (!stream_) return;
      cudaStreamSynchronize(stream_);  // an error here is reported by the next checked call
      timer_.reset();
    }

   private:
    cudaStream_t stream_;
    std::optional<ScopedKernelTimer> timer_;
  };

  bool bf16() const { return compute_ == ComputePrecision::kBfloat16; }

  // The operand of a product: `x` itself in fp32, its bf16 copy in `slot` in bf16.
  const void* Operand(int slot, const float* x, int64_t count) {
    if (!bf16()) return x;
    void* copy = Get(slot, static_cast<size_t>(count) * 2);
    ToBfloat16(stream_, copy, x, static_cast<size_t>(count));
    return copy;
  }

  // Workspace: grow-only; the old buffer is freed only after the stream is idle.
  void* Get(int slot, size_t bytes) override {
    auto& [pointer, size] = slots_[slot];
    if (bytes > size) {
      Synchronize();
      Free(pointer);
      pointer = nullptr;
      size = 0;
      pointer = Allocate(bytes);
      size = bytes;
    }
    return pointer;
  }

  cudaStream_t stream() const { return stream_; }

 private:
  ComputePrecision compute_;
  int gpu_;
  std::string gpu_name_;
  int sm_ = 0;
  size_t total_bytes_ = 0;
  cudaStream_t stream_ = nullptr;
  std::vector<std::pair<void*, size_t>> slots_;
  void* gemm_workspace_ = nullptr;
  std::unique_ptr<LtGemm> gemm_;
};

// [debug] portable_exact on the GPU: the kernels of compute/portable/ (portable_launch.h), one
// thread per output element or row, so every kernel gives the CPU portable backend's bits and
// `crucible smoke --portable --device cuda` the CPU's golden. Memory, copies, Fill and Add (one
// IEEE addition per element, as the CPU's) are CudaBackend's; no cuBLASLt. float32 only.
class PortableCudaBackend final : public CudaBackend {
 public:
  explicit PortableCudaBackend(const BackendOptions& options)
      : CudaBackend(RequirePortableFloat32(options), /*with_gemm=*/false) {}

  std::string Summary() const override { return CudaBackend::Summary() + " portable_exact=true"; }

  void MatmulForward(float* out, const float* inp, const float* weight, int64_t N, int64_t C,
                     int64_t OC) override {
    PortableMatmulForward(stream(), out, inp, weight, N, C, OC);
  }
  void MatmulBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, int64_t N, int64_t C, int64_t OC, bool accumulate_dinp,
                      bool accumulate_dweight) override {
    PortableMatmulBackward(stream(), dinp, dweight, dout, inp, weight, N, C, OC, accumulate_dinp,
                           accumulate_dweight);
  }
  void EmbeddingForward(float* out, const int32_t* tokens, const float* table, int64_t N,
                        int64_t C) override {
    PortableEmbeddingForward(stream(), out, tokens, table, N, C);
  }
  void EmbeddingBackward(float* dtable, const float* dout, const int32_t* tokens, int64_t N,
                         int64_t C) override {
    PortableEmbeddingBackward(stream(), dtable, dout, tokens, N, C);
  }
  void RmsnormForward(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                      int64_t C, float eps) override {
    PortableRmsnormForward(stream(), out, rstd, inp, weight, N, C, eps);
  }
  void RmsnormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                       const float* weight, const float* rstd, int64_t N, int64_t C) override {
    PortableRmsnormBackward(stream(), dinp, dweight, dout, inp, weight, rstd, N, C);
  }
  void RopeForward(float* x, const float* cos_table, const float* sin_table, int64_t B, int64_t T,
                   int64_t heads, int64_t D) override {
    PortableRope(stream(), x, cos_table, sin_table, B, T, heads, D, 1.0f);
  }
  void RopeBackward(float* dx, const float* cos_table, const float* sin_table, int64_t B, int64_t T,
                    int64_t heads, int64_t D) override {
    PortableRope(stream(), dx, cos_table, sin_table, B, T, heads, D, -1.0f);
  }
  void AttentionForward(float* out, float* lse, const float* q, const float* k, const float* v,
                        int64_t B, int64_t T, int64_t H, int64_t KV, HeadDims D,
                        const int32_t* positions) override {
    RefusePackedDocuments(positions, name());
    PortableAttentionForward(stream(), out, lse, q, k, v, B, T, H, KV, OneHeadWidth(D));
  }
  void AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                         const float* lse, const float* q, const float* k, const float* v,
                         int64_t B, int64_t T, int64_t H, int64_t KV, HeadDims D,
                         const int32_t* positions) override {
    RefusePackedDocuments(positions, name());
    PortableAttentionBackward(stream(), *this, dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV,
                              OneHeadWidth(D));
  }
  void SwigluForward(float* out, const float* gate, const float* up, int64_t N,
                     int64_t F) override {
    PortableSwigluForward(stream(), out, gate, up, N, F);
  }
  void SwigluBackward(float* dgate, float* dup, const float* dout, const float* gate,
                      const float* up, int64_t N, int64_t F) override {
    PortableSwigluBackward(stream(), dgate, dup, dout, gate, up, N, F);
  }
  void CrossEntropyForward(float* losses, float* lse, const float* logits, const int32_t* targets,
                           int64_t N, int64_t V) override {
    PortableCrossEntropyForward(stream(), losses, lse, logits, targets, N, V);
  }
  void CrossEntropyBackward(float* logits_to_dlogits, const float* lse, const int32_t* targets,
                            int64_t N, int64_t V, float scale, const float* weights) override {
    PortableCrossEntropyBackward(stream(), logits_to_dlogits, lse, targets, N, V, scale, weights);
  }
};

std::unique_ptr<ComputeBackend> BuildCudaBackend(const BackendOptions& options) {
  return MakeCudaBackend(options);
}

BackendRegistrar cuda_registrar("cuda", BuildCudaBackend);

}  // namespace

bool GpuAvailable(std::string* why) {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaSuccess && count > 0) return true;
  if (why) *why = status == cudaSuccess ? "0 devices" : cudaGetErrorString(status);
  cudaGetLastError();
  return false;
}

std::unique_ptr<ComputeBackend> MakeCudaBackend(const BackendOptions& options) {
  if (options.portable_exact) return std::make_unique<PortableCudaBackend>(options);
  return std::make_unique<CudaBackend>(options);
}

}  // namespace crucible::cuda
