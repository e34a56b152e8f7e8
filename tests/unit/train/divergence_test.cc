#include "train/divergence.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <vector>

namespace crucible {
namespace {

TEST(FirstNonFinite, FindsTheFirstNanOrInfWhateverTheThreadCount) {
  const size_t n = 100000;  // several scan blocks
  std::vector<float> values(n, 0.5f);
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    EXPECT_EQ(FirstNonFinite(values.data(), n), n) << threads;
    values[70000] = std::numeric_limits<float>::infinity();
    values[99999] = std::nanf("");
    EXPECT_EQ(FirstNonFinite(values.data(), n), 70000u) << threads;
    values[16385] = -std::numeric_limits<float>::infinity();
    EXPECT_EQ(FirstNonFinite(values.data(), n), 16385u) << threads;
    values[3] = -std::nanf("");
    EXPECT_EQ(FirstNonFinite(values.data(), n), 3u) << threads;
    std::fill(values.begin(), values.end(), 0.5f);
  }
  // The largest finite values and denormals are finite.
  std::vector<float> edge = {std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                             std::numeric_limits<float>::denorm_min(), -0.0f};
  EXPECT_EQ(FirstNonFinite(edge.data(), edge.size()), edge.size());
  EXPECT_EQ(FirstNonFinite(edge.data(), 0), 0u);
}

}  // namespace
}  // namespace crucible
