// The kernels of the `small` flavor at seq_len 512, batch 8 (N = 4096 tokens). The linear layers:
// Crucible's deterministic tiled matmul (kernels/cpu/matmul.cc, on the libraries of
// kernels/cpu/gemm_library.h's table, or GEMM_LIBRARY=openblas|onednn for all) side by side with
// one threaded OpenBLAS sgemm of the same product (the peer, not thread-count deterministic) and
// the native bf16 tiles (kernels/cpu/gemm_bf16.h: Bf16Native* on AVX-512 BF16 CPUs, Bf16Amx* on
// AMX-BF16 CPUs); counters: GFLOP/s. The row
// kernels built on the fixed-order lane reductions (kernels/cpu/lanes.h), and RoPE: RMSNorm,
// cross-entropy over the vocabulary, causal attention (also at batch 2, seq 2048), forward and
// backward. The experts of a mixture (the deepseek_v3 `small` flavor: 16 experts of 352, top-2 of
// 1024 tokens, loads with a CV of about 0.4): their three products forward and backward as one
// call per expert (Experts/0, the loop) and as grouped products (Experts/1,
// kernels::grouped_matmul_*). The decode step's kernels at the `tiny` model's GRPO rollout shapes
// (DecodeMatmulRows, DecodeAttention: kernels/cpu/decode.h).
//
//   [GEMM_LIBRARY=auto|openblas|onednn] build/kernels_bench [--benchmark_filter=...]
//   (OMP_NUM_THREADS sets the threads; GEMM_LIBRARY is [debug] gemm_library's rule)
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/attention_tiles.h"
#include "kernels/cpu/decode.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/gemm_library.h"
#include "kernels/cpu/kernels.h"

namespace {

constexpr int64_t kBatch = 8, kSeqLen = 512, kTokens = kBatch * kSeqLen;
constexpr int64_t kDim = 512, kHeads = 8, kKvHeads = 4, kHeadDim = kDim / kHeads, kVocab = 8192;

struct Shape {
  const char* name;
  int64_t in, out;
};
constexpr Shape kShapes[] = {{"q_o_proj", 512, 512},
                             {"k_v_proj", 512, 256},
                             {"gate_up_proj", 512, 1376},
                             {"down_proj", 1376, 512},
                             {"lm_head", 512, 8192}};

const bool kGemmRuleSet = [] {
  if (const char* rule = std::getenv("GEMM_LIBRARY")) crucible::kernels::SetGemmLibraryRule(rule);
  return true;
}();

std::vector<float> Filled(size_t n, float seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>((i * 2654435761u + 7) % 1000) * 1e-3f - seed;
  return v;
}

using crucible::kernels::Bf16Gemm;

void Forward(benchmark::State& state, bool peer, Bf16Gemm bf16 = Bf16Gemm::kOff) {
  const Shape& s = kShapes[state.range(0)];
  std::vector<float> x = Filled(kTokens * s.in, 0.5f), w = Filled(s.out * s.in, 0.4f);
  std::vector<float> y(kTokens * s.out);
  for (auto _ : state) {
    if (peer)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kTokens, s.out, s.in, 1.0f, x.data(),
                  s.in, w.data(), s.in, 0.0f, y.data(), s.out);
    else
      crucible::kernels::matmul_forward(y.data(), x.data(), w.data(), kTokens, s.in, s.out, bf16);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(s.name);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * kTokens * s.in * s.out * state.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}

void Backward(benchmark::State& state, bool peer, Bf16Gemm bf16 = Bf16Gemm::kOff) {
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
                                         kTokens, s.in, s.out, false, false, bf16);
    }
    benchmark::DoNotOptimize(dw.data());
  }
  state.SetLabel(s.name);
  state.counters["GFLOP/s"] =
      benchmark::Counter(4.0 * kTokens * s.in * s.out * state.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}

// Muon's X X^T on small's matrices (m x n, m <= n: q/o 512 x 512, k/v 256 x 512, the MLP 512 x
// 1376): matmul_gram (the upper tiles, mirrored), the whole tiled product it replaces, and one
// threaded OpenBLAS ssyrk (the peer). Counters: the useful GFLOP/s, 2 m^2 n / s for all three.
constexpr int64_t kGramShapes[][2] = {{512, 512}, {256, 512}, {512, 1376}};
void Gram(benchmark::State& state, int how) {
  const int64_t m = kGramShapes[state.range(0)][0], n = kGramShapes[state.range(0)][1];
  std::vector<float> x = Filled(m * n, 0.5f), a(m * m);
  for (auto _ : state) {
    if (how == 0)
      crucible::kernels::matmul_gram(a.data(), x.data(), m, n);
    else if (how == 1)
      crucible::kernels::matmul_forward(a.data(), x.data(), x.data(), m, n, m);
    else
      cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, m, n, 1.0f, x.data(), n, 0.0f, a.data(),
                  m);
    benchmark::DoNotOptimize(a.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m * m * n * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}
void CrucibleGram(benchmark::State& state) {
  Gram(state, 0);
}
void CrucibleGramAsProduct(benchmark::State& state) {
  Gram(state, 1);
}
void OpenblasSyrk(benchmark::State& state) {
  Gram(state, 2);
}

void CrucibleForward(benchmark::State& state) {
  Forward(state, false);
}
void OpenblasForward(benchmark::State& state) {
  Forward(state, true);
}
void Bf16NativeForward(benchmark::State& state) {
  if (!crucible::kernels::cpu_has_avx512_bf16()) return state.SkipWithError("no AVX-512 BF16");
  Forward(state, false, Bf16Gemm::kAvx512Bf16);
}
void Bf16NativeBackward(benchmark::State& state) {
  if (!crucible::kernels::cpu_has_avx512_bf16()) return state.SkipWithError("no AVX-512 BF16");
  Backward(state, false, Bf16Gemm::kAvx512Bf16);
}
void Bf16AmxForward(benchmark::State& state) {
  if (!crucible::kernels::cpu_has_amx_bf16()) return state.SkipWithError("no AMX-BF16");
  Forward(state, false, Bf16Gemm::kAmx);
}
void Bf16AmxBackward(benchmark::State& state) {
  if (!crucible::kernels::cpu_has_amx_bf16()) return state.SkipWithError("no AMX-BF16");
  Backward(state, false, Bf16Gemm::kAmx);
}
void CrucibleBackward(benchmark::State& state) {
  Backward(state, false);
}
void OpenblasBackward(benchmark::State& state) {
  Backward(state, true);
}

void RmsnormForward(benchmark::State& state) {
  std::vector<float> x = Filled(kTokens * kDim, 0.5f), w = Filled(kDim, 0.4f);
  std::vector<float> y(kTokens * kDim), rstd(kTokens);
  for (auto _ : state) {
    crucible::kernels::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), kTokens, kDim,
                                       1e-5f);
    benchmark::DoNotOptimize(y.data());
  }
}

void RmsnormBackward(benchmark::State& state) {
  std::vector<float> x = Filled(kTokens * kDim, 0.5f), w = Filled(kDim, 0.4f);
  std::vector<float> dy = Filled(kTokens * kDim, 0.3f), y(kTokens * kDim), rstd(kTokens);
  std::vector<float> dx(kTokens * kDim), dw(kDim);
  crucible::kernels::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), kTokens, kDim,
                                     1e-5f);
  for (auto _ : state) {
    crucible::kernels::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(),
                                        rstd.data(), kTokens, kDim);
    benchmark::DoNotOptimize(dx.data());
  }
}

void CrossEntropyForward(benchmark::State& state) {
  std::vector<float> logits = Filled(kTokens * kVocab, 0.5f), losses(kTokens), lse(kTokens);
  std::vector<int32_t> targets(kTokens);
  for (int64_t i = 0; i < kTokens; ++i) targets[i] = static_cast<int32_t>((i * 7919) % kVocab);
  for (auto _ : state) {
    crucible::kernels::cross_entropy_forward(losses.data(), lse.data(), logits.data(),
                                             targets.data(), kTokens, kVocab);
    benchmark::DoNotOptimize(lse.data());
  }
}

void RopeForwardBackward(benchmark::State& state) {
  std::vector<float> cos_table(kSeqLen * kHeadDim / 2), sin_table(kSeqLen * kHeadDim / 2);
  crucible::kernels::rope_tables(cos_table.data(), sin_table.data(), kSeqLen, kHeadDim, 10000.0);
  std::vector<float> q = Filled(kTokens * kDim, 0.5f);
  for (auto _ : state) {
    crucible::kernels::rope_forward(q.data(), cos_table.data(), sin_table.data(), kBatch, kSeqLen,
                                    kHeads, kHeadDim);
    crucible::kernels::rope_backward(q.data(), cos_table.data(), sin_table.data(), kBatch, kSeqLen,
                                     kHeads, kHeadDim);
    benchmark::DoNotOptimize(q.data());
  }
}

// Causal attention at (batch, seq_len) = (state.range(0), state.range(1)), small's heads.
struct AttentionInputs {
  int64_t B, T, N = B * T;
  std::vector<float> q = Filled(N * kDim, 0.5f);
  std::vector<float> k = Filled(N * kKvHeads * kHeadDim, 0.4f);
  std::vector<float> v = Filled(N * kKvHeads * kHeadDim, 0.3f);
  std::vector<float> out = std::vector<float>(N * kDim);
  std::vector<float> lse = std::vector<float>(B * kHeads * T);
  void Forward() {
    crucible::kernels::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T,
                                         kHeads, kKvHeads, kHeadDim);
  }
};

void AttentionForward(benchmark::State& state) {
  AttentionInputs in{state.range(0), state.range(1)};
  for (auto _ : state) {
    in.Forward();
    benchmark::DoNotOptimize(in.out.data());
  }
}

void AttentionBackward(benchmark::State& state) {
  AttentionInputs in{state.range(0), state.range(1)};
  in.Forward();
  std::vector<float> dout = Filled(in.N * kDim, 0.2f), dq(in.q.size()), dk(in.k.size()),
                     dv(in.v.size());
  for (auto _ : state) {
    crucible::kernels::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(),
                                          in.out.data(), in.lse.data(), in.q.data(), in.k.data(),
                                          in.v.data(), in.B, in.T, kHeads, kKvHeads, kHeadDim);
    benchmark::DoNotOptimize(dq.data());
  }
}

// One 64 x 64 x 64 product of attention's tiles, operands in L1 (the scores S = Q K^T of
// attention.cc): arg 0 = tile_product with K packed transposed (the CPU's path), 1 = OpenBLAS
// sgemm reading K in place (what the tiles used before), 2 = tile_product on the AVX2 path.
// Items = flops.
void AttentionTileProduct(benchmark::State& state) {
  constexpr int64_t n = 64;
  std::vector<float> q = Filled(n * n, 0.5f), k = Filled(n * n, 0.4f), k_t(n * n), s(n * n);
  crucible::kernels::transpose_tile(k.data(), n, n, n, k_t.data(), n);
  const crucible::kernels::TileIsa isa = crucible::kernels::tile_isa();
  if (state.range(0) == 2) crucible::kernels::set_tile_isa(crucible::kernels::TileIsa::kAvx2);
  for (auto _ : state) {
    if (state.range(0) != 1)
      crucible::kernels::tile_product(
          {q.data(), n, 1, k_t.data(), n, s.data(), n, n, n, n, false, 0.125f});
    else
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 0.125f, q.data(), n, k.data(),
                  n, 0.0f, s.data(), n);
    benchmark::DoNotOptimize(s.data());
  }
  crucible::kernels::set_tile_isa(isa);
  state.SetItemsProcessed(state.iterations() * 2 * n * n * n);
}

// The decode step's kernels (kernels/cpu/decode.h) at the shapes of `crucible grpo`'s rollouts
// (the `tiny` model, 64 completions a step): matmul_rows with args {C, OC, weight type 0 f32 /
// 1 bf16, path 0 tile_isa() / 1 AVX2}, e.g. {256, 688} (gate, up) and {688, 256} (down), N = 64;
// items = multiply-adds.
void DecodeMatmulRows(benchmark::State& state) {
  constexpr int64_t N = 64;
  const int64_t C = state.range(0), OC = state.range(1);
  const std::vector<float> inp = Filled(N * C, 0.5f), weight = Filled(OC * C, 0.4f);
  std::vector<uint16_t> bf16(weight.size());
  for (size_t i = 0; i < weight.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &weight[i], 4);
    bf16[i] = static_cast<uint16_t>(bits >> 16);
  }
  const crucible::RowWeights rows =
      state.range(2) == 0 ? crucible::RowWeights(weight.data())
                          : crucible::RowWeights(bf16.data(), crucible::WeightType::kBF16);
  std::vector<float> out(N * OC);
  const crucible::kernels::TileIsa isa = crucible::kernels::tile_isa();
  if (state.range(3) == 1) crucible::kernels::set_tile_isa(crucible::kernels::TileIsa::kAvx2);
  for (auto _ : state) {
    crucible::kernels::matmul_rows(out.data(), inp.data(), rows, N, C, OC);
    benchmark::DoNotOptimize(out.data());
  }
  crucible::kernels::set_tile_isa(isa);
  state.SetItemsProcessed(state.iterations() * N * C * OC);
}

// decode_attention for N = 64 sequences of `length` cached positions (arg 0), H = 8 query heads
// on KV = 4, D = 32 (the `tiny` model); arg 1: path 0 tile_isa() / 1 AVX2. Items = rows x heads.
void DecodeAttention(benchmark::State& state) {
  constexpr int64_t N = 64, H = 8, KV = 4, D = 32, kMaxLen = 256;
  const int64_t length = state.range(0);
  const std::vector<float> q = Filled(N * H * D, 0.5f);
  std::vector<std::vector<float>> k_cache, v_cache;
  std::vector<const float*> keys, values;
  for (int64_t i = 0; i < N; ++i) {
    k_cache.push_back(Filled(kMaxLen * KV * D, 0.4f + 1e-3f * static_cast<float>(i)));
    v_cache.push_back(Filled(kMaxLen * KV * D, 0.3f + 1e-3f * static_cast<float>(i)));
    keys.push_back(k_cache.back().data());
    values.push_back(v_cache.back().data());
  }
  const std::vector<int64_t> lengths(N, length);
  std::vector<float> out(N * H * D);
  const crucible::kernels::TileIsa isa = crucible::kernels::tile_isa();
  if (state.range(1) == 1) crucible::kernels::set_tile_isa(crucible::kernels::TileIsa::kAvx2);
  for (auto _ : state) {
    crucible::kernels::decode_attention(out.data(), q.data(), keys.data(), values.data(),
                                        lengths.data(), N, H, KV, D);
    benchmark::DoNotOptimize(out.data());
  }
  crucible::kernels::set_tile_isa(isa);
  state.SetItemsProcessed(state.iterations() * N * H);
}

// The experts' gate, up and down products, forward and backward (SwiGLU left out: the same in
// both), for every expert: grouped (one call per product) or a loop of per-expert calls.
void Experts(benchmark::State& state) {
  constexpr int64_t E = 16, Fm = 352, C = kDim, rows = 2 * 1024;
  std::vector<int64_t> begin = {0};
  double total = 0;
  std::vector<double> share(E);
  for (int64_t e = 0; e < E; ++e) total += share[e] = 1.0 + 0.55 * std::sin(2.4 * e);
  for (int64_t e = 0; e < E; ++e)
    begin.push_back(e + 1 == E ? rows
                               : begin.back() + static_cast<int64_t>(rows * share[e] / total));
  std::vector<float> x = Filled(rows * C, 0.5f), w = Filled(E * 3 * Fm * C, 0.4f);
  std::vector<float> dw(E * 3 * Fm * C), gate(rows * Fm), up(rows * Fm), out(rows * C);
  std::vector<float> dx(rows * C), dh(rows * Fm), dy = Filled(rows * C, 0.3f);
  std::vector<const float*> wg(E), wu(E), wd(E);
  std::vector<float*> gg(E), gu(E), gd(E);
  for (int64_t e = 0; e < E; ++e) {
    wg[e] = w.data() + e * 3 * Fm * C, wu[e] = wg[e] + Fm * C, wd[e] = wg[e] + 2 * Fm * C;
    gg[e] = dw.data() + e * 3 * Fm * C, gu[e] = gg[e] + Fm * C, gd[e] = gg[e] + 2 * Fm * C;
  }
  namespace k = crucible::kernels;
  const bool grouped = state.range(0) == 1;
  for (auto _ : state) {
    if (grouped) {
      k::grouped_matmul_forward(gate.data(), x.data(), wg.data(), begin.data(), E, C, Fm);
      k::grouped_matmul_forward(up.data(), x.data(), wu.data(), begin.data(), E, C, Fm);
      k::grouped_matmul_forward(out.data(), gate.data(), wd.data(), begin.data(), E, Fm, C);
      k::grouped_matmul_backward(dh.data(), gd.data(), dy.data(), gate.data(), wd.data(),
                                 begin.data(), E, Fm, C, false);
      k::grouped_matmul_backward(dx.data(), gg.data(), dh.data(), x.data(), wg.data(), begin.data(),
                                 E, C, Fm, false);
      k::grouped_matmul_backward(dx.data(), gu.data(), dh.data(), x.data(), wu.data(), begin.data(),
                                 E, C, Fm, true);
    } else {
      for (int64_t e = 0; e < E; ++e) {
        const int64_t r0 = begin[e], n = begin[e + 1] - r0;
        k::matmul_forward(gate.data() + r0 * Fm, x.data() + r0 * C, wg[e], n, C, Fm);
        k::matmul_forward(up.data() + r0 * Fm, x.data() + r0 * C, wu[e], n, C, Fm);
      }
      for (int64_t e = 0; e < E; ++e) {
        const int64_t r0 = begin[e], n = begin[e + 1] - r0;
        k::matmul_forward(out.data() + r0 * C, gate.data() + r0 * Fm, wd[e], n, Fm, C);
      }
      for (int64_t e = 0; e < E; ++e) {
        const int64_t r0 = begin[e], n = begin[e + 1] - r0;
        k::matmul_backward(dh.data() + r0 * Fm, gd[e], dy.data() + r0 * C, gate.data() + r0 * Fm,
                           wd[e], n, Fm, C, false, false);
      }
      for (int64_t e = 0; e < E; ++e) {
        const int64_t r0 = begin[e], n = begin[e + 1] - r0;
        k::matmul_backward(dx.data() + r0 * C, gg[e], dh.data() + r0 * Fm, x.data() + r0 * C, wg[e],
                           n, C, Fm, false, false);
        k::matmul_backward(dx.data() + r0 * C, gu[e], dh.data() + r0 * Fm, x.data() + r0 * C, wu[e],
                           n, C, Fm, true, false);
      }
    }
    benchmark::DoNotOptimize(dw.data());
  }
  state.SetLabel(grouped ? "grouped" : "loop");
  state.counters["GFLOP/s"] =
      benchmark::Counter(3.0 * 6.0 * rows * C * Fm * state.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}

}  // namespace

BENCHMARK(Experts)->DenseRange(0, 1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(AttentionTileProduct)->DenseRange(0, 2);
BENCHMARK(DecodeMatmulRows)
    ->Args({256, 688, 0, 0})
    ->Args({688, 256, 0, 0})
    ->Args({256, 320, 0, 0})
    ->Args({256, 688, 1, 0})
    ->Args({256, 688, 0, 1})
    ->Args({688, 256, 0, 1})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(DecodeAttention)
    ->Args({100, 0})
    ->Args({100, 1})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(RmsnormForward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(RmsnormBackward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(CrossEntropyForward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(RopeForwardBackward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(AttentionForward)
    ->Args({kBatch, kSeqLen})
    ->Args({2, 2048})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(AttentionBackward)
    ->Args({kBatch, kSeqLen})
    ->Args({2, 2048})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(CrucibleForward)->DenseRange(0, 4)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(OpenblasForward)->DenseRange(0, 4)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Bf16NativeForward)->DenseRange(0, 4)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Bf16NativeBackward)->DenseRange(0, 4)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Bf16AmxForward)->DenseRange(0, 4)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Bf16AmxBackward)->DenseRange(0, 4)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(CrucibleBackward)->DenseRange(0, 4)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(OpenblasBackward)->DenseRange(0, 4)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK(CrucibleGram)->DenseRange(0, 2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(CrucibleGramAsProduct)->DenseRange(0, 2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(OpenblasSyrk)->DenseRange(0, 2)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
