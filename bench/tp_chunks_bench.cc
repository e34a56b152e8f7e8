// What the degree-independent decomposition of tensor parallelism (model/parallelism.h) costs on
// one process: a training micro-batch of a Llama (fused forward and backward, as the trainer
// runs it) with its split dimensions cut into tp_chunks = 1 (today's kernels), 2 and 4 chunks.
// The 4-chunk run is the one whose bits equal 2 and 4 tensor-parallel ranks'; its time over the
// 1-chunk run is the cost of exactness at TP = 1 (issue 28 asks for <= 5% of the `small` step).
// Shapes: `small` (dim 512, 6 layers, 8 heads, 4 KV heads, FFN 1376, vocabulary 8192) at batch 8 x
// seq 256, and `base` (dim 768, 12 layers, 12 heads, 4 KV heads, FFN 2048, vocabulary 32000) at
// batch 4 x seq 256. Repetitions are interleaved by Google Benchmark's
// --benchmark_enable_random_interleaving; read the medians.
//
//   build/tp_chunks_bench --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true
//       --benchmark_report_aggregates_only=true   (one command line)
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/philox.h"
#include "model/model.h"

namespace {

using namespace crucible;

void Step(benchmark::State& state, const char* flavor, int64_t B) {
  constexpr int64_t T = 256;
  const int chunks = static_cast<int>(state.range(0));
  Config config = Config::Defaults();
  config.ApplyOverride(std::string("model.flavor=") + flavor);
  const std::shared_ptr<const ModelSpec> spec = BuildModelSpec(config);
  const std::unique_ptr<Model> model =
      spec->Build(B, T, DefaultCpuBackend(), ModelParallelism::Layout(1, 0, chunks));
  std::vector<float> weights(model->table().total()), grads(weights.size());
  spec->InitWeights(model->table(), 1, 0, weights.size(), weights.data());
  Philox rng(2, 0);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int64_t i = 0; i < B * T; ++i) {
    tokens[i] = static_cast<int32_t>(rng.NextU32() % spec->vocab_size());
    targets[i] = static_cast<int32_t>(rng.NextU32() % spec->vocab_size());
  }
  FlatParameterAccess access(model->table(), weights.data(), grads.data());
  const float scale = 1.0f / static_cast<float>(B * T);
  for (auto _ : state) {
    model->Forward(access, tokens.data(), targets.data(), nullptr, ForwardOptions::Fused(scale));
    model->Backward(access, scale);
    benchmark::DoNotOptimize(grads.data());
  }
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(B * T), benchmark::Counter::kIsIterationInvariantRate);
}

void Small(benchmark::State& state) {
  Step(state, "small", 8);
}
void Base(benchmark::State& state) {
  Step(state, "base", 4);
}

BENCHMARK(Small)->Arg(1)->Arg(2)->Arg(4)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Base)->Arg(1)->Arg(4)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
