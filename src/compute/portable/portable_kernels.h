// The Llama kernels of the portable exact mode (`[debug] portable_exact`), one function per output
// element or per output row, for the CPU (compute/portable_backend.cc runs them under OpenMP)
// and the GPU (one thread per element or row) alike. Shapes and contracts are those of
// kernels/cpu/kernels.h; the bits are not theirs (different orders), but the same on every
// device: each output is computed alone, by one caller, in the fixed order written here
// (every sum runs in index order from 0), with the basic operations and the math of
// portable_math.h only. Nothing here allocates; the attention rows need O(1) scratch.
//
// Naming: FooForwardX / FooBackwardX computes the outputs X names, at the index arguments.
#pragma once

#include <cstdint>

#include "compute/portable/portable_math.h"

namespace crucible::portable {

// sum_i a[i * a_stride] * b[i * b_stride] for i in [0, n), in index order from 0.
CRUCIBLE_HD inline float Dot(const float* a, int64_t a_stride, const float* b, int64_t b_stride,
                             int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum = Add(sum, Mul(a[i * a_stride], b[i * b_stride]));
  return sum;
}

// ---- matmul: inp (N,C), weight (OC,C) -> out (N,OC) ----
CRUCIBLE_HD inline void MatmulForwardElement(float* out, const float* inp, const float* weight,
                                             int64_t n, int64_t o, int64_t C, int64_t OC) {
  out[n * OC + o] = Dot(inp + n * C, 1, weight + o * C, 1, C);
}
// dinp[n, c] (=, or += when accumulate) sum_o dout[n, o] weight[o, c]
CRUCIBLE_HD inline void MatmulBackwardInputElement(float* dinp, const float* dout,
                                                   const float* weight, int64_t n, int64_t c,
                                                   int64_t C, int64_t OC, bool accumulate) {
  const float sum = Dot(dout + n * OC, 1, weight + c, C, OC);
  dinp[n * C + c] = accumulate ? Add(dinp[n * C + c], sum) : sum;
}
// dweight[o, c] (=, or += when accumulate) sum_n dout[n, o] inp[n, c]
CRUCIBLE_HD inline void MatmulBackwardWeightElement(float* dweight, const float* dout,
                                                    const float* inp, int64_t o, int64_t c,
                                                    int64_t N, int64_t C, int64_t OC,
                                                    bool accumulate) {
  const float sum = Dot(dout + o, OC, inp + c, C, N);
  dweight[o * C + c] = accumulate ? Add(dweight[o * C + c], sum) : sum;
}

// ---- embedding: tokens (N) -> out (N,C) = table[tokens] ----
CRUCIBLE_HD inline void EmbeddingForwardElement(float* out, const int32_t* tokens,
                                                const float* table, int64_t i, int64_t c,
                                                int64_t C) {
  out[i * C + c] = table[static_cast<int64_t>(tokens[i]) * C + c];
}
// Channel c of dtable (V,C) += dout (N,C) scattered by tokens, rows in index order.
CRUCIBLE_HD inline void EmbeddingBackwardChannel(float* dtable, const float* dout,
                                                 const int32_t* tokens, int64_t c, int64_t N,
                                                 int64_t C) {
  for (int64_t i = 0; i < N; ++i) {
    float* cell = dtable + static_cast<int64_t>(tokens[i]) * C + c;
    *cell = Add(*cell, dout[i * C + c]);
  }
}

// ---- RMSNorm: inp (N,C), weight (C) -> out (N,C), rstd (N) ----
CRUCIBLE_HD inline void RmsnormForwardRow(float* out, float* rstd, const float* inp,
                                          const float* weight, int64_t i, int64_t C, float eps) {
  const float* x = inp + i * C;
  const float mean_square = Div(Dot(x, 1, x, 1, C), static_cast<float>(C));
  const float r = RsqrtF(Add(mean_square, eps));
  rstd[i] = r;
  for (int64_t c = 0; c < C; ++c) out[i * C + c] = Mul(Mul(x[c], r), weight[c]);
}
// Row i of dinp (N,C), added to: r (g - xhat mean(g xhat)), g = dout w, xhat = x r.
CRUCIBLE_HD inline void RmsnormBackwardInputRow(float* dinp, const float* dout, const float* inp,
                                                const float* weight, const float* rstd, int64_t i,
                                                int64_t C) {
  const float* x = inp + i * C;
  const float* dy = dout + i * C;
  const float r = rstd[i];
  float sum_gx = 0.0f;
  for (int64_t c = 0; c < C; ++c) sum_gx = Add(sum_gx, Mul(Mul(dy[c], weight[c]), x[c]));
  const float mean_gx = Div(Mul(sum_gx, r), static_cast<float>(C));
  for (int64_t c = 0; c < C; ++c) {
    const float g = Mul(dy[c], weight[c]);
    const float dx = Mul(r, Sub(g, Mul(Mul(x[c], r), mean_gx)));
    dinp[i * C + c] = Add(dinp[i * C + c], dx);
  }
}
// dweight[c] (overwritten) = sum_i dout[i, c] x[i, c] rstd[i].
CRUCIBLE_HD inline void RmsnormBackwardWeightChannel(float* dweight, const float* dout,
                                                     const float* inp, const float* rstd, int64_t c,
                                                     int64_t N, int64_t C) {
  float sum = 0.0f;
  for (int64_t i = 0; i < N; ++i)
    sum = Add(sum, Mul(dout[i * C + c], Mul(inp[i * C + c], rstd[i])));
  dweight[c] = sum;
}

// ---- RoPE: x (B,T,heads,D) in place; tables (T, D/2) from kernels::rope_tables, whose host
// math is portable_math.h's under portable_exact (common/host_math.h) ----
// Rotates pair i of head `head` at row bt (= b T + t) by its angle (sine_sign 1) or back (-1).
CRUCIBLE_HD inline void RopeRotatePair(float* x, const float* cos_table, const float* sin_table,
                                       int64_t bt, int64_t head, int64_t i, int64_t T,
                                       int64_t heads, int64_t D, float sine_sign) {
  const int64_t half = D / 2, t = bt % T;
  float* v = x + (bt * heads + head) * D;
  const float c = cos_table[t * half + i], s = Mul(sine_sign, sin_table[t * half + i]);
  const float x1 = v[i], x2 = v[i + half];
  v[i] = Sub(Mul(x1, c), Mul(x2, s));
  v[i + half] = Add(Mul(x2, c), Mul(x1, s));
}

// ---- causal grouped-query attention: q (B,T,H,D), k,v (B,T,KV,D) -> out (B,T,H,D), lse ----
// Query row (b, h, t) attends keys first <= j <= t of kv head h / (H/KV) (first: where its
// document starts; 0 without packed documents; kernels/cpu/kernels.h attention_forward). Scores s_j
// = (q_t . k_j) / sqrt(D) are computed in key order twice (max, then sum and output): no score row
// is stored.
CRUCIBLE_HD inline float AttentionScore(const float* q, const float* k, int64_t b, int64_t t,
                                        int64_t j, int64_t h, int64_t g, int64_t T, int64_t H,
                                        int64_t KV, int64_t D, float scale) {
  const float* qt = q + ((b * T + t) * H + h) * D;
  const float* kj = k + ((b * T + j) * KV + g) * D;
  return Mul(Dot(qt, 1, kj, 1, D), scale);
}
CRUCIBLE_HD inline float AttentionScale(int64_t D) {
  return RsqrtF(static_cast<float>(D));
}

CRUCIBLE_HD inline void AttentionForwardRow(float* out, float* lse, const float* q, const float* k,
                                            const float* v, int64_t b, int64_t h, int64_t t,
                                            int64_t T, int64_t H, int64_t KV, int64_t D,
                                            int64_t first = 0) {
  const int64_t g = h / (H / KV);
  const float scale = AttentionScale(D);
  float max = AttentionScore(q, k, b, t, first, h, g, T, H, KV, D, scale);
  for (int64_t j = first + 1; j <= t; ++j) {
    const float s = AttentionScore(q, k, b, t, j, h, g, T, H, KV, D, scale);
    max = s > max ? s : max;
  }
  float* o = out + ((b * T + t) * H + h) * D;
  for (int64_t d = 0; d < D; ++d) o[d] = 0.0f;
  float sum = 0.0f;
  for (int64_t j = first; j <= t; ++j) {
    const float p = ExpF(Sub(AttentionScore(q, k, b, t, j, h, g, T, H, KV, D, scale), max));
    sum = Add(sum, p);
    const float* vj = v + ((b * T + j) * KV + g) * D;
    for (int64_t d = 0; d < D; ++d) o[d] = Add(o[d], Mul(p, vj[d]));
  }
  const float inverse = Div(1.0f, sum);
  for (int64_t d = 0; d < D; ++d) o[d] = Mul(o[d], inverse);
  lse[(b * H + h) * T + t] = Add(max, LogF(sum));
}

// delta (B,H,T) = rowsum(dout * out), the first pass of the backward.
CRUCIBLE_HD inline void AttentionBackwardDeltaRow(float* delta, const float* dout, const float* out,
                                                  int64_t b, int64_t h, int64_t t, int64_t T,
                                                  int64_t H, int64_t D) {
  const int64_t row = ((b * T + t) * H + h) * D;
  delta[(b * H + h) * T + t] = Dot(dout + row, 1, out + row, 1, D);
}

// The probability p and score gradient ds of query t (head h) and key j, recomputed from lse.
CRUCIBLE_HD inline void AttentionBackwardPair(float* p, float* ds, const float* dout,
                                              const float* lse, const float* delta, const float* q,
                                              const float* k, const float* v, int64_t b, int64_t h,
                                              int64_t g, int64_t t, int64_t j, int64_t T, int64_t H,
                                              int64_t KV, int64_t D, float scale) {
  const int64_t stat = (b * H + h) * T + t;
  *p = ExpF(Sub(AttentionScore(q, k, b, t, j, h, g, T, H, KV, D, scale), lse[stat]));
  const float dp = Dot(dout + ((b * T + t) * H + h) * D, 1, v + ((b * T + j) * KV + g) * D, 1, D);
  *ds = Mul(Mul(*p, Sub(dp, delta[stat])), scale);
}

// Row (b, h, t) of dq (overwritten): sum over keys first <= j <= t of ds_j k_j, in key order.
CRUCIBLE_HD inline void AttentionBackwardQueryRow(float* dq, const float* dout, const float* lse,
                                                  const float* delta, const float* q,
                                                  const float* k, const float* v, int64_t b,
                                                  int64_t h, int64_t t, int64_t T, int64_t H,
                                                  int64_t KV, int64_t D, int64_t first = 0) {
  const int64_t g = h / (H / KV);
  const float scale = AttentionScale(D);
  float* dqt = dq + ((b * T + t) * H + h) * D;
  for (int64_t d = 0; d < D; ++d) dqt[d] = 0.0f;
  for (int64_t j = first; j <= t; ++j) {
    float p, ds;
    AttentionBackwardPair(&p, &ds, dout, lse, delta, q, k, v, b, h, g, t, j, T, H, KV, D, scale);
    const float* kj = k + ((b * T + j) * KV + g) * D;
    for (int64_t d = 0; d < D; ++d) dqt[d] = Add(dqt[d], Mul(ds, kj[d]));
  }
}

// Row (b, g, j) of dk and dv (overwritten): over the group's query heads in order, then queries
// j <= t < end in order (end: where j's document ends; T without packed documents),
// dv += p dout_t and dk += ds q_t.
CRUCIBLE_HD inline void AttentionBackwardKeyRow(float* dk, float* dv, const float* dout,
                                                const float* lse, const float* delta,
                                                const float* q, const float* k, const float* v,
                                                int64_t b, int64_t g, int64_t j, int64_t T,
                                                int64_t H, int64_t KV, int64_t D,
                                                int64_t end = -1) {
  if (end < 0) end = T;
  const int64_t group = H / KV;
  const float scale = AttentionScale(D);
  float* dkj = dk + ((b * T + j) * KV + g) * D;
  float* dvj = dv + ((b * T + j) * KV + g) * D;
  for (int64_t d = 0; d < D; ++d) dkj[d] = dvj[d] = 0.0f;
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    for (int64_t t = j; t < end; ++t) {
      float p, ds;
      AttentionBackwardPair(&p, &ds, dout, lse, delta, q, k, v, b, h, g, t, j, T, H, KV, D, scale);
      const int64_t row = ((b * T + t) * H + h) * D;
      for (int64_t d = 0; d < D; ++d) {
        dvj[d] = Add(dvj[d], Mul(p, dout[row + d]));
        dkj[d] = Add(dkj[d], Mul(ds, q[row + d]));
      }
    }
  }
}

// ---- SwiGLU: out = silu(gate) * up, elementwise over (N,F) ----
CRUCIBLE_HD inline void SwigluForwardElement(float* out, const float* gate, const float* up,
                                             int64_t i) {
  out[i] = Mul(Mul(gate[i], SigmoidF(gate[i])), up[i]);
}
CRUCIBLE_HD inline void SwigluBackwardElement(float* dgate, float* dup, const float* dout,
                                              const float* gate, const float* up, int64_t i) {
  const float g = gate[i], s = SigmoidF(g);
  dup[i] = Mul(dout[i], Mul(g, s));
  dgate[i] = Mul(Mul(dout[i], up[i]), Mul(s, Add(1.0f, Mul(g, Sub(1.0f, s)))));
}

// ---- cross-entropy: logits (N,V), targets (N) (-1 ignored) -> losses (N), lse (N) ----
CRUCIBLE_HD inline void CrossEntropyForwardRow(float* losses, float* lse, const float* logits,
                                               const int32_t* targets, int64_t i, int64_t V) {
  const float* row = logits + i * V;
  float max = row[0];
  for (int64_t j = 1; j < V; ++j) max = row[j] > max ? row[j] : max;
  float sum = 0.0f;
  for (int64_t j = 0; j < V; ++j) sum = Add(sum, ExpF(Sub(row[j], max)));
  lse[i] = Add(max, LogF(sum));
  losses[i] = targets[i] < 0 ? 0.0f : Sub(lse[i], row[targets[i]]);
}
// In place, row i: dlogits = (softmax - onehot) * scale * weight (weights null: 1); ignored: 0.
CRUCIBLE_HD inline void CrossEntropyBackwardRow(float* logits_to_dlogits, const float* lse,
                                                const int32_t* targets, int64_t i, int64_t V,
                                                float scale, const float* weights) {
  float* row = logits_to_dlogits + i * V;
  if (targets[i] < 0) {
    for (int64_t j = 0; j < V; ++j) row[j] = 0.0f;
    return;
  }
  const float row_scale = weights ? Mul(scale, weights[i]) : scale;
  for (int64_t j = 0; j < V; ++j) row[j] = Mul(ExpF(Sub(row[j], lse[i])), row_scale);
  row[targets[i]] = Sub(row[targets[i]], row_scale);
}

}  // namespace crucible::portable
