// Causal grouped-query attention, flash style: the probabilities never exist whole. The forward
// pass walks, per (batch, head) and query tile, the key tiles up to the diagonal with an online
// softmax (running max and sum) and keeps only each row's log-sum-exp; the backward pass
// recomputes every tile's probabilities from Q, K and that log-sum-exp. The products inside a
// tile are the register-blocked micro-kernels of attention_tiles.h (the same bits on AVX2 and
// AVX-512), single-threaded inside one OpenMP loop. Each task copies its head once: K transposed
// for the scores and V as it is (forward); K and V transposed for the scores and dP = dO V^T and
// K as it is for dQ (backward); Q and dO are copied per query tile. Each thread's scratch is a
// few tiles and those D x T heads, allocated per call.
//
// Determinism: the forward pass has one task per (batch, head), the backward pass one per (batch,
// kv head) that owns dK and dV of that head and adds its query heads' contributions in head
// order, query tile by query tile, key tile by key tile; dQ rows of a query head belong to one
// task. Grouped query heads read K and V of their kv head (no per-head copy of the inputs).
//
// bf16 operands (bf16_operands = true, compute/backend.h "Precision"): Q, K, V and dO are rounded
// to bf16 as they are copied into the thread's scratch, before they enter a product, and so are the
// probabilities P (after their fp32 row sum, before P V and P^T dO) and the score gradient dS
// (before dS K and dS^T Q); the products accumulate in fp32 as before. The softmax, the
// log-sum-exp and delta = rowsum(dO * O) stay fp32 on the unrounded values. Off, the copies are
// exact (TileOperand).
//
// On AMX (products = kAmx, bf16 operands only): the same tasks, tiles, softmax and score-gradient
// loops, with every product on gemm_bf16.h's amx_tile_product. The operands are packed as pair
// words (rounded as above) instead of copied: per task K^T and V (forward), K^T, V^T and K
// (backward); per query tile Q (and dO) as the A and as the B of a product; per key tile P and dS
// as A, and transposed as the A of P^T dO and dS^T Q. Tiles are computed whole (the diagonal's
// masked outputs are dropped by the softmax, its zero terms of P and dS added as zeros); the
// scale is applied after the product, as tile_product does. Each output's sum is one tdpbf16ps
// chain over its inner index, so the bits depend neither on the thread count nor on the layout.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/bfloat16.h"
#include "common/profile.h"
#include "kernels/cpu/attention_tiles.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/lanes.h"
#include "kernels/cpu/vec16.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/kernel_costs.h"

namespace crucible::kernels {
namespace {
// Rows of a query tile and columns of a key tile. Equal sizes put every diagonal tile's first
// key at or before each of its rows, so no row of a visited tile is fully masked.
constexpr int64_t kTile = 64;

// The operand of a product: rows x D values at `src` with leading dimension `ld`, copied into
// `scratch` (leading dimension D), rounded to bf16 when `round`. Read in place, a tile's rows sit
// H·D or KV·D floats apart (1 or 2 KiB on `small`) and fall into a few L1 sets, so the row
// blocks that re-read a tile would fetch it from L2 again; copied, the tile stays in L1.
struct Operand {
  const float* data;
  int64_t ld;
};
Operand TileOperand(const float* src, int64_t ld, int64_t rows, int64_t D, bool round,
                    float* scratch) {
  for (int64_t i = 0; i < rows; ++i) {
    if (round)
      RoundToBfloat16(src + i * ld, scratch + i * D, D);
    else
      std::memcpy(scratch + i * D, src + i * ld, D * sizeof(float));
  }
  return {scratch, D};
}

// Leading dimension of a head's keys or values packed transposed (D rows of T): T rounded up to
// 16 columns plus 16, so that the rows a product walks do not share L1 sets at a 4 KiB stride.
int64_t TransposedStride(int64_t T) {
  return (T + 15) / 16 * 16 + 16;
}

// The head's T x D keys (or values) at src, leading dimension ld, transposed into dst (D x ldt),
// each value rounded to bf16 when `round`.
void PackHeadTransposed(const float* src, int64_t ld, int64_t T, int64_t D, bool round, float* dst,
                        int64_t ldt) {
  transpose_tile(src, ld, T, D, dst, ldt);
  if (round)
    for (int64_t d = 0; d < D; ++d) RoundToBfloat16(dst + d * ldt, dst + d * ldt, T);
}

// One tile of the forward's online softmax: turns the scores S (rows x cols, leading dimension
// kTile) of query rows r0.. and keys c0.. into probabilities against the running maximum
// (zero past the diagonal, rounded to bf16 when `round`), updates each row's running maximum and
// sum, and rescales the row's accumulator acc (leading dimension D) when the maximum moved. The
// row loops are vec16.h's: exp_fast, lane_max and lane_sum bit for bit, in one pass for the
// exponentials and their sum (a row of S is padded to kTile: their padded forms).
// The rows' maxima are taken first, then their exponentials, then the rescaling factors 16 rows
// at a time (vec16::Exp, exp_fast's bits): one row's chain of a maximum, the exponentials that
// wait for it and a scalar exponential no longer runs alone. alpha = 1 (the maximum did not move)
// skips a multiplication by 1.
[[gnu::always_inline]] inline void OnlineSoftmaxRows(float* S, int64_t rows, int64_t cols,
                                                     int64_t r0, int64_t c0, bool round,
                                                     float* run_max, float* run_sum, float* acc,
                                                     int64_t D) {
  static_assert(kTile % vec16::kWidth == 0);
  alignas(64) float m[kTile] = {}, sum[kTile], alpha[kTile];  // m past `rows`: read, unused
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t n = std::min(cols, r0 + i - c0 + 1);  // keys j <= r0 + i
    const float tile_max = vec16::Max<true>(S + i * kTile, n);
    m[i] = c0 == 0 ? tile_max : std::max(run_max[i], tile_max);
  }
  for (int64_t i = 0; i < rows; ++i) {
    float* row = S + i * kTile;
    const int64_t n = std::min(cols, r0 + i - c0 + 1);
    sum[i] = vec16::ExpShiftedSum<true>(row, row, n, m[i]);
    for (int64_t j = (n + vec16::kWidth - 1) / vec16::kWidth * vec16::kWidth; j < cols; ++j)
      row[j] = 0.0f;
    if (round) RoundToBfloat16(row, row, n);
  }
  if (c0 == 0) {
    std::copy(sum, sum + rows, run_sum);
    std::copy(m, m + rows, run_max);
    return;
  }
  for (int64_t i = 0; i < rows; i += vec16::kWidth)
    vec16::Store(alpha + i, vec16::Exp(vec16::Load(run_max + i) - vec16::Load(m + i)));
  for (int64_t i = 0; i < rows; ++i) {
    run_sum[i] = run_sum[i] * alpha[i] + sum[i];
    if (alpha[i] != 1.0f)
      for (int64_t d = 0; d < D; ++d) acc[i * D + d] *= alpha[i];
    run_max[i] = m[i];
  }
}

// The backward's recomputed probabilities and score gradient of one tile, in place: per row i,
// P = exp(S - lse) and dS = P * (dP - delta) * scale for the keys up to the diagonal, zero past
// it, both rounded to bf16 when `round`.
[[gnu::always_inline]] inline void ScoreGradientRows(float* P, float* dS, int64_t rows,
                                                     int64_t cols, int64_t r0, int64_t c0,
                                                     bool round, const float* lse,
                                                     const float* delta, float scale) {
  for (int64_t i = 0; i < rows; ++i) {
    float* p = P + i * kTile;
    float* ds = dS + i * kTile;
    const int64_t n = std::min(cols, r0 + i - c0 + 1);
    const float l = lse[i], dl = delta[i];
    int64_t j = 0;
    for (; j + vec16::kWidth <= n; j += vec16::kWidth) {
      const vec16::F e = vec16::Exp(vec16::Load(p + j) - l);
      vec16::Store(p + j, e);
      vec16::Store(ds + j, e * (vec16::Load(ds + j) - dl) * scale);
    }
    if (j < n) {
      const vec16::F e = vec16::Exp(vec16::LoadFirst(p + j, n - j) - l);
      vec16::StoreFirst(p + j, e, n - j);
      vec16::StoreFirst(ds + j, e * (vec16::LoadFirst(ds + j, n - j) - dl) * scale, n - j);
    }
    for (j = n; j < cols; ++j) p[j] = ds[j] = 0.0f;
    if (round) {
      RoundToBfloat16(p, p, n);
      RoundToBfloat16(ds, ds, n);
    }
  }
}

// Both loops compiled for AVX-512 (one zmm per vec16 vector) and for the build's AVX2 (two ymm),
// chosen with the tile products (tile_isa()): the same bits (vec16.h; the test of
// attention_tiles.h runs both).
__attribute__((target("avx512f"))) void OnlineSoftmaxAvx512(float* S, int64_t rows, int64_t cols,
                                                            int64_t r0, int64_t c0, bool round,
                                                            float* run_max, float* run_sum,
                                                            float* acc, int64_t D) {
  OnlineSoftmaxRows(S, rows, cols, r0, c0, round, run_max, run_sum, acc, D);
}
void OnlineSoftmaxAvx2(float* S, int64_t rows, int64_t cols, int64_t r0, int64_t c0, bool round,
                       float* run_max, float* run_sum, float* acc, int64_t D) {
  OnlineSoftmaxRows(S, rows, cols, r0, c0, round, run_max, run_sum, acc, D);
}
void OnlineSoftmax(float* S, int64_t rows, int64_t cols, int64_t r0, int64_t c0, bool round,
                   float* run_max, float* run_sum, float* acc, int64_t D) {
  (tile_isa() == TileIsa::kAvx512 ? OnlineSoftmaxAvx512 : OnlineSoftmaxAvx2)(
      S, rows, cols, r0, c0, round, run_max, run_sum, acc, D);
}
__attribute__((target("avx512f"))) void ScoreGradientAvx512(float* P, float* dS, int64_t rows,
                                                            int64_t cols, int64_t r0, int64_t c0,
                                                            bool round, const float* lse,
                                                            const float* delta, float scale) {
  ScoreGradientRows(P, dS, rows, cols, r0, c0, round, lse, delta, scale);
}
void ScoreGradientAvx2(float* P, float* dS, int64_t rows, int64_t cols, int64_t r0, int64_t c0,
                       bool round, const float* lse, const float* delta, float scale) {
  ScoreGradientRows(P, dS, rows, cols, r0, c0, round, lse, delta, scale);
}
void ScoreGradient(float* P, float* dS, int64_t rows, int64_t cols, int64_t r0, int64_t c0,
                   bool round, const float* lse, const float* delta, float scale) {
  (tile_isa() == TileIsa::kAvx512 ? ScoreGradientAvx512 : ScoreGradientAvx2)(
      P, dS, rows, cols, r0, c0, round, lse, delta, scale);
}

// ---- the tile products: the fp32 micro-kernels or AMX, behind one interface ----
// Forward, per thread: Head(K, V) once per task (the head's keys and values), Query(Q, rows) per
// query tile, then per key tile c0 Scores: S = scale Q K^T, and AddValues: acc (+)= P V with the
// probabilities P in S. Backward: Head(K, V), Query(Q, dO, rows), then per key tile Scores:
// P = scale Q K^T and dS = dO V^T, and Accumulate: dV[c0:] += P^T dO, dK[c0:] += dS^T Q,
// dQ[r0:] (+)= dS K[c0:]. Everything else (tasks, tiles, softmax, score gradient) is shared.

// tile_product's micro-kernels on copies of the operands (bf16-rounded when `round`); on the
// diagonal tile they skip the outputs and terms the causal mask zeroes.
class MicroForward {
 public:
  MicroForward(int64_t T, int64_t D, int64_t Dv, bool round)
      : D_(D),
        Dv_(Dv),
        ldt_(TransposedStride(T)),
        round_(round),
        key_t_(D * ldt_),
        v_head_(T * Dv),
        q_tile_(kTile * D) {}
  void Head(const float* K, int64_t ldk, const float* V, int64_t ldv, int64_t n) {
    PackHeadTransposed(K, ldk, n, D_, round_, key_t_.data(), ldt_);
    TileOperand(V, ldv, n, Dv_, round_, v_head_.data());
  }
  void Query(const float* Q, int64_t ldq, int64_t rows) {
    TileOperand(Q, ldq, rows, D_, round_, q_tile_.data());
  }
  void Scores(float* S, int64_t r0, int64_t c0, int64_t rows, int64_t cols, float scale) {
    tile_product({q_tile_.data(), D_, 1, key_t_.data() + c0, ldt_, S, kTile, rows, cols, D_, false,
                  scale, c0 == r0 ? TileCausal::kOutputsUpToRow : TileCausal::kNone});
  }
  void AddValues(const float* S, float* acc, int64_t r0, int64_t c0, int64_t rows, int64_t cols) {
    tile_product({S, kTile, 1, v_head_.data() + c0 * Dv_, Dv_, acc, Dv_, rows, Dv_, cols, c0 != 0,
                  1.0f, c0 == r0 ? TileCausal::kInnerUpToRow : TileCausal::kNone});
  }

 private:
  int64_t D_, Dv_, ldt_;
  bool round_;
  std::vector<float> key_t_, v_head_, q_tile_;  // K^T (D x ldt), V (T x Dv), the query tile
};

class MicroBackward {
 public:
  MicroBackward(int64_t T, int64_t D, int64_t Dv, bool round)
      : D_(D),
        Dv_(Dv),
        ldt_(TransposedStride(T)),
        round_(round),
        key_t_(D * ldt_),
        value_t_(Dv * ldt_),
        k_head_(T * D),
        q_tile_(kTile * D),
        do_tile_(kTile * Dv) {}
  void Head(const float* K, int64_t ldk, const float* V, int64_t ldv, int64_t n) {
    PackHeadTransposed(K, ldk, n, D_, round_, key_t_.data(), ldt_);
    PackHeadTransposed(V, ldv, n, Dv_, round_, value_t_.data(), ldt_);
    TileOperand(K, ldk, n, D_, round_, k_head_.data());
  }
  void Query(const float* Q, int64_t ldq, const float* dO, int64_t ldo, int64_t rows) {
    TileOperand(Q, ldq, rows, D_, round_, q_tile_.data());
    TileOperand(dO, ldo, rows, Dv_, round_, do_tile_.data());
  }
  void Scores(float* P, float* dS, int64_t r0, int64_t c0, int64_t rows, int64_t cols,
              float scale) {
    const TileCausal outputs = c0 == r0 ? TileCausal::kOutputsUpToRow : TileCausal::kNone;
    tile_product({q_tile_.data(), D_, 1, key_t_.data() + c0, ldt_, P, kTile, rows, cols, D_, false,
                  scale, outputs});
    tile_product({do_tile_.data(), Dv_, 1, value_t_.data() + c0, ldt_, dS, kTile, rows, cols, Dv_,
                  false, 1.0f, outputs});
  }
  void Accumulate(const float* P, const float* dS, float* dV, int64_t ldv, float* dK, int64_t ldk,
                  float* dQ, int64_t ldq, int64_t r0, int64_t c0, int64_t rows, int64_t cols) {
    // The diagonal tile: zero terms of P and dS are skipped.
    const bool diagonal = c0 == r0;
    const TileCausal up_to_row = diagonal ? TileCausal::kInnerUpToRow : TileCausal::kNone,
                     from_row = diagonal ? TileCausal::kInnerFromRow : TileCausal::kNone;
    tile_product(
        {P, 1, kTile, do_tile_.data(), Dv_, dV, ldv, cols, Dv_, rows, true, 1.0f, from_row});
    tile_product({dS, 1, kTile, q_tile_.data(), D_, dK, ldk, cols, D_, rows, true, 1.0f, from_row});
    tile_product({dS, kTile, 1, k_head_.data() + c0 * D_, D_, dQ, ldq, rows, D_, cols, c0 != 0,
                  1.0f, up_to_row});
  }

 private:
  int64_t D_, Dv_, ldt_;
  bool round_;
  // K^T (D x ldt), V^T (Dv x ldt), K (T x D), the query tile's Q and dO
  std::vector<float> key_t_, value_t_, k_head_, q_tile_, do_tile_;
};

// x[i][j] *= scale for rows x cols at x (leading dimension kTile).
void ScaleTile(float* x, int64_t rows, int64_t cols, float scale) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) x[i * kTile + j] *= scale;
}

// Pair words of one packed operand, 64-byte aligned (gemm_bf16.h's buffer).
struct Pairs {
  Bf16PackBuffer buffer;
  uint32_t* words = nullptr;
  int64_t ld = 0;
  void Size(int64_t rows, int64_t row_words) {
    ld = row_words;
    words = buffer.Words(rows * row_words);
  }
};

// amx_tile_product on pair words (always bf16-rounded); whole tiles, the scale after the product.
// Holds this thread's tile configuration from construction to destruction.
class AmxForward {
 public:
  // Value heads as wide as the query heads only (attention_forward falls back otherwise).
  AmxForward(int64_t T, int64_t D, int64_t /*Dv: D*/, bool /*round: always*/)
      : D_(D), d_pairs_((D + 1) / 2) {
    key_t_.Size(RoundUp16(d_pairs_), RoundUp32(T));
    value_.Size(RoundUp16((T + 1) / 2), RoundUp32(D));
    query_.Size(RoundUp32(kTile), RoundUp16(d_pairs_));
    prob_.Size(RoundUp32(kTile), RoundUp16(kTile / 2));
    amx_tiles_begin();
  }
  ~AmxForward() { amx_tiles_end(); }
  AmxForward(const AmxForward&) = delete;
  AmxForward& operator=(const AmxForward&) = delete;
  void Head(const float* K, int64_t ldk, const float* V, int64_t ldv, int64_t n) {
    pack_pairs_rows_transposed(K, ldk, n, D_, key_t_.words, key_t_.ld);
    pack_pairs_columns(V, ldv, n, D_, value_.words, value_.ld);
  }
  void Query(const float* Q, int64_t ldq, int64_t rows) {
    pack_pairs_rows(Q, ldq, rows, D_, query_.words, query_.ld);
  }
  void Scores(float* S, int64_t /*r0*/, int64_t c0, int64_t rows, int64_t cols, float scale) {
    amx_tile_product(query_.words, query_.ld, key_t_.words + c0, key_t_.ld, d_pairs_, S, kTile,
                     rows, cols, false);
    ScaleTile(S, rows, cols, scale);
  }
  void AddValues(const float* S, float* acc, int64_t /*r0*/, int64_t c0, int64_t rows,
                 int64_t cols) {
    pack_pairs_rows(S, kTile, rows, cols, prob_.words, prob_.ld);
    amx_tile_product(prob_.words, prob_.ld, value_.words + c0 / 2 * value_.ld, value_.ld,
                     (cols + 1) / 2, acc, D_, rows, D_, c0 != 0);
  }

 private:
  int64_t D_, d_pairs_;
  Pairs key_t_, value_, query_, prob_;  // B of K^T, B of V, A of Q, A of P
};

class AmxBackward {
 public:
  AmxBackward(int64_t T, int64_t D, int64_t /*Dv: D*/, bool /*round: always*/)
      : D_(D), d_pairs_((D + 1) / 2) {
    key_t_.Size(RoundUp16(d_pairs_), RoundUp32(T));
    value_t_.Size(RoundUp16(d_pairs_), RoundUp32(T));
    key_.Size(RoundUp16((T + 1) / 2), RoundUp32(D));
    for (Pairs* a : {&q_a_, &do_a_}) a->Size(RoundUp32(kTile), RoundUp16(d_pairs_));
    for (Pairs* b : {&q_b_, &do_b_}) b->Size(RoundUp16(kTile / 2), RoundUp32(D));
    for (Pairs* a : {&ds_a_, &p_t_, &ds_t_}) a->Size(RoundUp32(kTile), RoundUp16(kTile / 2));
    amx_tiles_begin();
  }
  ~AmxBackward() { amx_tiles_end(); }
  AmxBackward(const AmxBackward&) = delete;
  AmxBackward& operator=(const AmxBackward&) = delete;
  void Head(const float* K, int64_t ldk, const float* V, int64_t ldv, int64_t n) {
    pack_pairs_rows_transposed(K, ldk, n, D_, key_t_.words, key_t_.ld);
    pack_pairs_rows_transposed(V, ldv, n, D_, value_t_.words, value_t_.ld);
    pack_pairs_columns(K, ldk, n, D_, key_.words, key_.ld);
  }
  void Query(const float* Q, int64_t ldq, const float* dO, int64_t ldo, int64_t rows) {
    pack_pairs_rows(Q, ldq, rows, D_, q_a_.words, q_a_.ld);
    pack_pairs_rows(dO, ldo, rows, D_, do_a_.words, do_a_.ld);
    pack_pairs_columns(Q, ldq, rows, D_, q_b_.words, q_b_.ld);
    pack_pairs_columns(dO, ldo, rows, D_, do_b_.words, do_b_.ld);
  }
  void Scores(float* P, float* dS, int64_t /*r0*/, int64_t c0, int64_t rows, int64_t cols,
              float scale) {
    amx_tile_product(q_a_.words, q_a_.ld, key_t_.words + c0, key_t_.ld, d_pairs_, P, kTile, rows,
                     cols, false);
    ScaleTile(P, rows, cols, scale);
    amx_tile_product(do_a_.words, do_a_.ld, value_t_.words + c0, value_t_.ld, d_pairs_, dS, kTile,
                     rows, cols, false);
  }
  void Accumulate(const float* P, const float* dS, float* dV, int64_t ldv, float* dK, int64_t ldk,
                  float* dQ, int64_t ldq, int64_t /*r0*/, int64_t c0, int64_t rows, int64_t cols) {
    const int64_t row_pairs = (rows + 1) / 2;
    pack_pairs_columns_transposed(P, kTile, rows, cols, p_t_.words, p_t_.ld);
    pack_pairs_columns_transposed(dS, kTile, rows, cols, ds_t_.words, ds_t_.ld);
    pack_pairs_rows(dS, kTile, rows, cols, ds_a_.words, ds_a_.ld);
    amx_tile_product(p_t_.words, p_t_.ld, do_b_.words, do_b_.ld, row_pairs, dV, ldv, cols, D_,
                     true);
    amx_tile_product(ds_t_.words, ds_t_.ld, q_b_.words, q_b_.ld, row_pairs, dK, ldk, cols, D_,
                     true);
    amx_tile_product(ds_a_.words, ds_a_.ld, key_.words + c0 / 2 * key_.ld, key_.ld, (cols + 1) / 2,
                     dQ, ldq, rows, D_, c0 != 0);
  }

 private:
  int64_t D_, d_pairs_;
  // B of K^T, V^T and K; A and B of the query tile's Q and dO; A of dS, P^T and dS^T
  Pairs key_t_, value_t_, key_, q_a_, do_a_, q_b_, do_b_, ds_a_, p_t_, ds_t_;
};

// The end of the document that starts at row `begin` of a sequence of T rows: the next row whose
// position is 0, or T. Without positions the sequence is one document.
int64_t DocumentEnd(const int32_t* positions, int64_t begin, int64_t T) {
  if (!positions) return T;
  int64_t end = begin + 1;
  while (end < T && positions[end] != 0) ++end;
  return end;
}

template <class Tiles>
void Forward(float* out, float* lse, const float* q, const float* k, const float* v, int64_t B,
             int64_t T, int64_t H, int64_t KV, int64_t D, int64_t Dv, const int32_t* positions,
             bool round) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t group = H / KV;
  const int64_t ldq = H * D, ldk = KV * D, ldo = H * Dv, ldv = KV * Dv;
#pragma omp parallel
  {
    Tiles tiles(T, D, Dv, round);
    // S: scores, then probabilities of one tile; acc: the unnormalised output of one query tile.
    std::vector<float> S(kTile * kTile), acc(kTile * Dv), run_max(kTile), run_sum(kTile);
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t b = bh / H, h = bh % H, g = h / group;
      const int32_t* row_positions = positions ? positions + b * T : nullptr;
      // Each document [s, s + n) of the row as a sequence of its own: its tiles start at s.
      for (int64_t s = 0, n = 0; s < T; s += n) {
        n = DocumentEnd(row_positions, s, T) - s;
        const float* Q = q + (b * T + s) * ldq + h * D;
        float* O = out + (b * T + s) * ldo + h * Dv;
        float* L = lse + bh * T + s;
        tiles.Head(k + (b * T + s) * ldk + g * D, ldk, v + (b * T + s) * ldv + g * Dv, ldv, n);
        for (int64_t r0 = 0; r0 < n; r0 += kTile) {
          const int64_t rows = std::min(kTile, n - r0);
          tiles.Query(Q + r0 * ldq, ldq, rows);
          for (int64_t c0 = 0; c0 < r0 + rows; c0 += kTile) {
            const int64_t cols = std::min(kTile, n - c0);
            tiles.Scores(S.data(), r0, c0, rows, cols, scale);
            OnlineSoftmax(S.data(), rows, cols, r0, c0, round, run_max.data(), run_sum.data(),
                          acc.data(), Dv);
            tiles.AddValues(S.data(), acc.data(), r0, c0, rows, cols);
          }
          for (int64_t i = 0; i < rows; ++i) {
            const float inv = 1.0f / run_sum[i];
            for (int64_t d = 0; d < Dv; ++d) O[(r0 + i) * ldo + d] = acc[i * Dv + d] * inv;
            L[r0 + i] = run_max[i] + std::log(run_sum[i]);
          }
        }
      }
    }
  }
}

template <class Tiles>
void Backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
              const float* lse, const float* q, const float* k, const float* v, int64_t B,
              int64_t T, int64_t H, int64_t KV, int64_t D, int64_t Dv, const int32_t* positions,
              bool round) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t group = H / KV;
  const int64_t ldq = H * D, ldk = KV * D, ldo = H * Dv, ldv = KV * Dv;
#pragma omp parallel
  {
    Tiles tiles(T, D, Dv, round);
    // P: recomputed probabilities of one tile; dS: dP = dO V^T, then the score gradient;
    // delta: rowsum(dO * O) of the query tile.
    std::vector<float> P(kTile * kTile), dS(kTile * kTile), delta(kTile);
#pragma omp for schedule(static)
    for (int64_t bg = 0; bg < B * KV; ++bg) {
      const int64_t b = bg / KV, g = bg % KV;
      const int32_t* row_positions = positions ? positions + b * T : nullptr;
      for (int64_t t = 0; t < T; ++t) {
        std::memset(dk + (b * T + t) * ldk + g * D, 0, D * sizeof(float));
        std::memset(dv + (b * T + t) * ldv + g * Dv, 0, Dv * sizeof(float));
      }
      // Document by document (forward's), head by head inside one: a key row's terms come from
      // its own document's queries, in head order, then query tile, then key tile.
      for (int64_t s = 0, n = 0; s < T; s += n) {
        n = DocumentEnd(row_positions, s, T) - s;
        float* dK = dk + (b * T + s) * ldk + g * D;
        float* dV = dv + (b * T + s) * ldv + g * Dv;
        tiles.Head(k + (b * T + s) * ldk + g * D, ldk, v + (b * T + s) * ldv + g * Dv, ldv, n);
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          const float* Q = q + (b * T + s) * ldq + h * D;
          const float* dO = dout + (b * T + s) * ldo + h * Dv;
          const float* O = out + (b * T + s) * ldo + h * Dv;
          const float* L = lse + (b * H + h) * T + s;
          float* dQ = dq + (b * T + s) * ldq + h * D;
          for (int64_t r0 = 0; r0 < n; r0 += kTile) {
            const int64_t rows = std::min(kTile, n - r0);
            for (int64_t i = 0; i < rows; ++i)
              delta[i] = lane_dot(dO + (r0 + i) * ldo, O + (r0 + i) * ldo, Dv);
            tiles.Query(Q + r0 * ldq, ldq, dO + r0 * ldo, ldo, rows);
            for (int64_t c0 = 0; c0 < r0 + rows; c0 += kTile) {
              const int64_t cols = std::min(kTile, n - c0);
              tiles.Scores(P.data(), dS.data(), r0, c0, rows, cols, scale);
              ScoreGradient(P.data(), dS.data(), rows, cols, r0, c0, round, L + r0, delta.data(),
                            scale);
              tiles.Accumulate(P.data(), dS.data(), dV + c0 * ldv, ldv, dK + c0 * ldk, ldk,
                               dQ + r0 * ldq, ldq, r0, c0, rows, cols);
            }
          }
        }
      }
    }
  }
}
}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       int64_t B, int64_t T, int64_t H, int64_t KV, HeadDims D, bool bf16_operands,
                       Bf16Gemm products, const int32_t* positions) {
  ScopedKernelTimer profile_timer(AttentionForwardCost(B, T, H, KV, D));
  // The AMX tiles have one head width: value heads of another width take the micro-kernels (the
  // same roundings).
  if (bf16_operands && products == Bf16Gemm::kAmx && D.v == D.qk)
    Forward<AmxForward>(out, lse, q, k, v, B, T, H, KV, D.qk, D.v, positions, true);
  else
    Forward<MicroForward>(out, lse, q, k, v, B, T, H, KV, D.qk, D.v, positions, bf16_operands);
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                        const float* lse, const float* q, const float* k, const float* v, int64_t B,
                        int64_t T, int64_t H, int64_t KV, HeadDims D, bool bf16_operands,
                        Bf16Gemm products, const int32_t* positions) {
  ScopedKernelTimer profile_timer(AttentionBackwardCost(B, T, H, KV, D));
  if (bf16_operands && products == Bf16Gemm::kAmx && D.v == D.qk)
    Backward<AmxBackward>(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, D.qk, D.v, positions,
                          true);
  else
    Backward<MicroBackward>(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, D.qk, D.v, positions,
                            bf16_operands);
}

}  // namespace crucible::kernels
