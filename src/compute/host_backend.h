// The memory half of a backend whose device memory is the host's (the CPU backend, the portable
// one): 64-byte aligned zeroed allocations, copies that are memcpy (or nothing when both sides
// are one pointer), nothing to wait for. A host backend derives from it and adds its kernels.
#pragma once

#include <sys/mman.h>

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
    // From 2 MiB on: 2 MiB aligned, and asked for transparent huge pages before the first touch
    // (where the kernel's THP setting is "madvise", as on Debian; a hint, ignored where THP is
    // off). A stream through weights or activations then crosses a page, and takes a TLB miss,
    // every 2 MiB instead of every 4 KiB, and the hardware prefetcher, which stops at page
    // boundaries, runs on: a batch-1 decode step, which only streams weights, read 29-41 GB/s in
    // 4 KiB pages and 44-60 GB/s in huge pages on the 2-core AMD EPYC this was measured on.
    constexpr size_t kHuge = size_t{2} << 20;
    const size_t align = bytes >= kHuge ? kHuge : 64;
    const size_t rounded = (bytes + align - 1) / align * align;
    void* pointer = std::aligned_alloc(align, rounded);
    if (!pointer) throw std::bad_alloc();
    if (align == kHuge) madvise(pointer, rounded, MADV_HUGEPAGE);
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
