#include "train/mfu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

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

}  // namespace
}  // namespace crucible
