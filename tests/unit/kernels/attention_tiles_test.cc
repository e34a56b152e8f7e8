// The attention tile products (kernels/cpu/attention_tiles.h): each output is exactly the
// documented chain of fmas (bit for bit against a scalar std::fma loop), on the AVX2 path and,
// where the CPU has it, the AVX-512 path; the diagonal tiles' skips; the transposed packing; and
// the whole attention forward and backward, fp32 and bf16, gives the same bits on both paths at
// shapes that cross tile and block borders.
#include "kernels/cpu/attention_tiles.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels_test_util.h"

namespace crucible::kernels {
namespace {

using testing::Random;

// Selects `isa` for the scope, then restores what was selected.
struct ScopedIsa {
  TileIsa saved = tile_isa();
  explicit ScopedIsa(TileIsa isa) { set_tile_isa(isa); }
  ~ScopedIsa() { set_tile_isa(saved); }
};

std::vector<TileIsa> IsasHere() {
  std::vector<TileIsa> isas = {TileIsa::kAvx2};
  if (cpu_has_avx512f()) isas.push_back(TileIsa::kAvx512);
  return isas;
}

bool SameBits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

TEST(AttentionTiles, EachOutputIsTheFmaChainOverTheInnerIndex) {
  struct Case {
    int64_t rows, cols, inner;
    bool transposed_a, accumulate;
    float scale;
  };
  const Case cases[] = {{64, 64, 64, false, false, 0.125f}, {64, 64, 64, true, true, 1.0f},
                        {13, 37, 5, false, true, 1.0f},     {1, 1, 1, false, false, 1.0f},
                        {7, 24, 64, true, false, 0.5f},     {64, 8, 64, false, true, 1.0f},
                        {5, 70, 19, true, true, 1.0f},      {6, 16, 3, false, false, 3.0f}};
  uint64_t seed = 7;
  for (const Case& k : cases) {
    SCOPED_TRACE(::testing::Message()
                 << k.rows << "x" << k.cols << "x" << k.inner << " transposed_a=" << k.transposed_a
                 << " accumulate=" << k.accumulate);
    const int64_t lda = k.transposed_a ? k.rows + 3 : k.inner + 2, ldb = k.cols + 5,
                  ldc = k.cols + 1;
    const auto a = Random(lda * (k.transposed_a ? k.inner : k.rows), seed++);
    const auto b = Random(ldb * k.inner, seed++);
    const auto c0 = Random(ldc * k.rows, seed++);
    const int64_t a_row = k.transposed_a ? 1 : lda, a_inner = k.transposed_a ? lda : 1;
    std::vector<float> want = c0;
    for (int64_t i = 0; i < k.rows; ++i)
      for (int64_t j = 0; j < k.cols; ++j) {
        float acc = k.accumulate ? c0[i * ldc + j] : 0.0f;
        for (int64_t p = 0; p < k.inner; ++p)
          acc = std::fma(a[i * a_row + p * a_inner], b[p * ldb + j], acc);
        want[i * ldc + j] = acc * k.scale;
      }
    for (TileIsa isa : IsasHere()) {
      ScopedIsa scoped(isa);
      std::vector<float> got = c0;  // also checks that nothing outside the rows x cols moves
      tile_product({a.data(), a_row, a_inner, b.data(), ldb, got.data(), ldc, k.rows, k.cols,
                    k.inner, k.accumulate, k.scale});
      EXPECT_TRUE(SameBits(got, want)) << "isa " << static_cast<int>(isa);
    }
  }
}

// A diagonal tile's skips (TileCausal) leave every needed output equal to the full chain when A
// holds the zeros each mode promises (compared as values: a zero's sign may differ).
TEST(AttentionTiles, CausalSkipsKeepTheNeededOutputs) {
  for (const int64_t n : {64, 37, 1, 13}) {
    for (const TileCausal mode :
         {TileCausal::kOutputsUpToRow, TileCausal::kInnerUpToRow, TileCausal::kInnerFromRow}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " mode=" << static_cast<int>(mode));
      const int64_t ld = n + 2;
      auto a = Random(n * ld, 21), b = Random(n * ld, 22);
      const auto c0 = Random(n * ld, 23);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t p = 0; p < n; ++p)
          if ((mode == TileCausal::kInnerUpToRow && p > i) ||
              (mode == TileCausal::kInnerFromRow && p < i))
            a[i * ld + p] = 0.0f;
      for (TileIsa isa : IsasHere()) {
        ScopedIsa scoped(isa);
        std::vector<float> full = c0, skipped = c0;
        tile_product({a.data(), ld, 1, b.data(), ld, full.data(), ld, n, n, n, true, 0.5f});
        tile_product(
            {a.data(), ld, 1, b.data(), ld, skipped.data(), ld, n, n, n, true, 0.5f, mode});
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            if (mode != TileCausal::kOutputsUpToRow || j <= i) {
              ASSERT_EQ(skipped[i * ld + j], full[i * ld + j]) << i << "," << j;
            }
          }
        }
      }
    }
  }
}

TEST(AttentionTiles, TransposeSwapsTheIndices) {
  for (const auto& [rows, cols] :
       {std::pair<int64_t, int64_t>{64, 64}, {19, 13}, {130, 24}, {3, 8}}) {
    const int64_t ld = cols + 3, ldd = rows + 5;
    const auto src = Random(rows * ld, 11);
    std::vector<float> dst(cols * ldd, -1.0f), want = dst;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) want[j * ldd + i] = src[i * ld + j];
    transpose_tile(src.data(), ld, rows, cols, dst.data(), ldd);
    EXPECT_TRUE(SameBits(dst, want)) << rows << " x " << cols;
  }
}

TEST(AttentionTiles, Avx2AndAvx512GiveTheSameAttentionBits) {
  if (!cpu_has_avx512f()) GTEST_SKIP() << "no AVX-512 on this CPU: only the AVX2 path runs";
  struct Shape {
    int64_t B, T, H, KV, D;
  };
  const Shape shapes[] = {
      {2, 130, 4, 2, 64}, {1, 200, 3, 3, 24}, {1, 65, 2, 1, 8}, {1, 1, 1, 1, 8}, {1, 64, 4, 1, 72}};
  uint64_t seed = 50;
  for (const Shape& s : shapes)
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " H=" << s.H
                                        << " KV=" << s.KV << " D=" << s.D << " bf16=" << bf16);
      const size_t nq = s.B * s.T * s.H * s.D, nk = s.B * s.T * s.KV * s.D;
      const auto q = Random(nq, seed++, 1.5f), k = Random(nk, seed++, 1.5f), v = Random(nk, seed++),
                 dout = Random(nq, seed++);
      std::vector<float> runs[2];
      for (int run = 0; run < 2; ++run) {
        ScopedIsa scoped(run == 0 ? TileIsa::kAvx2 : TileIsa::kAvx512);
        std::vector<float> out(nq), lse(s.B * s.H * s.T), dq(nq), dk(nk), dv(nk);
        attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s.B, s.T, s.H, s.KV,
                          s.D, bf16);
        attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                           q.data(), k.data(), v.data(), s.B, s.T, s.H, s.KV, s.D, bf16);
        for (const auto* part : {&out, &lse, &dq, &dk, &dv})
          runs[run].insert(runs[run].end(), part->begin(), part->end());
      }
      EXPECT_TRUE(SameBits(runs[0], runs[1]));
    }
}

}  // namespace
}  // namespace crucible::kernels
