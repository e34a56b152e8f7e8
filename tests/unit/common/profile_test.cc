// The kernel profile (common/profile.h): totals per kernel name, and the printed line.
#include "common/profile.h"

#include <gtest/gtest.h>

namespace crucible {
namespace {

TEST(KernelProfile, AddsTimeFlopsBytesAndCallsPerKernelAndPrintsRatesAgainstTheCeiling) {
  EnableKernelProfile(true);
  AddKernelTime("test_gemm", 0.5, 50e9, 2e9);
  AddKernelTime("test_gemm", 0.5, 50e9, 2e9);
  AddKernelTime("test_copy", 0.25, 0, 1e9);
  { ScopedKernelTimer timer("test_scoped", 1e6, 4e6); }
  const std::vector<KernelTotals> totals = KernelProfileTotals();
  auto find = [&](const std::string& name) {
    for (const KernelTotals& t : totals)
      if (t.name == name) return t;
    return KernelTotals{};
  };
  const KernelTotals gemm = find("test_gemm");
  EXPECT_EQ(gemm.calls, 2);
  EXPECT_DOUBLE_EQ(gemm.seconds, 1.0);
  EXPECT_DOUBLE_EQ(gemm.flops, 100e9);
  EXPECT_DOUBLE_EQ(gemm.bytes, 4e9);
  EXPECT_EQ(find("test_scoped").calls, 1);
  EXPECT_DOUBLE_EQ(find("test_scoped").flops, 1e6);
  testing::internal::CaptureStdout();
  PrintKernelProfile(200);
  const std::string out = testing::internal::GetCapturedStdout();
  // 100 GFLOP in 1 s against a 200 GFLOP/s ceiling; 4 GB in 1 s.
  EXPECT_NE(out.find("kernel=test_gemm seconds=1.000 "), std::string::npos) << out;
  EXPECT_NE(out.find(" calls=2 gflop=100.00 gflops=100.0 of_ceiling=50.0 gbytes=4.00 "
                     "gbytes_per_s=4.0\n"),
            std::string::npos)
      << out;
  // No flops: no rate, no share of the ceiling.
  EXPECT_NE(out.find("kernel=test_copy seconds=0.250 share="), std::string::npos) << out;
  EXPECT_EQ(out.find("kernel=test_copy seconds=0.250 share=20.0 calls=1 gflop"), std::string::npos)
      << out;
  EnableKernelProfile(false);
}

}  // namespace
}  // namespace crucible
