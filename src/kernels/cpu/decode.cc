// The decode step's kernels: every output element computed by one thread in a fixed order.
#include "kernels/cpu/decode.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/lanes.h"
#include "kernels/cpu/vec_math.h"

namespace crucible::kernels {

void matmul_rows(float* out, const float* inp, const float* weight, int64_t N, int64_t C,
                 int64_t OC) {
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < OC; ++j) {
    const float* w = weight + j * C;
    for (int64_t i = 0; i < N; ++i) out[i * OC + j] = lane_dot(inp + i * C, w, C);
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
