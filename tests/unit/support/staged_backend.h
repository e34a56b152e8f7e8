// A test backend: the CPU backend behind a wall. Its memory is its own (host_memory() is false,
// so a model copies weights in and gradients out as it would for a GPU) and every kernel checks,
// with a GoogleTest assertion, that each pointer it is given lies inside one of its allocations
// before it runs the CPU kernel. It can also report a device memory size, for the device memory
// check.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "compute/backend.h"

namespace crucible {

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
                        int64_t B, int64_t T, int64_t H, int64_t KV, HeadDims D,
                        const int32_t* positions) override {
    Check(out, 4 * B * T * H * D.v), Check(lse, 4 * B * H * T), Check(q, 4 * B * T * H * D.qk);
    Check(k, 4 * B * T * KV * D.qk), Check(v, 4 * B * T * KV * D.v);
    cpu_->AttentionForward(out, lse, q, k, v, B, T, H, KV, D, positions);
  }
  void AttentionBackward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                         const float* lse, const float* q, const float* k, const float* v,
                         int64_t B, int64_t T, int64_t H, int64_t KV, HeadDims D,
                         const int32_t* positions) override {
    Check(dq, 4 * B * T * H * D.qk), Check(dk, 4 * B * T * KV * D.qk);
    Check(dv, 4 * B * T * KV * D.v), Check(dout, 4 * B * T * H * D.v);
    Check(out, 4 * B * T * H * D.v), Check(lse, 4 * B * H * T), Check(q, 4 * B * T * H * D.qk);
    Check(k, 4 * B * T * KV * D.qk), Check(v, 4 * B * T * KV * D.v);
    cpu_->AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, D, positions);
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
  // What DeviceMemory reports; by default nothing (as if its memory were the host's).
  void ReportDeviceMemory(double free_bytes, double total_bytes) {
    report_memory_ = true, free_ = free_bytes, total_ = total_bytes;
  }
  bool DeviceMemory(double* free_bytes, double* total_bytes, std::string* where) const override {
    if (!report_memory_) return false;
    *free_bytes = free_, *total_bytes = total_, *where = "staged device 0";
    return true;
  }

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
  bool report_memory_ = false;
  double free_ = 0, total_ = 0;
};

}  // namespace crucible
