// The router of a DeepSeek-V3 mixture of experts, on the host: which experts each token goes to,
// with what weight, and the gradient of those weights back to the router's logits. Pure
// functions of their inputs, so that every rank layout routes a token the same way.
//
// For token t with router logits z (E experts) and the balance bias b (not a gradient path):
//   s = sigmoid(z)                          the affinities, float
//   c = s + b                               the scores that choose (b only chooses)
//   group score of each of n_group equal groups of experts: the sum of its two largest c (its
//   one c when a group holds one expert); the topk_group groups with the largest group scores
//   are eligible, the others are not (DeepSeek-V3's node-limited routing; transformers masks
//   them with 0 instead of -inf, which differs only when eligible scores are negative)
//   the K eligible experts with the largest c, in descending order of c (slot k = 0..K-1)
//   w_k = s_k / (sum_j s_j + 1e-20) when normalised (else s_k), times routed_scaling_factor
// Ties go to the lower index, for groups and for experts (torch.topk leaves them unspecified).
//
// Every token goes to its K experts: dropless, no capacity. The experts' rows are laid out
// sorted by expert, and within an expert by token: row(t, k) below.
#pragma once

#include <cstdint>
#include <vector>

namespace crucible {

struct MoeRouterConfig {
  int64_t experts = 0, top_k = 0, n_group = 1, topk_group = 1;
  float routed_scaling_factor = 1.0f;
  bool normalize = true;  // norm_topk_prob
};

struct MoeRouting {
  int64_t tokens = 0;
  std::vector<float> affinity;        // (N, E) s
  std::vector<int32_t> expert;        // (N, K) the experts chosen, slot order
  std::vector<float> weight;          // (N, K) w
  std::vector<int32_t> row;           // (N, K) each slot's row in the expert-sorted layout
  std::vector<int64_t> expert_begin;  // (E + 1) expert e's rows are [begin[e], begin[e + 1])
  std::vector<int32_t> row_token;     // (N K) the token of each sorted row
  int64_t Load(int64_t e) const { return expert_begin[e + 1] - expert_begin[e]; }
};

// Routes N tokens from their logits (N, E); `bias` (E) may be nullptr (zeros).
void RouteTokens(const MoeRouterConfig& config, const float* logits, const float* bias, int64_t N,
                 MoeRouting* routing);

// dlogits (N, E), overwritten: the gradient of the loss through the weights w, from
// dweights (N, K) = dL/dw of each slot. Zero for the experts a token did not choose.
void RouteBackward(const MoeRouterConfig& config, const MoeRouting& routing, const float* dweights,
                   float* dlogits);

// DeepSeek-V3's complementary sequence-wise balance loss, for the N = sequences x seq_len tokens
// of `routing` laid out sequence after sequence. For each sequence of T tokens:
//   f_i = E / (K T) * (the number of its tokens that chose expert i)        (not differentiable)
//   P_i = 1/T * sum_t s'_{i,t},   s'_{i,t} = s_{i,t} / sum_j s_{j,t}          (s the affinities)
//   L_seq = sum_i f_i P_i   (1 when the load is uniform or independent of the affinities)
// Returns sum over the sequences of L_seq; `f` (sequences x E) keeps the counts' factors for the
// backward. Fixed order, in double, so any rank layout gives the same bits.
double SequenceBalanceLoss(const MoeRouterConfig& config, const MoeRouting& routing,
                           int64_t sequences, int64_t seq_len, std::vector<double>* f);

// Adds to dlogits (N, E) the gradient of scale * T * sum_seq L_seq (its P through s' and the
// sigmoid; the counts f held fixed): dL/ds'_{i,t} = scale * f_i, then through the normalisation
// and the sigmoid. `scale` is the loss scale times the loss's coefficient (model.aux_loss_alpha).
void SequenceBalanceBackward(const MoeRouterConfig& config, const MoeRouting& routing,
                             int64_t sequences, int64_t seq_len, const std::vector<double>& f,
                             double scale, float* dlogits);

}  // namespace crucible
