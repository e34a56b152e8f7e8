// The decode step's kernels: every output element computed by one thread in a fixed order.
//
// Every dot product is lanes.h's lane_dot, bit for bit: a 16-lane vector holds its 16 lanes,
// each lane a product rounded and then added (the build has no FMA contraction) in index order,
// the row's last n % 16 products added to its first lanes only; then lane_dot's closing tree,
// run on 16 dot products at once by shuffles (Wide::Reduce, Narrow::Reduce). Register blocks
// (several inputs and weight rows, several key positions, several heads' value sums) only share
// loads between dot products; no product's order depends on the block it is in, so a row's
// results do not depend on the batch around it or on the thread count. The kernels are written
// once on a width's vector type and compiled for AVX-512 (Wide: one zmm) and for the build's AVX2
// (Narrow: two ymm), chosen with the tile products (tile_isa(), attention_tiles.h; the same bits
// either way: tests/unit/kernels/decode_test.cc runs both).
#include "kernels/cpu/decode.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/attention_tiles.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/lanes.h"
#include "kernels/cpu/vec16.h"
#include "kernels/cpu/vec_math.h"

namespace crucible::kernels {

namespace {

#define DECODE_INLINE [[gnu::always_inline]] inline

using F8 = float __attribute__((vector_size(32)));
using I8 = int32_t __attribute__((vector_size(32)));
using vec16::F;
using vec16::I;
using vec16::kWidth;

// Weights w[k, k + 8) as float32: loaded, or widened exactly from 16 bits (fp16: F16C's
// vcvtph2ps, part of the build's baseline; bf16: a 16-bit shift).
template <WeightType kType>
DECODE_INLINE F8 Widen8(const void* w, int64_t k) {
  if constexpr (kType == WeightType::kF32) {
    F8 v;
    std::memcpy(&v, static_cast<const float*>(w) + k, sizeof(v));
    return v;
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(w) + k;
    if constexpr (kType == WeightType::kF16) {
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    } else {
      using U16 = uint16_t __attribute__((vector_size(16)));
      U16 bits;
      std::memcpy(&bits, p, sizeof(bits));
      const I8 wide = __builtin_convertvector(bits, I8) << 16;
      F8 v;
      std::memcpy(&v, &wide, sizeof(v));
      return v;
    }
  }
}

// Weight k of a row as float32, for the tail of a row.
template <WeightType kType>
DECODE_INLINE float Widen1(const void* w, int64_t k) {
  if constexpr (kType == WeightType::kF32) return static_cast<const float*>(w)[k];
  if constexpr (kType == WeightType::kF16) return FromFp16(static_cast<const uint16_t*>(w)[k]);
  return FromBf16(static_cast<const uint16_t*>(w)[k]);
}

// The closing tree on 8-lane vectors: acc8[m] holds product m's lanes l + lane l + 8 (step 8
// done); steps 4, 2 and 1 (lane l + lane l + width) on 8 products at once, within 128-bit halves
// where they can (vshufps). Result lane m: product m.
DECODE_INLINE F8 Tree8(const F8* acc8) {
  // Step 4 on a, b -> [a lanes 0-3 | b lanes 0-3] + [a 4-7 | b 4-7].
  const auto step4 = [](F8 a, F8 b) {
    return __builtin_shuffle(a, b, I8{0, 1, 2, 3, 8, 9, 10, 11}) +
           __builtin_shuffle(a, b, I8{4, 5, 6, 7, 12, 13, 14, 15});
  };
  // Step 2 on [a | b], [c | d] -> [a c | b d] (2 lanes each); step 1 on [a c | b d],
  // [e g | f h] -> [a c e g | b d f h] (1 lane each).
  const auto step2 = [](F8 x, F8 y) {
    return __builtin_shuffle(x, y, I8{0, 1, 8, 9, 4, 5, 12, 13}) +
           __builtin_shuffle(x, y, I8{2, 3, 10, 11, 6, 7, 14, 15});
  };
  const auto step1 = [](F8 x, F8 y) {
    return __builtin_shuffle(x, y, I8{0, 2, 8, 10, 4, 6, 12, 14}) +
           __builtin_shuffle(x, y, I8{1, 3, 9, 11, 5, 7, 13, 15});
  };
  // [0 | 4] [1 | 5] [2 | 6] [3 | 7] -> [0 1 | 4 5], [2 3 | 6 7] -> [0 1 2 3 | 4 5 6 7].
  return step1(step2(step4(acc8[0], acc8[4]), step4(acc8[1], acc8[5])),
               step2(step4(acc8[2], acc8[6]), step4(acc8[3], acc8[7])));
}

// ---- the two widths ----
// W::V holds the 16 lanes of one lane_dot; the kernels below are written once on W's operations
// (+ and * lane by lane, each rounded: the build has no FMA contraction) and compiled for
// both.

// AVX-512: a V is one zmm register (vec16.h's vector).
struct Wide {
  static constexpr bool kWide = true;
  using V = F;
  // x in every lane, as a shuffle of lane 0 (vbroadcastss; GCC builds F{x, x, ...} lane by lane)
  DECODE_INLINE static V Splat(float x) { return __builtin_shuffle(V{x}, I{}); }
  DECODE_INLINE static V Load(const float* p) { return vec16::Load(p); }
  DECODE_INLINE static V LoadFirst(const float* p, int64_t n) { return vec16::LoadFirst(p, n); }
  DECODE_INLINE static void Store(float* p, V v) { vec16::Store(p, v); }
  DECODE_INLINE static void StoreFirst(float* p, V v, int64_t n) { vec16::StoreFirst(p, v, n); }
  // acc + x on lanes l < n, acc on the others (a lane_sum's last k % 16 terms).
  DECODE_INLINE static V AddFirst(V acc, V x, int64_t n) {
    return vec16::FirstLanes(n) ? acc + x : acc;
  }
  template <WeightType kType>
  DECODE_INLINE static V Widen(const void* w, int64_t k) {
    if constexpr (kType == WeightType::kF32) return vec16::Load(static_cast<const float*>(w) + k);
    const F8 lo = Widen8<kType>(w, k), hi = Widen8<kType>(w, k + 8);
    return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  }
  // One step of the tree (lane l + lane l + width) on two vectors of partial lanes, each add
  // keeping lane l first: step 8 on two products -> [a's 8 | b's 8]; step 4 on [a|b], [c|d] ->
  // [a b c d] (4 lanes each), both moving whole 128-bit quarters (vshuff32x4); steps 2 and 1
  // within each quarter (vshufps): step 2 on [a b c d], [e f g h] -> [a e | b f | c g | d h]
  // (2 lanes each), step 1 on that and [i m | j n | k o | l p] -> [a e i m | b f j n | ...].
  template <int kStep>
  DECODE_INLINE static V TreeStep(V a, V b) {
    if constexpr (kStep == 8)
      return __builtin_shuffle(a, b, I{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}) +
             __builtin_shuffle(a, b,
                               I{8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31});
    else if constexpr (kStep == 4)
      return __builtin_shuffle(a, b, I{0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27}) +
             __builtin_shuffle(a, b, I{4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31});
    else if constexpr (kStep == 2)
      return __builtin_shuffle(a, b, I{0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29}) +
             __builtin_shuffle(a, b, I{2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31});
    else
      return __builtin_shuffle(a, b, I{0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28, 30}) +
             __builtin_shuffle(a, b, I{1, 3, 17, 19, 5, 7, 21, 23, 9, 11, 25, 27, 13, 15, 29, 31});
  }
  // Lane m: lane_sum's tree (width 8, 4, 2, 1) on the 16 lanes of acc[m], m < kCount <= 16
  // (lanes from kCount on repeat the last product). The steps above leave product s in lane
  // 4 (s % 4) + s / 4, so product 4 (s % 4) + s / 4 goes in as the s-th.
  template <int kCount>
  DECODE_INLINE static V Reduce(const V* acc) {
    static_assert(kCount >= 1 && kCount <= kWidth);
    constexpr auto in = [](int s) { return std::min(4 * (s % 4) + s / 4, kCount - 1); };
    V s8[8], s4[4], s2[2];
    for (int m = 0; m < 8; ++m) s8[m] = TreeStep<8>(acc[in(2 * m)], acc[in(2 * m + 1)]);
    for (int m = 0; m < 4; ++m) s4[m] = TreeStep<4>(s8[2 * m], s8[2 * m + 1]);
    for (int m = 0; m < 2; ++m) s2[m] = TreeStep<2>(s4[2 * m], s4[2 * m + 1]);
    return TreeStep<1>(s2[0], s2[1]);
  }
};

// AVX2: a V is two ymm registers, lanes 0-7 and 8-15 (GCC lowers vec16's 64-byte vectors for
// AVX2 through memory in these loops, so the halves are explicit here).
struct Narrow {
  static constexpr bool kWide = false;
  struct V {
    F8 lo, hi;
    DECODE_INLINE friend V operator+(V a, V b) { return {a.lo + b.lo, a.hi + b.hi}; }
    DECODE_INLINE friend V operator*(V a, V b) { return {a.lo * b.lo, a.hi * b.hi}; }
  };
  DECODE_INLINE static V Splat(float x) {
    const F8 v = __builtin_shuffle(F8{x}, I8{});
    return {v, v};
  }
  DECODE_INLINE static V Load(const float* p) {
    V v;
    std::memcpy(&v.lo, p, sizeof(F8));
    std::memcpy(&v.hi, p + 8, sizeof(F8));
    return v;
  }
  DECODE_INLINE static V LoadFirst(const float* p, int64_t n) {
    float lanes[kWidth] = {};
    for (int64_t l = 0; l < n; ++l) lanes[l] = p[l];
    return Load(lanes);
  }
  DECODE_INLINE static void Store(float* p, V v) {
    std::memcpy(p, &v.lo, sizeof(F8));
    std::memcpy(p + 8, &v.hi, sizeof(F8));
  }
  DECODE_INLINE static void StoreFirst(float* p, V v, int64_t n) {
    float lanes[kWidth];
    Store(lanes, v);
    for (int64_t l = 0; l < n; ++l) p[l] = lanes[l];
  }
  DECODE_INLINE static V AddFirst(V acc, V x, int64_t n) {
    const I8 iota = {0, 1, 2, 3, 4, 5, 6, 7};
    const I8 lo = iota < static_cast<int32_t>(n), hi = iota + 8 < static_cast<int32_t>(n);
    return {lo ? acc.lo + x.lo : acc.lo, hi ? acc.hi + x.hi : acc.hi};
  }
  template <WeightType kType>
  DECODE_INLINE static V Widen(const void* w, int64_t k) {
    return {Widen8<kType>(w, k), Widen8<kType>(w, k + 8)};
  }
  // As Wide::Reduce: step 8 adds each product's halves, Tree8 the rest.
  template <int kCount>
  DECODE_INLINE static V Reduce(const V* acc) {
    static_assert(kCount >= 1 && kCount <= kWidth);
    F8 halves[kWidth];
    for (int m = 0; m < kWidth; ++m) {
      const V& a = acc[std::min(m, kCount - 1)];
      halves[m] = a.lo + a.hi;
    }
    const F8 lo = Tree8(halves);
    return {lo, kCount <= 8 ? lo : Tree8(halves + 8)};
  }
};

// ---- matmul_rows ----

// kRows consecutive input rows x (row stride C) against the kCols weight rows w[c] (C elements
// of kType each): result lane r * kCols + c is lane_dot(x + r * C, widened w[c], C), bit for bit.
// Each weight vector is loaded (and widened) once for the kRows rows, each input vector once for
// the kCols weight rows.
template <class W, WeightType kType, int kRows, int kCols>
DECODE_INLINE typename W::V DotBlock(const float* x, int64_t C, const void* const* w) {
  using V = typename W::V;
  V acc[kRows * kCols];
  for (V& a : acc) a = W::Splat(0.0f);
  int64_t k = 0;
  for (; k + kWidth <= C; k += kWidth) {
    V wk[kCols];
    for (int c = 0; c < kCols; ++c) wk[c] = W::template Widen<kType>(w[c], k);
    for (int r = 0; r < kRows; ++r) {
      const V xk = W::Load(x + r * C + k);
      for (int c = 0; c < kCols; ++c) acc[r * kCols + c] = acc[r * kCols + c] + xk * wk[c];
    }
  }
  if (k < C) {
    float tail[kCols][kWidth] = {};
    for (int c = 0; c < kCols; ++c)
      for (int64_t l = 0; k + l < C; ++l) tail[c][l] = Widen1<kType>(w[c], k + l);
    for (int r = 0; r < kRows; ++r) {
      const V xk = W::LoadFirst(x + r * C + k, C - k);
      for (int c = 0; c < kCols; ++c)
        acc[r * kCols + c] = W::AddFirst(acc[r * kCols + c], xk * W::Load(tail[c]), C - k);
    }
  }
  return W::template Reduce<kRows * kCols>(acc);
}

// out[r * OC + c] for r < kRows, c < cols (<= kCols) from DotBlock (w[c] for c >= cols repeats a
// row that exists; its results are dropped).
template <class W, WeightType kType, int kRows, int kCols>
DECODE_INLINE void StoreBlock(float* out, int64_t OC, const float* x, int64_t C,
                              const void* const* w, int64_t cols) {
  float sums[kWidth];
  W::Store(sums, DotBlock<W, kType, kRows, kCols>(x, C, w));
  for (int r = 0; r < kRows; ++r) {
    if (cols == kCols)
      std::memcpy(out + r * OC, sums + r * kCols, sizeof(float) * kCols);
    else
      for (int64_t c = 0; c < cols; ++c) out[r * OC + c] = sums[r * kCols + c];
  }
}

// Output columns [begin, end) of out (N, OC) from weight rows [begin, end): blocks of kRows
// input rows by kCols weight rows (kRows * kCols <= 16 dot products, one vector of results),
// the last rows of the batch in a smaller block. Which block computes an element does not change
// its bits.
template <class W, WeightType kType, int kRows, int kCols>
DECODE_INLINE void RowsRange(float* out, const float* inp, const void* weight, int64_t N, int64_t C,
                             int64_t OC, int64_t begin, int64_t end) {
  static_assert(kRows <= 4 && kRows * kCols <= kWidth);
  const size_t row_bytes = static_cast<size_t>(C) * WeightTypeBytes(kType);
  // Rows in chunks of about 24 KiB (half of a 48 KiB L1), so a chunk's rows stay in L1 while
  // its blocks run over every column.
  const int64_t chunk =
      std::max<int64_t>(kRows, (24 << 10) / (std::max<int64_t>(C, 1) * 4 * kRows) * kRows);
  for (int64_t i0 = 0; i0 < N; i0 += chunk) {
    const int64_t i1 = std::min(N, i0 + chunk);
    for (int64_t j = begin; j < end; j += kCols) {
      const int64_t cols = std::min<int64_t>(kCols, end - j);
      const void* w[kCols];
      for (int c = 0; c < kCols; ++c)
        w[c] = static_cast<const char*>(weight) +
               static_cast<size_t>(j + std::min<int64_t>(c, cols - 1)) * row_bytes;
      float* o = out + j;
      int64_t i = i0;
      for (; i + kRows <= i1; i += kRows)
        StoreBlock<W, kType, kRows, kCols>(o + i * OC, OC, inp + i * C, C, w, cols);
      switch (i1 - i) {
        case 3:
          StoreBlock<W, kType, 3, kCols>(o + i * OC, OC, inp + i * C, C, w, cols);
          break;
        case 2:
          StoreBlock<W, kType, 2, kCols>(o + i * OC, OC, inp + i * C, C, w, cols);
          break;
        case 1:
          StoreBlock<W, kType, 1, kCols>(o + i * OC, OC, inp + i * C, C, w, cols);
          break;
        default:
          break;
      }
    }
  }
}

template <class W, int kRows, int kCols>
DECODE_INLINE void RowsRangeTyped(float* out, const float* inp, RowWeights weight, int64_t N,
                                  int64_t C, int64_t OC, int64_t begin, int64_t end) {
  switch (weight.type) {
    case WeightType::kF32:
      return RowsRange<W, WeightType::kF32, kRows, kCols>(out, inp, weight.data, N, C, OC, begin,
                                                          end);
    case WeightType::kF16:
      return RowsRange<W, WeightType::kF16, kRows, kCols>(out, inp, weight.data, N, C, OC, begin,
                                                          end);
    case WeightType::kBF16:
      return RowsRange<W, WeightType::kBF16, kRows, kCols>(out, inp, weight.data, N, C, OC, begin,
                                                           end);
  }
}

// Blocks of 4 rows x 4 columns on AVX-512 (16 accumulators of 32 zmm registers), 4 x 1 on AVX2
// (8 of 16 ymm registers).
__attribute__((target("avx512f"))) void RowsRangeAvx512(float* out, const float* inp,
                                                        RowWeights weight, int64_t N, int64_t C,
                                                        int64_t OC, int64_t begin, int64_t end) {
  RowsRangeTyped<Wide, 4, 4>(out, inp, weight, N, C, OC, begin, end);
}
void RowsRangeAvx2(float* out, const float* inp, RowWeights weight, int64_t N, int64_t C,
                   int64_t OC, int64_t begin, int64_t end) {
  RowsRangeTyped<Narrow, 4, 1>(out, inp, weight, N, C, OC, begin, end);
}

// ---- decode_attention ----

// The scores of one query row against positions [0, length) of one KV head (position stride
// `stride`): scores[t] = lane_dot(query, k + t * stride, Dk) * scale, kPositions positions a
// block (scores written up to the next multiple of kPositions past length: a block's positions
// past the end repeat the last one). kChunks > 0: Dk = 16 kChunks, the query held in registers;
// 0: any Dk.
template <class W, int kPositions, int kChunks>
DECODE_INLINE void Scores(float* scores, const float* query, const float* k, int64_t stride,
                          int64_t length, int64_t Dk, float scale) {
  using V = typename W::V;
  V q[kChunks > 0 ? kChunks : 1];
  for (int c = 0; c < kChunks; ++c) q[c] = W::Load(query + c * kWidth);
  // The dot products of positions t0 + p, p < kPositions (the last one repeated from `count`).
  const auto block = [&](int64_t t0, int64_t count) {
    V acc[kPositions];
    for (V& a : acc) a = W::Splat(0.0f);
    if constexpr (kChunks > 0) {
      for (int p = 0; p < kPositions; ++p) {
        const float* key = k + (t0 + std::min<int64_t>(p, count - 1)) * stride;
        for (int c = 0; c < kChunks; ++c) acc[p] = acc[p] + q[c] * W::Load(key + c * kWidth);
      }
    } else {
      const float* key[kPositions];
      for (int p = 0; p < kPositions; ++p)
        key[p] = k + (t0 + std::min<int64_t>(p, count - 1)) * stride;
      int64_t d = 0;
      for (; d + kWidth <= Dk; d += kWidth) {
        const V qd = W::Load(query + d);
        for (int p = 0; p < kPositions; ++p) acc[p] = acc[p] + qd * W::Load(key[p] + d);
      }
      if (d < Dk) {
        const V qd = W::LoadFirst(query + d, Dk - d);
        for (int p = 0; p < kPositions; ++p)
          acc[p] = W::AddFirst(acc[p], qd * W::LoadFirst(key[p] + d, Dk - d), Dk - d);
      }
    }
    const V s = W::template Reduce<kPositions>(acc) * W::Splat(scale);
    if constexpr (kPositions == kWidth) {
      W::Store(scores + t0, s);
    } else {
      float lanes[kWidth];
      W::Store(lanes, s);
      std::memcpy(scores + t0, lanes, sizeof(float) * kPositions);
    }
  };
  int64_t t0 = 0;
  for (; t0 + kPositions <= length; t0 += kPositions) block(t0, kPositions);
  if (t0 < length) block(t0, length - t0);
}

// o[h][d, d + 16 kChunks) (o[h] = out + h * Dv) for kHeads heads: the sum over t of p[h][t] *
// v[t * stride + d ...] in position order, from 0; p[h] = probs + h * probs_stride. `tail` <= 16:
// the values in the last chunk (a shorter one is read and written lane by lane).
template <class W, int kHeads, int kChunks>
DECODE_INLINE void ValueSums(float* out, int64_t Dv, const float* probs, int64_t probs_stride,
                             const float* v, int64_t stride, int64_t length, int64_t d,
                             int64_t tail) {
  using V = typename W::V;
  V acc[kHeads][kChunks];
  for (auto& head : acc)
    for (V& a : head) a = W::Splat(0.0f);
  const auto add = [&](int64_t t, const V* vd) {
    for (int h = 0; h < kHeads; ++h) {
      const V p = W::Splat(probs[h * probs_stride + t]);
      for (int c = 0; c < kChunks; ++c) acc[h][c] = acc[h][c] + p * vd[c];
    }
  };
  if (tail == kWidth) {
    for (int64_t t = 0; t < length; ++t) {
      V vd[kChunks];
      for (int c = 0; c < kChunks; ++c) vd[c] = W::Load(v + t * stride + d + c * kWidth);
      add(t, vd);
    }
  } else {
    for (int64_t t = 0; t < length; ++t) {
      V vd[kChunks];
      for (int c = 0; c + 1 < kChunks; ++c) vd[c] = W::Load(v + t * stride + d + c * kWidth);
      vd[kChunks - 1] = W::LoadFirst(v + t * stride + d + (kChunks - 1) * kWidth, tail);
      add(t, vd);
    }
  }
  for (int h = 0; h < kHeads; ++h) {
    for (int c = 0; c + 1 < kChunks; ++c) W::Store(out + h * Dv + d + c * kWidth, acc[h][c]);
    W::StoreFirst(out + h * Dv + d + (kChunks - 1) * kWidth, acc[h][kChunks - 1], tail);
  }
}

// ValueSums for `heads` (1..kMaxHeads) heads.
template <class W, int kMaxHeads, int kChunks>
DECODE_INLINE void ValueSumsFor(int64_t heads, float* out, int64_t Dv, const float* probs,
                                int64_t probs_stride, const float* v, int64_t stride,
                                int64_t length, int64_t d, int64_t tail) {
  if constexpr (kMaxHeads >= 1) {
    if (heads == kMaxHeads)
      return ValueSums<W, kMaxHeads, kChunks>(out, Dv, probs, probs_stride, v, stride, length, d,
                                              tail);
    ValueSumsFor<W, kMaxHeads - 1, kChunks>(heads, out, Dv, probs, probs_stride, v, stride, length,
                                            d, tail);
  }
}

// The `group` query heads of one sequence that read one KV head: out and q at the group's first
// head, k and v at the KV head's position 0 (position strides k_stride, v_stride). `scores`:
// group * padded floats, padded = length rounded up to 16. Scores kPositions positions a block;
// value sums kHeads heads by kChunks vectors at once (each value vector loaded once for them).
template <class W, int kPositions, int kHeads, int kChunks>
DECODE_INLINE void AttendGroup(float* out, const float* q, const float* k, const float* v,
                               int64_t k_stride, int64_t v_stride, int64_t length, int64_t group,
                               HeadDims D, float* scores) {
  const int64_t Dk = D.qk, Dv = D.v, padded = (length + kWidth - 1) / kWidth * kWidth;
  const float scale = 1.0f / std::sqrt(static_cast<float>(Dk));
  for (int64_t h = 0; h < group; ++h) {
    float* s = scores + h * padded;
    W::Store(s + padded - kWidth, W::Splat(0.0f));  // the padding Scores leaves, defined
    if (Dk == 32)
      Scores<W, kPositions, 2>(s, q + h * Dk, k, k_stride, length, Dk, scale);
    else if (Dk == 64)
      Scores<W, kPositions, 4>(s, q + h * Dk, k, k_stride, length, Dk, scale);
    else
      Scores<W, kPositions, 0>(s, q + h * Dk, k, k_stride, length, Dk, scale);
    // The softmax: lane_max, exp_fast and lane_sum (vec16.h's loops: their bits, on AVX-512; the
    // scalar definitions on AVX2), then s[t] * inverse.
    float inverse;
    if constexpr (W::kWide) {
      const float m = vec16::Max</*kPadded=*/true>(s, length);
      inverse = 1.0f / vec16::ExpShiftedSum</*kPadded=*/true>(s, s, length, m);
    } else {
      const float m = lane_max(s, length);
      for (int64_t t = 0; t < length; ++t) s[t] = exp_fast(s[t] - m);
      inverse = 1.0f / lane_sum(s, length);
    }
    for (int64_t t = 0; t < length; t += kWidth)
      W::Store(s + t, W::Load(s + t) * W::Splat(inverse));
  }
  for (int64_t h = 0; h < group; h += kHeads) {
    const int64_t heads = std::min<int64_t>(kHeads, group - h);
    int64_t d = 0;
    for (; d + kChunks * kWidth <= Dv; d += kChunks * kWidth)
      ValueSumsFor<W, kHeads, kChunks>(heads, out + h * Dv, Dv, scores + h * padded, padded, v,
                                       v_stride, length, d, kWidth);
    for (; d < Dv; d += kWidth)
      ValueSumsFor<W, kHeads, 1>(heads, out + h * Dv, Dv, scores + h * padded, padded, v, v_stride,
                                 length, d, std::min<int64_t>(kWidth, Dv - d));
  }
}

// Scores 16 positions a block on AVX-512 (16 accumulators), 4 on AVX2; the value sums of up to 4
// heads by 32 values (8 accumulators) on AVX-512, 2 heads by 32 on AVX2.
__attribute__((target("avx512f"))) void AttendGroupAvx512(float* out, const float* q,
                                                          const float* k, const float* v,
                                                          int64_t k_stride, int64_t v_stride,
                                                          int64_t length, int64_t group, HeadDims D,
                                                          float* scores) {
  AttendGroup<Wide, 16, 4, 2>(out, q, k, v, k_stride, v_stride, length, group, D, scores);
}
void AttendGroupAvx2(float* out, const float* q, const float* k, const float* v, int64_t k_stride,
                     int64_t v_stride, int64_t length, int64_t group, HeadDims D, float* scores) {
  AttendGroup<Narrow, 4, 2, 2>(out, q, k, v, k_stride, v_stride, length, group, D, scores);
}

#undef DECODE_INLINE

}  // namespace

void matmul_rows(float* out, const float* inp, RowWeights weight, int64_t N, int64_t C,
                 int64_t OC) {
  const RowProduct product{out, weight, OC};
  matmul_rows(&product, 1, inp, N, C);
}

void matmul_rows(const RowProduct* products, int count, const float* inp, int64_t N, int64_t C) {
  int64_t total = 0;
  for (int p = 0; p < count; ++p) total += products[p].OC;
  const auto rows_range = tile_isa() == TileIsa::kAvx512 ? RowsRangeAvx512 : RowsRangeAvx2;
  // One parallel region for all the products: thread t takes the t-th contiguous share of their
  // rows taken one after the other (each output element is still one row's lane dot).
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t begin = total * t / threads, end = total * (t + 1) / threads;
    int64_t first = 0;
    for (int p = 0; p < count && first < end; ++p) {
      const RowProduct& product = products[p];
      const int64_t lo = std::max(begin - first, int64_t{0});
      const int64_t hi = std::min(end - first, product.OC);
      if (lo < hi) rows_range(product.out, inp, product.weight, N, C, product.OC, lo, hi);
      first += product.OC;
    }
  }
}

void decode_attention(float* out, const float* q, const float* const* keys,
                      const float* const* values, const int64_t* lengths, int64_t N, int64_t H,
                      int64_t KV, HeadDims D) {
  const int64_t group = H / KV, Dk = D.qk, Dv = D.v;
  int64_t longest = 0;
  for (int64_t i = 0; i < N; ++i) longest = std::max(longest, lengths[i]);
  const int64_t padded = (longest + kWidth - 1) / kWidth * kWidth;
  const auto attend = tile_isa() == TileIsa::kAvx512 ? AttendGroupAvx512 : AttendGroupAvx2;
#pragma omp parallel
  {
    // Each thread's scores (the group's heads, each padded to 16 positions) on its stack below
    // 16 Ki floats (no allocation per step).
    constexpr int64_t kStack = 1 << 14;
    const int64_t need = group * padded;
    alignas(64) float stack[kStack];
    std::vector<float> heap(need <= kStack ? 0 : static_cast<size_t>(need));
    float* scores = need <= kStack ? stack : heap.data();
    // One task per sequence and KV head: its keys and values read for the group's query heads.
#pragma omp for schedule(static)
    for (int64_t task = 0; task < N * KV; ++task) {
      const int64_t i = task / KV, kv = task % KV, h = kv * group;
      attend(out + (i * H + h) * Dv, q + (i * H + h) * Dk, keys[i] + kv * Dk, values[i] + kv * Dv,
             KV * Dk, KV * Dv, lengths[i], group, D, scores);
    }
  }
}

}  // namespace crucible::kernels
