// The output head and cross-entropy of one training micro-batch, as LlamaModel runs them
// (model/llama.cc FusedHead), over chunks of `rows` token rows: per chunk the head product into a
// rows x V scratch, the cross-entropy forward and backward in place, d(final norm) rows and the
// head's weight gradient accumulated chunk by chunk. rows = N is the unchunked head (the whole
// (N, V) logits). Shapes: `small` (C 512, V 8192) and `base` (C 768, V 32000) at N = 4096 rows
// (batch 8 x seq 512, batch 4 x seq 1024). Counters: GFLOP/s of the three products, the chunk's
// logits in MiB.
//
//   OMP_NUM_THREADS=1 build/fused_head_bench [--benchmark_filter=...]
// (CPU time is the main thread's: read it at one thread on a shared machine.)
#include <benchmark/benchmark.h>

#include <algorithm>
#include <vector>

#include "compute/backend.h"

namespace {

using crucible::ComputeBackend;

constexpr int64_t kRows = 4096;

void Head(benchmark::State& state, int64_t C, int64_t V) {
  const int64_t rows = state.range(0), N = kRows;
  ComputeBackend& be = *crucible::DefaultCpuBackend();
  std::vector<float> lnf(N * C), head(V * C), dln(N * C), dhead(V * C), chunk(rows * V);
  std::vector<float> losses(N), lse(N);
  std::vector<int32_t> targets(N);
  for (int64_t i = 0; i < N * C; ++i) lnf[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-3f;
  for (int64_t i = 0; i < V * C; ++i)
    head[i] = static_cast<float>((i * 40503u + 7) % 1000) * 2e-5f - 0.01f;
  for (int64_t i = 0; i < N; ++i) targets[i] = static_cast<int32_t>((i * 7919) % V);
  for (auto _ : state) {
    for (int64_t r = 0; r < N; r += rows) {
      const int64_t n = std::min(rows, N - r);
      be.MatmulForward(chunk.data(), lnf.data() + r * C, head.data(), n, C, V);
      be.CrossEntropyForward(losses.data() + r, lse.data() + r, chunk.data(), targets.data() + r, n,
                             V);
      be.CrossEntropyBackward(chunk.data(), lse.data() + r, targets.data() + r, n, V,
                              1.0f / static_cast<float>(N), nullptr);
      be.MatmulBackward(dln.data() + r * C, dhead.data(), chunk.data(), lnf.data() + r * C,
                        head.data(), n, C, V, false, r > 0);
    }
    benchmark::DoNotOptimize(dhead.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(6.0 * N * C * V * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["chunk_MiB"] = 4.0 * rows * V / (1 << 20);
}

void SmallHead(benchmark::State& state) {
  Head(state, 512, 8192);
}
void BaseHead(benchmark::State& state) {
  Head(state, 768, 32000);
}

}  // namespace

BENCHMARK(SmallHead)->Arg(128)->Arg(256)->Arg(512)->Arg(1024)->Arg(kRows)->Unit(
    benchmark::kMillisecond);
BENCHMARK(BaseHead)->Arg(128)->Arg(256)->Arg(512)->Arg(kRows)->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
