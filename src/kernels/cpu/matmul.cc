// Linear layers through OpenBLAS or oneDNN sgemm (row-major, Hugging Face weight layout (OC, C));
// which library computes a product's tiles is gemm_library.h's choice, fixed per ISA and shape.
//
// OpenBLAS's own threading does not give the same bits for every thread count: for some shapes
// the threaded driver blocks the inner dimension differently from the single-threaded one
// (tests/unit/kernels shows a 200x96x1000 case). So every product here is cut into output
// tiles whose sizes depend only on the matrix shape; each tile is one single-threaded sgemm
// (OpenBLAS's OpenMP build runs single-threaded inside an active parallel region, one of two or
// more threads; oneDNN's is held to one thread by gemm_tile), and the OpenMP loop over tiles
// decides only who computes a tile, never how. A region of one thread while more are asked for
// (OMP_THREAD_LIMIT=1 while omp_get_max_threads() > 1) is not active: OpenBLAS then starts its own
// threads and waits for them forever.
//
// bf16 (not kOff): both operands are packed once per product into bf16 pair words for that kernel
// (gemm_bf16.h; the buffers are this file's, grown to the largest product and reused, so products
// must not run concurrently), then the same tiles are each computed by gemm_bf16_tile instead of
// sgemm; the caller checks Bf16GemmAvailable().
#include <algorithm>
#include <utility>
#include <vector>

#include "common/profile.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/gemm_library.h"
#include "kernels/cpu/kernels.h"
#include "kernels/kernel_costs.h"

namespace crucible::kernels {
namespace {

// Output tiles start at 256 x 512 (large enough that OpenBLAS's packing of the operands is a
// small share of a tile's work) and are halved, the larger side first, until the product has at
// least kMinTiles of them (so a small output with a long inner dimension, like the weight
// gradient of a key projection, still keeps every thread busy). A pure function of the shape; the
// same for both libraries (oneDNN measured no faster with other sizes: docs/performance.md).
constexpr int64_t kMaxTileRows = 256;
constexpr int64_t kMaxTileCols = 512;
constexpr int64_t kMinTileSide = 64;
constexpr int64_t kMinTiles = 8;

struct Tiles {
  int64_t rows, cols;
};
Tiles ChooseTiles(int64_t M, int64_t N) {
  Tiles t{kMaxTileRows, kMaxTileCols};
  auto count = [&](const Tiles& x) {
    return ((M + x.rows - 1) / x.rows) * ((N + x.cols - 1) / x.cols);
  };
  while (count(t) < kMinTiles) {
    if (t.cols >= t.rows && t.cols > kMinTileSide && N > t.cols / 2)
      t.cols /= 2;
    else if (t.rows > kMinTileSide && M > t.rows / 2)
      t.rows /= 2;
    else if (t.cols > kMinTileSide && N > t.cols / 2)
      t.cols /= 2;
    else
      break;
  }
  return t;
}

// C (M,N) = alpha * op(A) (M,K) * op(B) (K,N) + beta * C, row-major, tiled over C.
void gemm_tiled(GemmProduct product, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                int64_t ldc, Bf16Gemm bf16) {
  const GemmLibrary library = GemmLibraryFor(product, M, N, K);
  const Tiles t = ChooseTiles(M, N);
  const int64_t row_tiles = (M + t.rows - 1) / t.rows;
  const int64_t col_tiles = (N + t.cols - 1) / t.cols;
  static Bf16PackBuffer a_buffer, b_buffer;
  Bf16PackedA a_packed{};
  Bf16PackedB b_packed{};
  const bool native = bf16 != Bf16Gemm::kOff;
  if (native) {
    a_packed = pack_bf16_a(bf16, trans_a, M, K, A, lda, a_buffer);
    b_packed = pack_bf16_b(trans_b, N, K, B, ldb, b_buffer);
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t tile = 0; tile < row_tiles * col_tiles; ++tile) {
    const int64_t i0 = (tile / col_tiles) * t.rows, j0 = (tile % col_tiles) * t.cols;
    const int64_t rows = std::min(t.rows, M - i0), cols = std::min(t.cols, N - j0);
    if (native) {
      gemm_bf16_tile(bf16, a_packed, b_packed, i0, j0, rows, cols, K, beta != 0.0f,
                     C + i0 * ldc + j0, ldc);
      continue;
    }
    const float* a = trans_a ? A + i0 : A + i0 * lda;
    const float* b = trans_b ? B + j0 * ldb : B + j0;
    gemm_tile(library, trans_a, trans_b, rows, cols, K, a, lda, b, ldb, beta, C + i0 * ldc + j0,
              ldc);
  }
}

}  // namespace

void matmul_forward(float* out, const float* inp, const float* weight, int64_t N, int64_t C,
                    int64_t OC, Bf16Gemm bf16) {
  matmul_forward_strided(out, inp, weight, C, N, C, OC, bf16);
}

void matmul_forward_strided(float* out, const float* inp, const float* weight, int64_t ldw,
                            int64_t N, int64_t C, int64_t OC, Bf16Gemm bf16) {
  ScopedKernelTimer profile_timer(MatmulForwardCost(N, C, OC));
  gemm_tiled(GemmProduct::kForward, false, true, N, OC, C, inp, C, weight, ldw, 0.0f, out, OC,
             bf16);
}

void matmul_nn(float* out, const float* a, const float* b, int64_t M, int64_t K, int64_t N) {
  ScopedKernelTimer profile_timer(MatmulForwardCost(M, K, N));
  gemm_tiled(GemmProduct::kDinp, false, false, M, N, K, a, K, b, N, 0.0f, out, N, Bf16Gemm::kOff);
}

void matmul_gram(float* out, const float* inp, int64_t N, int64_t C) {
  ScopedKernelTimer profile_timer(MatmulGramCost(N, C, kGramTile));
  const GemmLibrary library = GemmLibraryFor(GemmProduct::kForward, N, N, C);
  const int64_t tiles = (N + kGramTile - 1) / kGramTile;
  std::vector<std::pair<int64_t, int64_t>> upper;  // (row tile, column tile), column >= row
  for (int64_t i = 0; i < tiles; ++i)
    for (int64_t j = i; j < tiles; ++j) upper.emplace_back(i, j);
  const int64_t count = static_cast<int64_t>(upper.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t p = 0; p < count; ++p) {
    const int64_t i0 = upper[p].first * kGramTile, j0 = upper[p].second * kGramTile;
    const int64_t rows = std::min(kGramTile, N - i0), cols = std::min(kGramTile, N - j0);
    gemm_tile(library, false, true, rows, cols, C, inp + i0 * C, C, inp + j0 * C, C, 0.0f,
              out + i0 * N + j0, N);
  }
  // The mirror, tile by tile (a tile and its image both stay in cache): below the diagonal of a
  // diagonal tile, and the whole image of each tile above it.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t p = 0; p < count; ++p) {
    const int64_t i0 = upper[p].first * kGramTile, j0 = upper[p].second * kGramTile;
    const int64_t i1 = std::min(N, i0 + kGramTile), j1 = std::min(N, j0 + kGramTile);
    for (int64_t j = j0; j < j1; ++j)
      for (int64_t i = i0; i < std::min(i1, j); ++i) out[j * N + i] = out[i * N + j];
  }
}

void matmul_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                     const float* weight, int64_t N, int64_t C, int64_t OC, bool accumulate_dinp,
                     bool accumulate_dweight, Bf16Gemm bf16) {
  matmul_backward_strided(dinp, dweight, dout, inp, weight, C, N, C, OC, accumulate_dinp,
                          accumulate_dweight, bf16);
}

void matmul_backward_strided(float* dinp, float* dweight, const float* dout, const float* inp,
                             const float* weight, int64_t ldw, int64_t N, int64_t C, int64_t OC,
                             bool accumulate_dinp, bool accumulate_dweight, Bf16Gemm bf16) {
  ScopedKernelTimer profile_timer(MatmulBackwardCost(N, C, OC, dinp != nullptr));
  // dinp (N,C) = dout (N,OC) @ weight (OC,C)
  if (dinp)
    gemm_tiled(GemmProduct::kDinp, false, false, N, C, OC, dout, OC, weight, ldw,
               accumulate_dinp ? 1.0f : 0.0f, dinp, C, bf16);
  // dweight (OC,C) = dout^T (OC,N) @ inp (N,C)
  gemm_tiled(GemmProduct::kDweight, true, false, OC, C, N, dout, OC, inp, C,
             accumulate_dweight ? 1.0f : 0.0f, dweight, ldw, bf16);
}

namespace {

struct GroupTile {
  int64_t group, i0, j0, rows, cols;
};

// Columns of a grouped product's tiles, from OC alone: 512, halved while OC fits in half of it
// (down to 64), so a narrow product is one column tile (the groups give the threads enough tiles:
// 256 x 512 tiles measured 16% faster than a loop of per-expert calls on 16 experts of 352,
// bench/kernels_bench.cc Experts).
int64_t GroupTileCols(int64_t OC) {
  int64_t cols = kMaxTileCols;
  while (cols > kMinTileSide && OC <= cols / 2) cols /= 2;
  return cols;
}

// The tiles of every group's (rows_g, width) output, in group order.
std::vector<GroupTile> GroupTiles(const int64_t* begin, int64_t G, int64_t tile_rows,
                                  int64_t width) {
  const int64_t tile_cols = GroupTileCols(width);
  std::vector<GroupTile> tiles;
  for (int64_t g = 0; g < G; ++g)
    for (int64_t i0 = begin[g]; i0 < begin[g + 1]; i0 += tile_rows)
      for (int64_t j0 = 0; j0 < width; j0 += tile_cols)
        tiles.push_back(
            {g, i0, j0, std::min(tile_rows, begin[g + 1] - i0), std::min(tile_cols, width - j0)});
  return tiles;
}

// Runs product(tile) for every tile, in one parallel loop (which thread computes a tile decides
// nothing about its bits).
template <typename Product>
void RunGroupTiles(const std::vector<GroupTile>& tiles, const Product& product) {
  const int64_t count = static_cast<int64_t>(tiles.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t p = 0; p < count; ++p) product(tiles[p]);
}

}  // namespace

void grouped_matmul_forward(float* out, const float* inp, const float* const* weights,
                            const int64_t* begin, int64_t G, int64_t C, int64_t OC) {
  ScopedKernelTimer profile_timer(MatmulForwardCost(begin[G] - begin[0], C, OC));
  const GemmLibrary library = GemmLibraryFor(GemmProduct::kForward, kGroupTileRows, OC, C);
  RunGroupTiles(GroupTiles(begin, G, kGroupTileRows, OC), [&](const GroupTile& t) {
    gemm_tile(library, false, true, t.rows, t.cols, C, inp + t.i0 * C, C,
              weights[t.group] + t.j0 * C, C, 0.0f, out + t.i0 * OC + t.j0, OC);
  });
}

void grouped_matmul_backward(float* dinp, float* const* dweights, const float* dout,
                             const float* inp, const float* const* weights, const int64_t* begin,
                             int64_t G, int64_t C, int64_t OC, bool accumulate_dinp) {
  ScopedKernelTimer profile_timer(MatmulBackwardCost(begin[G] - begin[0], C, OC, dinp != nullptr));
  if (dinp) {  // dinp_g (rows_g, C) = dout_g (rows_g, OC) W_g (OC, C)
    const GemmLibrary library = GemmLibraryFor(GemmProduct::kDinp, kGroupTileRows, C, OC);
    RunGroupTiles(GroupTiles(begin, G, kGroupTileRows, C), [&](const GroupTile& t) {
      gemm_tile(library, false, false, t.rows, t.cols, OC, dout + t.i0 * OC, OC,
                weights[t.group] + t.j0, C, accumulate_dinp ? 1.0f : 0.0f, dinp + t.i0 * C + t.j0,
                C);
    });
  }
  // dweight_g (OC, C) = dout_g^T (OC, rows_g) inp_g (rows_g, C): tiles over each group's
  // (OC, C), the inner dimension the group's rows.
  const int64_t tile_cols = GroupTileCols(C);
  std::vector<GroupTile> tiles;
  for (int64_t g = 0; g < G; ++g) {
    if (begin[g + 1] == begin[g]) {
      std::fill(dweights[g], dweights[g] + OC * C, 0.0f);
      continue;
    }
    for (int64_t i0 = 0; i0 < OC; i0 += kMaxTileRows)
      for (int64_t j0 = 0; j0 < C; j0 += tile_cols)
        tiles.push_back({g, i0, j0, std::min(kMaxTileRows, OC - i0), std::min(tile_cols, C - j0)});
  }
  RunGroupTiles(tiles, [&](const GroupTile& t) {
    const int64_t r0 = begin[t.group], n = begin[t.group + 1] - r0;
    const GemmLibrary library = GemmLibraryFor(GemmProduct::kDweight, OC, C, n);
    gemm_tile(library, true, false, t.rows, t.cols, n, dout + r0 * OC + t.i0, OC,
              inp + r0 * C + t.j0, C, 0.0f, dweights[t.group] + t.i0 * C + t.j0, C);
  });
}

}  // namespace crucible::kernels
