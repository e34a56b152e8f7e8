#include "dist/exact_sum.h"

#include <cmath>
#include <cstdint>

#include "common/profile.h"

namespace crucible {

namespace {
constexpr double kScale = 18446744073709551616.0;  // 2^64
constexpr double kInverseScale = 1.0 / 18446744073709551616.0;
constexpr double kLimit = 4611686018427387904.0;  // 2^62
}  // namespace

void ExactAccumulator::Zero() {
  const int64_t n = static_cast<int64_t>(sum_.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) sum_[i] = 0;
}

bool ExactAccumulator::Add(const float* values) {
  ScopedKernelTimer profile_timer("exact_accumulate");
  const int64_t n = static_cast<int64_t>(sum_.size());
  bool ok = true;
#pragma omp parallel for schedule(static) reduction(&& : ok)
  for (int64_t i = 0; i < n; ++i) {
    double v = static_cast<double>(values[i]);
    if (!(std::fabs(v) < kLimit)) {  // also catches NaN
      ok = false;
      continue;
    }
    sum_[i] += static_cast<__int128>(v * kScale);
  }
  return ok;
}

void ExactAccumulator::ToFloat(float* out) const {
  Int128ToFloat(sum_.data(), out, sum_.size());
}

void Int128ToFloat(const __int128* in, float* out, size_t count) {
  const int64_t n = static_cast<int64_t>(count);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    out[i] = static_cast<float>(static_cast<double>(in[i]) * kInverseScale);
}

}  // namespace crucible
