// Helpers of the kernel tests: seeded inputs, and the check of the promise every CPU kernel makes
// (kernels/cpu/kernels.h): the same bits for any OpenMP thread count.
#pragma once

#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <functional>
#include <vector>

#include "common/philox.h"

namespace crucible::kernels::testing {

// n normal values times `scale`, a pure function of the seed.
inline std::vector<float> Random(size_t n, uint64_t seed, float scale = 1.0f) {
  Philox rng(seed, 0);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.NextNormal()) * scale;
  return v;
}

// How many threads a parallel region started here runs on. OpenMP may give fewer than
// omp_set_num_threads asked for (OMP_THREAD_LIMIT, dynamic adjustment, a region nested in
// another).
inline int ThreadsOfAParallelRegion() {
  int team = 0;
#pragma omp parallel
  {
#pragma omp single
    team = omp_get_num_threads();
  }
  return team;
}

// Runs f with 1 thread, then with 2, 3 and 4, and expects the same bytes from every run. Before
// each run it checks that a parallel region really gets that many threads (dynamic adjustment is
// turned off for the call): a comparison of single-threaded runs would prove nothing, so the
// check fails where OpenMP keeps the kernels on one thread. The thread settings are restored.
inline void ExpectThreadIndependent(const std::function<std::vector<float>()>& f) {
  struct Restore {
    int threads = omp_get_max_threads();
    int dynamic = omp_get_dynamic();
    ~Restore() {
      omp_set_num_threads(threads);
      omp_set_dynamic(dynamic);
    }
  } restore;
  omp_set_dynamic(0);
  std::vector<float> reference;
  for (int threads : {1, 2, 3, 4}) {
    omp_set_num_threads(threads);
    ASSERT_EQ(ThreadsOfAParallelRegion(), threads)
        << "OpenMP runs a parallel region on fewer threads than the " << threads
        << " asked for (OMP_THREAD_LIMIT?): thread independence cannot be checked";
    std::vector<float> got = f();
    if (threads == 1) {
      reference = std::move(got);
      continue;
    }
    ASSERT_EQ(got.size(), reference.size());
    EXPECT_EQ(std::memcmp(got.data(), reference.data(), got.size() * sizeof(float)), 0)
        << "differs with " << threads << " threads";
  }
}

}  // namespace crucible::kernels::testing
