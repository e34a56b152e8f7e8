// The memory half of a backend whose device memory is the host's (the CPU backend, the portable
// one): 64-byte aligned zeroed allocations, copies that are memcpy (or nothing when both sides
// are one pointer), nothing to wait for. A host backend derives from it and adds its kernels.
#pragma once

#include <cstdlib>
#include <cstring>
#include <new>

#include "compute/backend.h"

namespace crucible {

class HostMemoryBackend : public ComputeBackend {
 public:
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
};

}  // namespace crucible
