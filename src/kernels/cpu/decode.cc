// The decode step's kernels: every output element computed by one thread in a fixed order.
#include "kernels/cpu/decode.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/lanes.h"
#include "kernels/cpu/vec_math.h"

namespace crucible::kernels {

namespace {

// R consecutive rows of x (row stride C) against one weight row w: out[r * stride] is
// lane_dot(x + r * C, w, n), the same lanes and the same tree, bit for bit; the weight's 16
// values are loaded once for the R rows (register blocking over the batch).
template <int R>
inline void lane_dots(const float* x, int64_t C, const float* w, int64_t n, float* out,
                      int64_t stride) {
  float acc[R][kLanes] = {};
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes)
    for (int r = 0; r < R; ++r)
      for (int l = 0; l < kLanes; ++l) acc[r][l] += x[r * C + k + l] * w[k + l];
  for (int r = 0; r < R; ++r) {
    for (int l = 0; k + l < n; ++l) acc[r][l] += x[r * C + k + l] * w[k + l];
    for (int width = kLanes / 2; width >= 1; width /= 2)
      for (int l = 0; l < width; ++l) acc[r][l] += acc[r][l + width];
    out[r * stride] = acc[r][0];
  }
}

}  // namespace

void matmul_rows(float* out, const float* inp, const float* weight, int64_t N, int64_t C,
                 int64_t OC) {
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < OC; ++j) {
    const float* w = weight + j * C;
    int64_t i = 0;
    for (; i + 4 <= N; i += 4) lane_dots<4>(inp + i * C, C, w, C, out + i * OC + j, OC);
    switch (N - i) {
      case 3:
        lane_dots<3>(inp + i * C, C, w, C, out + i * OC + j, OC);
        break;
      case 2:
        lane_dots<2>(inp + i * C, C, w, C, out + i * OC + j, OC);
        break;
      case 1:
        lane_dots<1>(inp + i * C, C, w, C, out + i * OC + j, OC);
        break;
      default:
        break;
    }
  }
}

void decode_attention(float* out, const float* q, const float* const* keys,
                      const float* const* values, const int64_t* lengths, int64_t N, int64_t H,
                      int64_t KV, HeadDims D) {
  const int64_t group = H / KV, Dk = D.qk, Dv = D.v;
  const float scale = 1.0f / std::sqrt(static_cast<float>(Dk));
#pragma omp parallel
  {
    std::vector<float> scores;
#pragma omp for schedule(static)
    for (int64_t row = 0; row < N * H; ++row) {
      const int64_t i = row / H, h = row % H, kv = h / group, length = lengths[i];
      const float* query = q + row * Dk;
      const float* k = keys[i] + kv * Dk;
      const float* v = values[i] + kv * Dv;
      scores.resize(static_cast<size_t>(length));
      for (int64_t t = 0; t < length; ++t) scores[t] = lane_dot(query, k + t * KV * Dk, Dk) * scale;
      const float m = lane_max(scores.data(), length);
      for (int64_t t = 0; t < length; ++t) scores[t] = exp_fast(scores[t] - m);
      const float inverse = 1.0f / lane_sum(scores.data(), length);
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
