// kernels/cpu/decode.h: the decode step's products give every element the bits of one lanes.h
// dot product, whatever the batch around its row; decode attention gives the bits of its scalar
// definition. Both on the AVX2 path and, where the CPU has it, the AVX-512 path (tile_isa()).
#include "kernels/cpu/decode.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "kernels/cpu/attention_tiles.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/lanes.h"
#include "kernels/cpu/vec_math.h"

namespace crucible::kernels {
namespace {

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

TEST(MatmulRows, EveryElementIsTheLaneDotOfItsRowForAnyBatchAndWidth) {
  const int64_t OC = 7;
  for (int64_t C : {1, 15, 16, 33, 100}) {
    const std::vector<float> weight = Random(static_cast<size_t>(OC * C), 1);
    for (int64_t N = 1; N <= 9; ++N) {
      const std::vector<float> inp =
          Random(static_cast<size_t>(N * C), 2 + static_cast<uint32_t>(N));
      std::vector<float> out(static_cast<size_t>(N * OC));
      matmul_rows(out.data(), inp.data(), weight.data(), N, C, OC);
      for (int64_t i = 0; i < N; ++i) {
        std::vector<float> alone(static_cast<size_t>(OC));
        matmul_rows(alone.data(), inp.data() + i * C, weight.data(), 1, C, OC);
        for (int64_t j = 0; j < OC; ++j) {
          const float expected = lane_dot(inp.data() + i * C, weight.data() + j * C, C);
          const float got = out[static_cast<size_t>(i * OC + j)];
          EXPECT_EQ(std::memcmp(&got, &expected, 4), 0) << "C=" << C << " N=" << N << " i=" << i;
          EXPECT_EQ(std::memcmp(&alone[static_cast<size_t>(j)], &expected, 4), 0);
        }
      }
    }
  }
}

// 16-bit weights: every element is the lane dot of its row with the weight row widened to float32
// (exactly), for any batch and any width (the 16-wide blocks and the tail).
TEST(MatmulRows, SixteenBitWeightsAreTheLaneDotOfTheWidenedRow) {
  const int64_t OC = 5;
  for (WeightType type : {WeightType::kF16, WeightType::kBF16}) {
    for (int64_t C : {1, 16, 37, 100}) {
      const std::vector<float> weight = Random(static_cast<size_t>(OC * C), 7);
      std::vector<uint16_t> half(weight.size());
      std::vector<float> widened(weight.size());
      for (size_t i = 0; i < weight.size(); ++i) {
        half[i] = type == WeightType::kF16 ? Fp16Bits(weight[i]) : Bf16Bits(weight[i]);
        widened[i] = type == WeightType::kF16 ? FromFp16(half[i]) : FromBf16(half[i]);
      }
      for (int64_t N : {1, 3, 4, 6}) {
        const std::vector<float> inp = Random(static_cast<size_t>(N * C), 9);
        std::vector<float> out(static_cast<size_t>(N * OC));
        matmul_rows(out.data(), inp.data(), RowWeights(half.data(), type), N, C, OC);
        for (int64_t i = 0; i < N; ++i)
          for (int64_t j = 0; j < OC; ++j) {
            const float expected = lane_dot(inp.data() + i * C, widened.data() + j * C, C);
            EXPECT_EQ(std::memcmp(&out[static_cast<size_t>(i * OC + j)], &expected, 4), 0)
                << WeightTypeName(type) << " C=" << C << " N=" << N;
          }
      }
    }
  }
}

// Several products in one region: each output the bits of its own matmul_rows, for any thread
// count (the threads' shares cut across the products' boundaries).
TEST(MatmulRows, ManyProductsInOneRegionAreEachProductAlone) {
  const int64_t C = 40, N = 3;
  const int64_t widths[3] = {7, 1, 13};
  std::vector<std::vector<float>> weights, alone;
  for (int p = 0; p < 3; ++p) {
    weights.push_back(Random(static_cast<size_t>(widths[p] * C), 20 + p));
    alone.emplace_back(static_cast<size_t>(N * widths[p]));
  }
  const std::vector<float> inp = Random(static_cast<size_t>(N * C), 30);
  for (int p = 0; p < 3; ++p)
    matmul_rows(alone[p].data(), inp.data(), weights[p].data(), N, C, widths[p]);
  const int before = omp_get_max_threads();
  for (int threads : {1, 2, 3, 5}) {
    omp_set_num_threads(threads);
    std::vector<std::vector<float>> out;
    std::vector<RowProduct> products;
    for (int p = 0; p < 3; ++p) out.emplace_back(static_cast<size_t>(N * widths[p]));
    for (int p = 0; p < 3; ++p) products.push_back({out[p].data(), weights[p].data(), widths[p]});
    matmul_rows(products.data(), 3, inp.data(), N, C);
    for (int p = 0; p < 3; ++p)
      EXPECT_EQ(std::memcmp(out[p].data(), alone[p].data(), out[p].size() * 4), 0)
          << "product " << p << " threads " << threads;
  }
  omp_set_num_threads(before);
}

// Selects `isa` (and a thread count) for the scope, then restores what was selected.
struct ScopedPath {
  TileIsa saved_isa = tile_isa();
  int saved_threads = omp_get_max_threads();
  ScopedPath(TileIsa isa, int threads) {
    set_tile_isa(isa);
    omp_set_num_threads(threads);
  }
  ~ScopedPath() {
    set_tile_isa(saved_isa);
    omp_set_num_threads(saved_threads);
  }
};

std::vector<TileIsa> IsasHere() {
  std::vector<TileIsa> isas = {TileIsa::kAvx2};
  if (cpu_has_avx512f()) isas.push_back(TileIsa::kAvx512);
  return isas;
}

const char* IsaName(TileIsa isa) {
  return isa == TileIsa::kAvx512 ? "avx512" : "avx2";
}

// Every element against lanes.h's scalar lane_dot of its row and the widened weight row, on both
// paths, 1 and 2 threads, for rows shorter than a vector, with a tail, and whole; batches that
// are not a multiple of the 4-row blocks; widths that are not a multiple of the 4-column blocks
// (nor of the threads' shares); each row also alone (the batch does not change its bits).
TEST(MatmulRows, BothPathsGiveTheScalarLaneDotForOddShapes) {
  const std::pair<int64_t, int64_t> shapes[] = {{1, 5},  {7, 3},  {15, 13}, {16, 4},
                                                {17, 9}, {40, 7}, {100, 1}, {257, 21}};
  for (WeightType type : {WeightType::kF32, WeightType::kF16, WeightType::kBF16}) {
    for (const auto& [C, OC] : shapes) {
      const std::vector<float> weight =
          Random(static_cast<size_t>(OC * C), 40 + static_cast<uint32_t>(C));
      std::vector<uint16_t> half(weight.size());
      std::vector<float> widened(weight);
      if (type != WeightType::kF32)
        for (size_t i = 0; i < weight.size(); ++i) {
          half[i] = type == WeightType::kF16 ? Fp16Bits(weight[i]) : Bf16Bits(weight[i]);
          widened[i] = type == WeightType::kF16 ? FromFp16(half[i]) : FromBf16(half[i]);
        }
      const RowWeights rows =
          type == WeightType::kF32 ? RowWeights(weight.data()) : RowWeights(half.data(), type);
      const int64_t N = 9;
      const std::vector<float> inp =
          Random(static_cast<size_t>(N * C), 50 + static_cast<uint32_t>(C));
      std::vector<float> expected(static_cast<size_t>(N * OC));
      for (int64_t i = 0; i < N; ++i)
        for (int64_t j = 0; j < OC; ++j)
          expected[static_cast<size_t>(i * OC + j)] =
              lane_dot(inp.data() + i * C, widened.data() + j * C, C);
      for (TileIsa isa : IsasHere()) {
        for (int threads : {1, 2}) {
          const ScopedPath path(isa, threads);
          for (int64_t n = 1; n <= N; ++n) {
            std::vector<float> out(static_cast<size_t>(n * OC), -1.0f);
            matmul_rows(out.data(), inp.data(), rows, n, C, OC);
            EXPECT_EQ(std::memcmp(out.data(), expected.data(), out.size() * 4), 0)
                << IsaName(isa) << " " << WeightTypeName(type) << " threads=" << threads
                << " C=" << C << " OC=" << OC << " N=" << n;
          }
          for (int64_t i = 0; i < N; ++i) {
            std::vector<float> alone(static_cast<size_t>(OC));
            matmul_rows(alone.data(), inp.data() + i * C, rows, 1, C, OC);
            EXPECT_EQ(std::memcmp(alone.data(), expected.data() + i * OC, alone.size() * 4), 0)
                << IsaName(isa) << " " << WeightTypeName(type) << " row " << i << " alone";
          }
        }
      }
    }
  }
}

// decode_attention's definition, one row and head at a time, in scalar code: scores lane_dot *
// 1/sqrt(Dk), lane_max, exp_fast, lane_sum, and the value sum in position order.
std::vector<float> DecodeAttentionReference(const std::vector<float>& q,
                                            const std::vector<const float*>& keys,
                                            const std::vector<const float*>& values,
                                            const std::vector<int64_t>& lengths, int64_t H,
                                            int64_t KV, HeadDims D) {
  const int64_t N = static_cast<int64_t>(lengths.size()), group = H / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D.qk));
  std::vector<float> out(static_cast<size_t>(N * H * D.v));
  for (int64_t i = 0; i < N; ++i)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kv = h / group, length = lengths[static_cast<size_t>(i)];
      const float* query = q.data() + (i * H + h) * D.qk;
      std::vector<float> p(static_cast<size_t>(length));
      for (int64_t t = 0; t < length; ++t)
        p[t] = lane_dot(query, keys[i] + (t * KV + kv) * D.qk, D.qk) * scale;
      const float m = lane_max(p.data(), length);
      for (float& x : p) x = exp_fast(x - m);
      const float inverse = 1.0f / lane_sum(p.data(), length);
      float* o = out.data() + (i * H + h) * D.v;
      for (int64_t t = 0; t < length; ++t) {
        const float weight = p[t] * inverse;
        for (int64_t d = 0; d < D.v; ++d) o[d] += weight * values[i][(t * KV + kv) * D.v + d];
      }
    }
  return out;
}

// Both paths, 1 and 2 threads, against the scalar definition: groups of 1, 2, 3 and 5 query heads
// a KV head; head widths whole vectors, with a tail, shorter than one, and keys wider than values
// (and narrower); lengths across the 16-position blocks; each sequence also alone.
TEST(DecodeAttention, BothPathsGiveTheScalarDefinitionForOddShapes) {
  struct Case {
    int64_t H, KV, Dk, Dv;
  };
  const Case cases[] = {{8, 4, 32, 32},  {6, 2, 64, 64}, {5, 5, 7, 7},
                        {10, 2, 24, 40}, {3, 1, 48, 16}, {4, 2, 33, 97}};
  const int64_t kMaxLen = 70;
  uint32_t seed = 100;
  for (const Case& c : cases) {
    const HeadDims D(c.Dk, c.Dv);
    for (int64_t N : {1, 3, 5}) {
      std::vector<std::vector<float>> k_cache, v_cache;
      std::vector<const float*> keys, values;
      std::vector<int64_t> lengths;
      for (int64_t i = 0; i < N; ++i) {
        k_cache.push_back(Random(static_cast<size_t>(kMaxLen * c.KV * c.Dk), seed++));
        v_cache.push_back(Random(static_cast<size_t>(kMaxLen * c.KV * c.Dv), seed++));
        keys.push_back(k_cache.back().data());
        values.push_back(v_cache.back().data());
        lengths.push_back(1 + (17 * i + 3 * N + c.Dk) % kMaxLen);  // 1 .. 70
      }
      std::vector<float> q = Random(static_cast<size_t>(N * c.H * c.Dk), seed++);
      for (float& x : q) x *= 3.0f;  // peaked softmaxes as well as flat ones
      const std::vector<float> expected =
          DecodeAttentionReference(q, keys, values, lengths, c.H, c.KV, D);
      for (TileIsa isa : IsasHere())
        for (int threads : {1, 2}) {
          const ScopedPath path(isa, threads);
          std::vector<float> out(expected.size(), -1.0f);
          decode_attention(out.data(), q.data(), keys.data(), values.data(), lengths.data(), N, c.H,
                           c.KV, D);
          EXPECT_EQ(std::memcmp(out.data(), expected.data(), out.size() * 4), 0)
              << IsaName(isa) << " threads=" << threads << " H=" << c.H << " KV=" << c.KV
              << " Dk=" << c.Dk << " Dv=" << c.Dv << " N=" << N;
          const int64_t last = N - 1, row = c.H * c.Dv;
          std::vector<float> alone(static_cast<size_t>(row));
          decode_attention(alone.data(), q.data() + last * c.H * c.Dk, &keys[last], &values[last],
                           &lengths[last], 1, c.H, c.KV, D);
          EXPECT_EQ(std::memcmp(alone.data(), expected.data() + last * row, alone.size() * 4), 0)
              << IsaName(isa) << " sequence " << last << " alone";
        }
    }
  }
}

// The 16-bit conversions: round to nearest even at the edges of each format.
TEST(HalfPrecision, RoundsToNearestEvenAndKeepsSpecials) {
  EXPECT_EQ(Fp16Bits(1.0f), 0x3C00);
  EXPECT_EQ(Fp16Bits(-2.0f), 0xC000);
  EXPECT_EQ(Fp16Bits(65504.0f), 0x7BFF);
  EXPECT_EQ(Fp16Bits(65520.0f), 0x7C00);             // the tie above the largest: infinity
  EXPECT_EQ(Fp16Bits(1.0f + 0x1p-11f), 0x3C00);      // a tie: to even
  EXPECT_EQ(Fp16Bits(1.0f + 3 * 0x1p-11f), 0x3C02);  // a tie: to even, upwards
  EXPECT_EQ(Fp16Bits(0x1p-24f), 0x0001);             // the smallest subnormal
  EXPECT_EQ(Fp16Bits(0x1p-25f), 0x0000);             // half of it: a tie, to zero
  EXPECT_NE(FromFp16(Fp16Bits(std::nanf(""))), FromFp16(Fp16Bits(std::nanf(""))));
  EXPECT_EQ(FromFp16(0x3555), 0.333251953125f);
  EXPECT_EQ(Bf16Bits(1.0f), 0x3F80);
  EXPECT_EQ(Bf16Bits(1.0f + 0x1p-8f), 0x3F80);  // a tie: to even
  EXPECT_EQ(Bf16Bits(1.0f + 3 * 0x1p-8f), 0x3F82);
  EXPECT_EQ(FromBf16(0xC0A0), -5.0f);
  EXPECT_NE(FromBf16(Bf16Bits(std::nanf(""))), FromBf16(Bf16Bits(std::nanf(""))));
}

}  // namespace
}  // namespace crucible::kernels
