#include "train/mfu.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "compute/backend.h"
#include "support/tiny_training.h"

namespace crucible {
namespace {

TEST(MfuMeter, IsTheAchievedShareOfThePeak) {
  MfuMeter meter({100.0, "config"}, 1e6);  // 100 GFLOP/s, 1 MFLOP per token
  EXPECT_DOUBLE_EQ(meter.Percent(50000, 1), 50.0);
  EXPECT_DOUBLE_EQ(meter.Percent(100000, 2), 100.0);  // exactly the peak is possible
}

TEST(MfuMeter, AnAchievedRateAboveThePeakStopsReportingAndWarnsOnce) {
  MfuMeter meter({10.0, "measured"}, 1e6);
  EXPECT_DOUBLE_EQ(meter.Percent(5000, 1), 50.0);
  testing::internal::CaptureStderr();
  EXPECT_TRUE(std::isnan(meter.Percent(20000, 2)));  // 20 GFLOP/s from a 10 GFLOP/s peak
  EXPECT_TRUE(std::isnan(meter.Percent(5000, 3)));   // the peak is known wrong from now on
  EXPECT_TRUE(std::isnan(meter.Percent(30000, 4)));
  const std::string warnings = testing::internal::GetCapturedStderr();
  EXPECT_EQ(std::count(warnings.begin(), warnings.end(), '\n'), 1) << warnings;  // one warning
  EXPECT_NE(warnings.find("step 2: "), std::string::npos) << warnings;
  EXPECT_NE(warnings.find("20 GFLOP/s"), std::string::npos) << warnings;
  EXPECT_NE(warnings.find("peak_source=measured"), std::string::npos) << warnings;
  EXPECT_NE(warnings.find("metrics.peak_gflops"), std::string::npos) << warnings;
}

// bf16 compute runs its own products (on AMX at 3x the fp32 ceiling), so its ceiling is theirs,
// measured through the backend and cached apart from the fp32 one: before, a bf16 run was held
// to the fp32 ceiling, and on AMX every step read as faster than the peak (mfu=nan).
TEST(PeakFlops, ABf16RunsCeilingIsItsBackendsOwnProductsCachedApartFromFp32) {
  const std::string dir = "/tmp/crucible-peak-flops-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  const char* old = std::getenv("CRUCIBLE_CACHE");
  const std::string saved = old ? old : "";
  setenv("CRUCIBLE_CACHE", dir.c_str(), 1);
  Config config = test_support::TinyTrainingConfig("/tmp/unused", 1);
  config.ApplyOverride("metrics.peak_gflops=0");  // measure (the tiny config sets a peak)
  const std::unique_ptr<Communicator> comm = Communicator::OneRank();
  const std::vector<GemmShape> shapes = {{64, 64, 96}};
  BackendOptions bf16_options;
  bf16_options.compute = ComputePrecision::kBfloat16;
  const auto fp32 = DefaultCpuBackend();
  const auto bf16 = MakeBackend(bf16_options);
  EXPECT_EQ(ResolvePeakFlops(config, *comm, shapes, *fp32).source, "measured");
  EXPECT_EQ(ResolvePeakFlops(config, *comm, shapes, *fp32).source, "cached");
  const PeakFlops measured = ResolvePeakFlops(config, *comm, shapes, *bf16);
  EXPECT_EQ(measured.source, "measured");  // not the fp32 entry
  const PeakFlops cached = ResolvePeakFlops(config, *comm, shapes, *bf16);
  EXPECT_EQ(cached.source, "cached");
  EXPECT_EQ(cached.gflops, measured.gflops);
  const nlohmann::json cache = nlohmann::json::parse(ReadFile(dir + "/gemm-ceiling.json"));
  ASSERT_EQ(cache.size(), 2u) << cache.dump();
  const std::string bf16_key = GemmCeilingKey(1, shapes, bf16.get());
  EXPECT_TRUE(cache.contains(bf16_key)) << cache.dump();
  EXPECT_NE(bf16_key.find(";backend=" + bf16->Summary()), std::string::npos) << bf16_key;
  EXPECT_TRUE(cache.contains(GemmCeilingKey(1, shapes))) << cache.dump();
  if (old)
    setenv("CRUCIBLE_CACHE", saved.c_str(), 1);
  else
    unsetenv("CRUCIBLE_CACHE");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace crucible
