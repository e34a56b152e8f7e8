// The linear layers of the `small` flavor at seq_len 512, batch 8 (N = 4096 tokens): Crucible's
// deterministic tiled matmul (kernels/cpu/matmul.cc) side by side with one threaded OpenBLAS
// sgemm of the same product (the peer, not thread-count deterministic). Counters: GFLOP/s.
//
//   build/kernels_bench [--benchmark_filter=...]     (OMP_NUM_THREADS sets the threads)
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <vector>

#include "kernels/cpu/kernels.h"

namespace {

constexpr int64_t kTokens = 4096;

struct Shape {
  const char* name;
  int64_t in, out;
};
constexpr Shape kShapes[] = {{"q_o_proj", 512, 512},
                             {"k_v_proj", 512, 256},
                             {"gate_up_proj", 512, 1376},
                             {"down_proj", 1376, 512},
                             {"lm_head", 512, 8192}};

std::vector<float> Filled(size_t n, float seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>((i * 2654435761u + 7) % 1000) * 1e-3f - seed;
  return v;
}

void Forward(benchmark::State& state, bool peer) {
  const Shape& s = kShapes[state.range(0)];
  std::vector<float> x = Filled(kTokens * s.in, 0.5f), w = Filled(s.out * s.in, 0.4f);
  std::vector<float> y(kTokens * s.out);
  for (auto _ : state) {
    if (peer)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kTokens, s.out, s.in, 1.0f, x.data(),
                  s.in, w.data(), s.in, 0.0f, y.data(), s.out);
    else
      crucible::kernels::matmul_forward(y.data(), x.data(), w.data(), kTokens, s.in, s.out);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(s.name);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * kTokens * s.in * s.out * state.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}

void Backward(benchmark::State& state, bool peer) {
  const Shape& s = kShapes[state.range(0)];
  std::vector<float> x = Filled(kTokens * s.in, 0.5f), w = Filled(s.out * s.in, 0.4f);
  std::vector<float> dy = Filled(kTokens * s.out, 0.3f), dx(kTokens * s.in), dw(s.out * s.in);
  for (auto _ : state) {
    if (peer) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, kTokens, s.in, s.out, 1.0f, dy.data(),
                  s.out, w.data(), s.in, 0.0f, dx.data(), s.in);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, s.out, s.in, kTokens, 1.0f, dy.data(),
                  s.out, x.data(), s.in, 0.0f, dw.data(), s.in);
    } else {
      crucible::kernels::matmul_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(),
                                         kTokens, s.in, s.out, false, false);
    }
    benchmark::DoNotOptimize(dw.data());
  }
  state.SetLabel(s.name);
  state.counters["GFLOP/s"] =
      benchmark::Counter(4.0 * kTokens * s.in * s.out * state.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}

void CrucibleForward(benchmark::State& state) {
  Forward(state, false);
}
void OpenblasForward(benchmark::State& state) {
  Forward(state, true);
}
void CrucibleBackward(benchmark::State& state) {
  Backward(state, false);
}
void OpenblasBackward(benchmark::State& state) {
  Backward(state, true);
}

}  // namespace

BENCHMARK(CrucibleForward)->DenseRange(0, 4)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(OpenblasForward)->DenseRange(0, 4)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(CrucibleBackward)->DenseRange(0, 4)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(OpenblasBackward)->DenseRange(0, 4)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
