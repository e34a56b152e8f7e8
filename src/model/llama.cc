// Forward and backward of the Llama decoder over one micro-batch.
#include "model/llama.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/kernels.h"

namespace crucible {

namespace k = kernels;

// Activations of one micro-batch, planned once. N = B*T rows.
struct LlamaModel::Buffers {
  struct Layer {
    std::vector<float> x_in;              // (N,C) residual stream entering the layer
    std::vector<float> ln1, ln1_rstd;     // (N,C), (N)
    std::vector<float> q, k, v;           // (N,H*D), (N,KV*D) x2, after RoPE
    std::vector<float> att_lse;           // (B,H,T) log-sum-exp of each attention row
    std::vector<float> att;               // (N,H*D) attention output before o_proj
    std::vector<float> x_mid;             // (N,C) residual after attention
    std::vector<float> ln2, ln2_rstd;     // (N,C), (N)
    std::vector<float> gate, up, hidden;  // (N,F) each
  };
  std::vector<Layer> layers;
  std::vector<float> x_final;             // (N,C) residual leaving the last layer
  std::vector<float> lnf, lnf_rstd;       // (N,C), (N)
  std::vector<float> logits;              // (N,V), reused for dlogits
  std::vector<float> losses, lse;         // (N)
  std::vector<float> rope_cos, rope_sin;  // (T,D/2)
  std::vector<int32_t> tokens, targets;   // (N)
  // Backward scratch.
  std::vector<float> dx, dln, dq, dk, dv, datt, dgate, dup, dhidden;
};

LlamaModel::LlamaModel(const LlamaConfig& config, int64_t batch_size, int64_t seq_len)
    : config_(config),
      table_(LlamaParameterTable(config)),
      B_(batch_size),
      T_(seq_len),
      buffers_(new Buffers) {
  const int64_t N = B_ * T_, C = config.dim, H = config.n_heads, KV = config.n_kv_heads;
  const int64_t D = config.head_dim(), F = config.ffn_hidden_dim, V = config.vocab_size;
  Buffers& b = *buffers_;
  b.layers.resize(config.n_layers);
  for (auto& layer : b.layers) {
    layer.x_in.resize(N * C);
    layer.ln1.resize(N * C);
    layer.ln1_rstd.resize(N);
    layer.q.resize(N * H * D);
    layer.k.resize(N * KV * D);
    layer.v.resize(N * KV * D);
    layer.att_lse.resize(B_ * H * T_);
    layer.att.resize(N * H * D);
    layer.x_mid.resize(N * C);
    layer.ln2.resize(N * C);
    layer.ln2_rstd.resize(N);
    layer.gate.resize(N * F);
    layer.up.resize(N * F);
    layer.hidden.resize(N * F);
  }
  b.x_final.resize(N * C);
  b.lnf.resize(N * C);
  b.lnf_rstd.resize(N);
  b.logits.resize(N * V);
  b.losses.resize(N);
  b.lse.resize(N);
  b.rope_cos.resize(T_ * D / 2);
  b.rope_sin.resize(T_ * D / 2);
  k::rope_tables(b.rope_cos.data(), b.rope_sin.data(), T_, D, config.rope_theta);
  b.tokens.resize(N);
  b.targets.resize(N);
  b.dx.resize(N * C);
  b.dln.resize(N * C);
  b.dq.resize(N * H * D);
  b.dk.resize(N * KV * D);
  b.dv.resize(N * KV * D);
  b.datt.resize(N * H * D);
  b.dgate.resize(N * F);
  b.dup.resize(N * F);
  b.dhidden.resize(N * F);

  const auto& units = table_.units();
  // Unit-relative offset of a tensor, which must lie inside unit `unit`.
  auto in_unit = [&](const std::string& name, size_t unit) {
    const ParamInfo& p = table_.Find(name);
    const ParamUnit& u = units[unit];
    if (p.offset < u.begin || p.offset + p.numel > u.end)
      throw Error(kExitFailure,
                  "internal: tensor " + name + " is not in unit " + std::to_string(unit));
    return p.offset - u.begin;
  };
  const size_t tail = static_cast<size_t>(table_.tail_unit());
  embed_ = in_unit("model.embed_tokens.weight", 0);
  final_norm_ = in_unit("model.norm.weight", tail);
  if (!config.tie_embeddings) head_ = in_unit("lm_head.weight", tail);
  layers_.resize(config.n_layers);
  for (int64_t l = 0; l < config.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const size_t unit = static_cast<size_t>(1 + l);
    auto at = [&](const char* name) { return in_unit(p + name, unit); };
    layers_[l] = {at("input_layernorm.weight"),  at("self_attn.q_proj.weight"),
                  at("self_attn.k_proj.weight"), at("self_attn.v_proj.weight"),
                  at("self_attn.o_proj.weight"), at("post_attention_layernorm.weight"),
                  at("mlp.gate_proj.weight"),    at("mlp.up_proj.weight"),
                  at("mlp.down_proj.weight")};
  }
}

LlamaModel::~LlamaModel() {
  delete buffers_;
}

size_t LlamaModel::activation_bytes() const {
  const Buffers& b = *buffers_;
  size_t floats = 0;
  for (const auto& l : b.layers)
    floats += l.x_in.size() + l.ln1.size() + l.ln1_rstd.size() + l.q.size() + l.k.size() +
              l.v.size() + l.att_lse.size() + l.att.size() + l.x_mid.size() + l.ln2.size() +
              l.ln2_rstd.size() + l.gate.size() + l.up.size() + l.hidden.size();
  floats += b.x_final.size() + b.lnf.size() + b.lnf_rstd.size() + b.logits.size() +
            b.losses.size() + b.lse.size() + b.dx.size() + b.dln.size() + b.dq.size() +
            b.dk.size() + b.dv.size() + b.datt.size() + b.dgate.size() + b.dup.size() +
            b.dhidden.size();
  return floats * sizeof(float);
}

double PlannedLlamaActivationBytes(const LlamaConfig& c, double B, double T) {
  const double N = B * T, C = static_cast<double>(c.dim), V = static_cast<double>(c.vocab_size);
  const double H = static_cast<double>(c.n_heads), KV = static_cast<double>(c.n_kv_heads);
  const double D = static_cast<double>(c.head_dim()), F = static_cast<double>(c.ffn_hidden_dim);
  // The buffers of LlamaModel::LlamaModel, in floats.
  const double layer =
      4 * N * C + 2 * N + N * H * D + 2 * N * KV * D + B * H * T + N * H * D + 3 * N * F;
  const double rest = 4 * N * C + 3 * N + N * V + 2 * N * H * D + 2 * N * KV * D + 3 * N * F;
  return 4 * (static_cast<double>(c.n_layers) * layer + rest);
}

const float* LlamaModel::logits() const {
  return buffers_->logits.data();
}
const float* LlamaModel::losses() const {
  return buffers_->losses.data();
}

LossSum LlamaModel::Forward(ParameterAccess& access, const int32_t* tokens, const int32_t* targets,
                            const float* loss_weights) {
  Buffers& b = *buffers_;
  const LlamaConfig& c = config_;
  const int64_t N = B_ * T_, C = c.dim, H = c.n_heads, KV = c.n_kv_heads, D = c.head_dim();
  const int64_t F = c.ffn_hidden_dim, V = c.vocab_size;
  const int64_t L = c.n_layers;
  const int tail = table_.tail_unit();
  const float eps = static_cast<float>(c.norm_eps);
  std::memcpy(b.tokens.data(), tokens, N * sizeof(int32_t));
  std::memcpy(b.targets.data(), targets, N * sizeof(int32_t));
  loss_weights_ = loss_weights;

  const float* unit0 = access.AcquireWeights(0);
  access.Prefetch(L > 0 ? 1 : tail);
  k::embedding_forward(b.layers.empty() ? b.x_final.data() : b.layers[0].x_in.data(), tokens,
                       unit0 + embed_, N, C);
  if (!c.tie_embeddings) access.ReleaseWeights(0);
  for (int64_t l = 0; l < L; ++l) {
    auto& Lb = b.layers[l];
    const int unit = static_cast<int>(1 + l);
    const float* w = access.AcquireWeights(unit);
    access.Prefetch(l + 1 < L ? unit + 1 : tail);
    const LayerOffsets& o = layers_[l];  // unit-relative
    float* x_out = l + 1 < L ? b.layers[l + 1].x_in.data() : b.x_final.data();
    k::rmsnorm_forward(Lb.ln1.data(), Lb.ln1_rstd.data(), Lb.x_in.data(), w + o.ln1, N, C, eps);
    k::matmul_forward(Lb.q.data(), Lb.ln1.data(), w + o.q, N, C, H * D);
    k::matmul_forward(Lb.k.data(), Lb.ln1.data(), w + o.k, N, C, KV * D);
    k::matmul_forward(Lb.v.data(), Lb.ln1.data(), w + o.v, N, C, KV * D);
    k::rope_forward(Lb.q.data(), b.rope_cos.data(), b.rope_sin.data(), B_, T_, H, D);
    k::rope_forward(Lb.k.data(), b.rope_cos.data(), b.rope_sin.data(), B_, T_, KV, D);
    k::attention_forward(Lb.att.data(), Lb.att_lse.data(), Lb.q.data(), Lb.k.data(), Lb.v.data(),
                         B_, T_, H, KV, D);
    k::matmul_forward(Lb.x_mid.data(), Lb.att.data(), w + o.o, N, H * D, C);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N * C; ++i) Lb.x_mid[i] += Lb.x_in[i];
    k::rmsnorm_forward(Lb.ln2.data(), Lb.ln2_rstd.data(), Lb.x_mid.data(), w + o.ln2, N, C, eps);
    k::matmul_forward(Lb.gate.data(), Lb.ln2.data(), w + o.gate, N, C, F);
    k::matmul_forward(Lb.up.data(), Lb.ln2.data(), w + o.up, N, C, F);
    k::swiglu_forward(Lb.hidden.data(), Lb.gate.data(), Lb.up.data(), N, F);
    k::matmul_forward(x_out, Lb.hidden.data(), w + o.down, N, F, C);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N * C; ++i) x_out[i] += Lb.x_mid[i];
    access.ReleaseWeights(unit);
  }
  const float* wt = access.AcquireWeights(tail);
  k::rmsnorm_forward(b.lnf.data(), b.lnf_rstd.data(), b.x_final.data(), wt + final_norm_, N, C,
                     eps);
  const float* head = c.tie_embeddings ? unit0 + embed_ : wt + head_;
  k::matmul_forward(b.logits.data(), b.lnf.data(), head, N, C, V);
  access.ReleaseWeights(tail);
  if (c.tie_embeddings) access.ReleaseWeights(0);
  return LossOfTargets();
}

LossSum LlamaModel::Retarget(const int32_t* targets) {
  std::memcpy(buffers_->targets.data(), targets, B_ * T_ * sizeof(int32_t));
  return LossOfTargets();
}

LossSum LlamaModel::LossOfTargets() {
  Buffers& b = *buffers_;
  const int64_t N = B_ * T_, V = config_.vocab_size;
  const int32_t* targets = b.targets.data();
  k::cross_entropy_forward(b.losses.data(), b.lse.data(), b.logits.data(), targets, N, V);
  // In position order; without weights each w_i is 1 and w_i * l_i is l_i exactly.
  LossSum sum;
  for (int64_t i = 0; i < N; ++i) {
    if (targets[i] < 0) continue;
    const double w = loss_weights_ ? static_cast<double>(loss_weights_[i]) : 1.0;
    sum.loss += w * b.losses[i];
    sum.weight += w;
  }
  return sum;
}

void LlamaModel::Backward(ParameterAccess& access, float loss_scale) {
  Buffers& b = *buffers_;
  const LlamaConfig& c = config_;
  const int64_t N = B_ * T_, C = c.dim, H = c.n_heads, KV = c.n_kv_heads, D = c.head_dim();
  const int64_t F = c.ffn_hidden_dim, V = c.vocab_size;
  const int64_t L = c.n_layers;
  const int tail = table_.tail_unit();

  // Head and final norm (the tied head's weight and gradient live in the embedding unit).
  const float* wt = access.AcquireWeights(tail);
  const float* unit0 = c.tie_embeddings ? access.AcquireWeights(0) : nullptr;
  if (L > 0) access.Prefetch(static_cast<int>(L));
  float* gt = access.Gradients(tail);
  float* g0 = c.tie_embeddings ? access.Gradients(0) : nullptr;
  k::cross_entropy_backward(b.logits.data(), b.lse.data(), b.targets.data(), N, V, loss_scale,
                            loss_weights_);
  const float* dlogits = b.logits.data();
  std::fill(b.dln.begin(), b.dln.end(), 0.0f);
  if (c.tie_embeddings)
    k::matmul_backward(b.dln.data(), g0 + embed_, dlogits, b.lnf.data(), unit0 + embed_, N, C, V,
                       false, false);
  else
    k::matmul_backward(b.dln.data(), gt + head_, dlogits, b.lnf.data(), wt + head_, N, C, V, false,
                       false);
  std::fill(b.dx.begin(), b.dx.end(), 0.0f);
  k::rmsnorm_backward(b.dx.data(), gt + final_norm_, b.dln.data(), b.x_final.data(),
                      wt + final_norm_, b.lnf_rstd.data(), N, C);
  access.ReleaseWeights(tail);
  access.GradientsReady(tail);

  for (int64_t l = L - 1; l >= 0; --l) {
    auto& Lb = b.layers[l];
    const int unit = static_cast<int>(1 + l);
    const float* w = access.AcquireWeights(unit);
    if (l > 0) access.Prefetch(unit - 1);  // the embedding's backward needs no weights
    float* g = access.Gradients(unit);
    const LayerOffsets& o = layers_[l];
    // MLP: x_out = x_mid + down(silu(gate(ln2)) * up(ln2)); dx holds d x_out.
    k::matmul_backward(b.dhidden.data(), g + o.down, b.dx.data(), Lb.hidden.data(), w + o.down, N,
                       F, C, false, false);
    k::swiglu_backward(b.dgate.data(), b.dup.data(), b.dhidden.data(), Lb.gate.data(), Lb.up.data(),
                       N, F);
    k::matmul_backward(b.dln.data(), g + o.gate, b.dgate.data(), Lb.ln2.data(), w + o.gate, N, C, F,
                       false, false);
    k::matmul_backward(b.dln.data(), g + o.up, b.dup.data(), Lb.ln2.data(), w + o.up, N, C, F, true,
                       false);
    // dx (d x_mid) += rmsnorm backward
    k::rmsnorm_backward(b.dx.data(), g + o.ln2, b.dln.data(), Lb.x_mid.data(), w + o.ln2,
                        Lb.ln2_rstd.data(), N, C);
    // Attention: x_mid = x_in + o_proj(att(rope(q(ln1)), rope(k(ln1)), v(ln1))).
    k::matmul_backward(b.datt.data(), g + o.o, b.dx.data(), Lb.att.data(), w + o.o, N, H * D, C,
                       false, false);
    k::attention_backward(b.dq.data(), b.dk.data(), b.dv.data(), b.datt.data(), Lb.att.data(),
                          Lb.att_lse.data(), Lb.q.data(), Lb.k.data(), Lb.v.data(), B_, T_, H, KV,
                          D);
    k::rope_backward(b.dq.data(), b.rope_cos.data(), b.rope_sin.data(), B_, T_, H, D);
    k::rope_backward(b.dk.data(), b.rope_cos.data(), b.rope_sin.data(), B_, T_, KV, D);
    k::matmul_backward(b.dln.data(), g + o.q, b.dq.data(), Lb.ln1.data(), w + o.q, N, C, H * D,
                       false, false);
    k::matmul_backward(b.dln.data(), g + o.k, b.dk.data(), Lb.ln1.data(), w + o.k, N, C, KV * D,
                       true, false);
    k::matmul_backward(b.dln.data(), g + o.v, b.dv.data(), Lb.ln1.data(), w + o.v, N, C, KV * D,
                       true, false);
    // dx (d x_in) += rmsnorm backward; the residual path carries dx through unchanged.
    k::rmsnorm_backward(b.dx.data(), g + o.ln1, b.dln.data(), Lb.x_in.data(), w + o.ln1,
                        Lb.ln1_rstd.data(), N, C);
    access.ReleaseWeights(unit);
    access.GradientsReady(unit);
  }
  // Embedding: overwrite (untied) or add to the head's gradient (tied).
  if (!g0) g0 = access.Gradients(0);
  float* dembed = g0 + embed_;
  if (!c.tie_embeddings) std::fill(dembed, dembed + table_.params()[0].numel, 0.0f);
  k::embedding_backward(dembed, b.dx.data(), b.tokens.data(), N, C);
  if (c.tie_embeddings) access.ReleaseWeights(0);
  access.GradientsReady(0);
}

}  // namespace crucible
