// Helpers of the GPU tests: the cuda backends (fp32, bf16) beside the CPU oracle, random inputs,
// uploads and downloads, and comparisons that name the kernel, the element and both values.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/bfloat16.h"
#include "common/philox.h"
#include "compute/backend.h"

namespace crucible::gpu_test {

inline std::vector<float> Random(size_t n, uint64_t seed, float scale = 1.0f) {
  Philox rng(seed, 0);
  std::vector<float> x(n);
  for (auto& value : x)
    value = scale * (static_cast<float>(rng.NextU32() >> 8) / 8388608.0f - 1.0f);  // [-s, s)
  return x;
}

inline std::vector<float> RoundedToBfloat16(std::vector<float> x) {
  for (auto& value : x) value = RoundToBfloat16(value);
  return x;
}

template <typename T>
DeviceArray<T> Upload(ComputeBackend& backend, const std::vector<T>& host) {
  DeviceArray<T> device(backend, host.size());
  if (!host.empty()) device.CopyFrom(host.data(), host.size());
  return device;
}

inline std::vector<float> Download(const DeviceArray<float>& device) {
  std::vector<float> host(device.size());
  if (!host.empty()) device.CopyTo(host.data(), host.size());
  return host;
}

// |got - want| <= atol + rtol |want| everywhere; the failure names the worst element.
inline void ExpectClose(const std::string& what, const std::vector<float>& got,
                        const std::vector<float>& want, double atol, double rtol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  size_t worst_index = 0;
  bool bad = false;
  for (size_t i = 0; i < got.size(); ++i) {
    double error = std::fabs(static_cast<double>(got[i]) - want[i]);
    double allowed = atol + rtol * std::fabs(static_cast<double>(want[i]));
    if (!(error <= allowed)) bad = true;
    if (!(error <= worst)) {
      worst = error;
      worst_index = i;
    }
  }
  EXPECT_FALSE(bad) << what << ": element " << worst_index << " is " << got[worst_index]
                    << ", the CPU gives " << want[worst_index] << " (error " << worst
                    << ", allowed " << atol << " + " << rtol << " |want|)";
}

inline void ExpectSameBits(const std::string& what, const std::vector<float>& a,
                           const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << ": run to run, element " << i << " is " << a[i] << " then " << b[i];
      return;
    }
}

// Every element of `got` (the GPU) has the bits of `want` (the CPU); the failure names the first
// element that does not.
inline void ExpectBitIdentical(const std::string& what, const std::vector<float>& got,
                               const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << " on the GPU, " << want[i]
                    << " on the CPU (not the same bits)";
      return;
    }
}

inline std::shared_ptr<ComputeBackend> Cuda(ComputePrecision compute) {
  BackendOptions options;
  options.device = "cuda";
  options.compute = compute;
  return MakeBackend(options);
}

}  // namespace crucible::gpu_test
