// test_gpu's main: without a usable CUDA GPU every test is skipped in one line and the binary
// exits 0 (so `make test` and CI run it everywhere); with one, GoogleTest runs them all.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "compute/cuda/cuda_backend.h"

int main(int argc, char** argv) {
  std::string why;
  if (!crucible::cuda::GpuAvailable(&why)) {
    std::printf("no CUDA GPU: skipped (cudaGetDeviceCount: %s)\n", why.c_str());
    return 0;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
