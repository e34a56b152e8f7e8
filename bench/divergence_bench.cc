// The cost of the divergence guard's per-step weight check (train/divergence.h): the scan for a
// non-finite value over the `small` flavor's 25,795,072 weights (a rank checks the part it
// updated: all of them on one rank). Counter: GB/s scanned.
//
//   build/divergence_bench     (OMP_NUM_THREADS sets the threads)
#include <benchmark/benchmark.h>

#include <vector>

#include "train/divergence.h"

namespace {

void BM_FirstNonFiniteSmallFlavor(benchmark::State& state) {
  const size_t n = 25795072;
  std::vector<float> weights(n);
  for (size_t i = 0; i < n; ++i) weights[i] = static_cast<float>(i % 1000) * 1e-3f - 0.5f;
  for (auto _ : state) benchmark::DoNotOptimize(crucible::FirstNonFinite(weights.data(), n));
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(n * sizeof(float)) * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_FirstNonFiniteSmallFlavor)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
