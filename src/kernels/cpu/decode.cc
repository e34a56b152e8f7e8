// The decode step's kernels: every output element computed by one thread in a fixed order.
#include "kernels/cpu/decode.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/half.h"
#include "kernels/cpu/lanes.h"
#include "kernels/cpu/vec_math.h"

namespace crucible::kernels {

namespace {

// Weights w[k, k + 8) as float32: loaded, or widened exactly from 16 bits (fp16: F16C's
// vcvtph2ps; bf16: a 16-bit shift).
template <WeightType kType>
inline __m256 widen8(const void* w, int64_t k) {
  if constexpr (kType == WeightType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(w) + k);
  } else {
    const __m128i bits =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + k));
    if constexpr (kType == WeightType::kF16) return _mm256_cvtph_ps(bits);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
  }
}

// Weight k of a row as float32, for the tail of a row shorter than 16.
template <WeightType kType>
inline float widen1(const void* w, int64_t k) {
  if constexpr (kType == WeightType::kF32) return static_cast<const float*>(w)[k];
  if constexpr (kType == WeightType::kF16) return FromFp16(static_cast<const uint16_t*>(w)[k]);
  return FromBf16(static_cast<const uint16_t*>(w)[k]);
}

// R consecutive rows of x (row stride C) against one weight row w (n elements of kType):
// out[r * stride] is lane_dot(x + r * C, widened w, n), the same lanes and the same tree, bit for
// bit; the weight's 16 values are loaded (and widened) once for the R rows (register blocking
// over the batch).
template <WeightType kType, int R>
inline void lane_dots(const float* x, int64_t C, const void* w, int64_t n, float* out,
                      int64_t stride) {
  static_assert(kLanes == 16, "two 8-float vectors hold the 16 lanes");
  // Lanes 0-7 in lo[r], 8-15 in hi[r]: each a product rounded, then added (no FMA), in index
  // order, as lane_dot's scalar loop does.
  __m256 lo[R], hi[R];
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes) {
    const __m256 w0 = widen8<kType>(w, k), w1 = widen8<kType>(w, k + 8);
    for (int r = 0; r < R; ++r) {
      lo[r] = _mm256_add_ps(lo[r], _mm256_mul_ps(_mm256_loadu_ps(x + r * C + k), w0));
      hi[r] = _mm256_add_ps(hi[r], _mm256_mul_ps(_mm256_loadu_ps(x + r * C + k + 8), w1));
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float acc[kLanes];
    _mm256_store_ps(acc, lo[r]);
    _mm256_store_ps(acc + 8, hi[r]);
    for (int l = 0; k + l < n; ++l) acc[l] += x[r * C + k + l] * widen1<kType>(w, k + l);
    for (int width = kLanes / 2; width >= 1; width /= 2)
      for (int l = 0; l < width; ++l) acc[l] += acc[l + width];
    out[r * stride] = acc[0];
  }
}

// Output columns [begin, end) of out (N, OC) from weight rows [begin, end) of `weight`.
template <WeightType kType>
void rows_range(float* out, const float* inp, const void* weight, int64_t N, int64_t C, int64_t OC,
                int64_t begin, int64_t end) {
  const size_t row_bytes = static_cast<size_t>(C) * WeightTypeBytes(kType);
  for (int64_t j = begin; j < end; ++j) {
    const void* w = static_cast<const char*>(weight) + static_cast<size_t>(j) * row_bytes;
    int64_t i = 0;
    for (; i + 4 <= N; i += 4) lane_dots<kType, 4>(inp + i * C, C, w, C, out + i * OC + j, OC);
    switch (N - i) {
      case 3:
        lane_dots<kType, 3>(inp + i * C, C, w, C, out + i * OC + j, OC);
        break;
      case 2:
        lane_dots<kType, 2>(inp + i * C, C, w, C, out + i * OC + j, OC);
        break;
      case 1:
        lane_dots<kType, 1>(inp + i * C, C, w, C, out + i * OC + j, OC);
        break;
      default:
        break;
    }
  }
}

void rows_range(float* out, const float* inp, RowWeights weight, int64_t N, int64_t C, int64_t OC,
                int64_t begin, int64_t end) {
  switch (weight.type) {
    case WeightType::kF32:
      return rows_range<WeightType::kF32>(out, inp, weight.data, N, C, OC, begin, end);
    case WeightType::kF16:
      return rows_range<WeightType::kF16>(out, inp, weight.data, N, C, OC, begin, end);
    case WeightType::kBF16:
      return rows_range<WeightType::kBF16>(out, inp, weight.data, N, C, OC, begin, end);
  }
}

}  // namespace

void matmul_rows(float* out, const float* inp, RowWeights weight, int64_t N, int64_t C,
                 int64_t OC) {
  const RowProduct product{out, weight, OC};
  matmul_rows(&product, 1, inp, N, C);
}

void matmul_rows(const RowProduct* products, int count, const float* inp, int64_t N, int64_t C) {
  int64_t total = 0;
  for (int p = 0; p < count; ++p) total += products[p].OC;
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
  const float scale = 1.0f / std::sqrt(static_cast<float>(Dk));
  int64_t longest = 0;
  for (int64_t i = 0; i < N; ++i) longest = std::max(longest, lengths[i]);
#pragma omp parallel
  {
    // Each thread's scores on its stack below 16 Ki positions (no allocation per step).
    constexpr int64_t kStack = 1 << 14;
    float stack[kStack];
    std::vector<float> heap(longest <= kStack ? 0 : static_cast<size_t>(longest));
    float* scores = longest <= kStack ? stack : heap.data();
#pragma omp for schedule(static)
    for (int64_t row = 0; row < N * H; ++row) {
      const int64_t i = row / H, h = row % H, kv = h / group, length = lengths[i];
      const float* query = q + row * Dk;
      const float* k = keys[i] + kv * Dk;
      const float* v = values[i] + kv * Dv;
      for (int64_t t = 0; t < length; ++t) scores[t] = lane_dot(query, k + t * KV * Dk, Dk) * scale;
      const float m = lane_max(scores, length);
      for (int64_t t = 0; t < length; ++t) scores[t] = exp_fast(scores[t] - m);
      const float inverse = 1.0f / lane_sum(scores, length);
      float* o = out + row * Dv;
      for (int64_t d = 0; d < Dv; ++d) o[d] = 0.0f;
      for (int64_t t = 0; t < length; ++t) {
        const float p = scores[t] * inverse;
        const float* vt = v + t * KV * Dv;
        for (int64_t d = 0; d < Dv; ++d) o[d] += p * vt[d];
      }
    }
  }
}

}  // namespace crucible::kernels
