#include "model/moe_routing.h"

#include <cmath>
#include <limits>

namespace crucible {

void RouteTokens(const MoeRouterConfig& c, const float* logits, const float* bias, int64_t N,
                 MoeRouting* r) {
  const int64_t E = c.experts, K = c.top_k, G = c.n_group, per_group = E / G;
  r->tokens = N;
  r->affinity.resize(N * E);
  r->expert.resize(N * K);
  r->weight.resize(N * K);
  r->row.resize(N * K);
  r->expert_begin.assign(E + 1, 0);
  r->row_token.resize(N * K);
  constexpr float kNone = -std::numeric_limits<float>::infinity();
#pragma omp parallel
  {
    std::vector<float> choice(E), group(G);
    std::vector<char> eligible(G), taken(E);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
      float* s = r->affinity.data() + t * E;
      for (int64_t e = 0; e < E; ++e) {
        s[e] = 1.0f / (1.0f + std::exp(-logits[t * E + e]));
        choice[e] = s[e] + (bias ? bias[e] : 0.0f);
      }
      // The groups' scores: the sum of each group's two largest choices.
      for (int64_t g = 0; g < G; ++g) {
        float first = kNone, second = kNone;
        for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) {
          if (choice[e] > first) {
            second = first;
            first = choice[e];
          } else if (choice[e] > second) {
            second = choice[e];
          }
        }
        group[g] = per_group > 1 ? first + second : first;
        eligible[g] = 0;
      }
      for (int64_t pick = 0; pick < c.topk_group; ++pick) {
        int64_t best = -1;
        for (int64_t g = 0; g < G; ++g)
          if (!eligible[g] && (best < 0 || group[g] > group[best])) best = g;
        if (best < 0) break;  // topk_group > n_group, refused by the config's checks
        eligible[best] = 1;
      }
      for (int64_t e = 0; e < E; ++e) taken[e] = 0;
      float sum = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; ++e)
          if (eligible[e / per_group] && !taken[e] && (best < 0 || choice[e] > choice[best]))
            best = e;
        if (best < 0) break;  // fewer eligible experts than top_k, refused by the config's checks
        taken[best] = 1;
        r->expert[t * K + k] = static_cast<int32_t>(best);
        sum += s[best];
      }
      const float denominator = c.normalize ? sum + 1e-20f : 1.0f;
      for (int64_t k = 0; k < K; ++k) {
        const float w = s[r->expert[t * K + k]] / denominator;
        r->weight[t * K + k] = w * c.routed_scaling_factor;
      }
    }
  }
  // The expert-sorted layout: counts, then rows in (expert, token) order.
  for (int64_t i = 0; i < N * K; ++i) ++r->expert_begin[r->expert[i] + 1];
  for (int64_t e = 0; e < E; ++e) r->expert_begin[e + 1] += r->expert_begin[e];
  std::vector<int64_t> next(r->expert_begin.begin(), r->expert_begin.end() - 1);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t row = next[r->expert[t * K + k]]++;
      r->row[t * K + k] = static_cast<int32_t>(row);
      r->row_token[row] = static_cast<int32_t>(t);
    }
}

void RouteBackward(const MoeRouterConfig& c, const MoeRouting& r, const float* dweights,
                   float* dlogits) {
  const int64_t N = r.tokens, E = c.experts, K = c.top_k;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    float* dz = dlogits + t * E;
    for (int64_t e = 0; e < E; ++e) dz[e] = 0.0f;
    const float* s = r.affinity.data() + t * E;
    const int32_t* chosen = r.expert.data() + t * K;
    const float* g = dweights + t * K;
    // w_k = f s_k / S (S = sum of the chosen s + 1e-20): dL/ds_j = f (g_j / S - sum_k g_k s_k /
    // S^2).
    double S = 1.0, gs = 0.0;
    if (c.normalize) {
      S = 1e-20;
      for (int64_t k = 0; k < K; ++k) S += s[chosen[k]];
      for (int64_t k = 0; k < K; ++k) gs += static_cast<double>(g[k]) * s[chosen[k]];
    }
    const double f = c.routed_scaling_factor;
    for (int64_t k = 0; k < K; ++k) {
      const double sj = s[chosen[k]];
      const double ds = c.normalize ? f * (g[k] / S - gs / (S * S)) : f * g[k];
      dz[chosen[k]] = static_cast<float>(ds * sj * (1.0 - sj));
    }
  }
}

double SequenceBalanceLoss(const MoeRouterConfig& c, const MoeRouting& r, int64_t sequences,
                           int64_t seq_len, std::vector<double>* f) {
  const int64_t E = c.experts, K = c.top_k, T = seq_len;
  f->assign(sequences * E, 0.0);
  std::vector<double> totals(sequences, 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < sequences; ++b) {
    double* fb = f->data() + b * E;
    std::vector<double> P(E, 0.0);
    for (int64_t t = b * T; t < (b + 1) * T; ++t) {
      const float* s = r.affinity.data() + t * E;
      double S = 0.0;
      for (int64_t e = 0; e < E; ++e) S += s[e];
      for (int64_t e = 0; e < E; ++e) P[e] += s[e] / S;
      for (int64_t k = 0; k < K; ++k) fb[r.expert[t * K + k]] += 1.0;
    }
    double total = 0.0;
    for (int64_t e = 0; e < E; ++e) {
      fb[e] *= static_cast<double>(E) / static_cast<double>(K * T);
      total += fb[e] * (P[e] / static_cast<double>(T));
    }
    totals[b] = total;
  }
  double sum = 0.0;
  for (double total : totals) sum += total;
  return sum;
}

void SequenceBalanceBackward(const MoeRouterConfig& c, const MoeRouting& r, int64_t sequences,
                             int64_t seq_len, const std::vector<double>& f, double scale,
                             float* dlogits) {
  const int64_t E = c.experts, T = seq_len;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < sequences * T; ++t) {
    const double* g = f.data() + (t / T) * E;  // dL/ds'_i = scale * g_i
    const float* s = r.affinity.data() + t * E;
    float* dz = dlogits + t * E;
    double S = 0.0, gs = 0.0;
    for (int64_t e = 0; e < E; ++e) S += s[e];
    for (int64_t e = 0; e < E; ++e) gs += g[e] * (s[e] / S);
    // s'_i = s_i / S: dL/ds_j = scale * (g_j - sum_i g_i s'_i) / S; then the sigmoid's s (1 - s).
    for (int64_t e = 0; e < E; ++e) {
      const double ds = scale * (g[e] - gs) / S;
      dz[e] = static_cast<float>(static_cast<double>(dz[e]) + ds * s[e] * (1.0 - s[e]));
    }
  }
}

}  // namespace crucible
