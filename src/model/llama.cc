// Forward and backward of the Llama decoder over one micro-batch.
#include "model/llama.h"

#include <cstring>
#include <vector>

#include "kernels/cpu/kernels.h"

namespace crucible {

namespace k = kernels;

// Activations of one micro-batch, planned once. N = B*T rows.
struct LlamaModel::Buffers {
  struct Layer {
    std::vector<float> x_in;              // (N,C) residual stream entering the layer
    std::vector<float> ln1, ln1_rstd;     // (N,C), (N)
    std::vector<float> q, k, v;           // (N,H*D), (N,KV*D) x2, after RoPE
    std::vector<float> probs;             // (B,H,T,T)
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
  std::vector<float> dx, dln, dq, dk, dv, datt, dgate, dup, dhidden, att_scratch;
};

LlamaModel::LlamaModel(const LlamaConfig& config, int64_t batch_size, int64_t seq_len)
    : config_(config), table_(config), B_(batch_size), T_(seq_len), buffers_(new Buffers) {
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
    layer.probs.resize(B_ * H * T_ * T_);
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
  b.att_scratch.resize(k::attention_backward_scratch_floats(B_, T_, KV));
}

LlamaModel::~LlamaModel() {
  delete buffers_;
}

size_t LlamaModel::activation_bytes() const {
  const Buffers& b = *buffers_;
  size_t floats = 0;
  for (const auto& l : b.layers)
    floats += l.x_in.size() + l.ln1.size() + l.ln1_rstd.size() + l.q.size() + l.k.size() +
              l.v.size() + l.probs.size() + l.att.size() + l.x_mid.size() + l.ln2.size() +
              l.ln2_rstd.size() + l.gate.size() + l.up.size() + l.hidden.size();
  floats += b.x_final.size() + b.lnf.size() + b.lnf_rstd.size() + b.logits.size() +
            b.losses.size() + b.lse.size() + b.dx.size() + b.dln.size() + b.dq.size() +
            b.dk.size() + b.dv.size() + b.datt.size() + b.dgate.size() + b.dup.size() +
            b.dhidden.size() + b.att_scratch.size();
  return floats * sizeof(float);
}

const float* LlamaModel::logits() const {
  return buffers_->logits.data();
}
const float* LlamaModel::losses() const {
  return buffers_->losses.data();
}

double LlamaModel::Forward(const float* w, const int32_t* tokens, const int32_t* targets,
                           int64_t* valid_tokens) {
  Buffers& b = *buffers_;
  const LlamaConfig& c = config_;
  const int64_t N = B_ * T_, C = c.dim, H = c.n_heads, KV = c.n_kv_heads, D = c.head_dim();
  const int64_t F = c.ffn_hidden_dim, V = c.vocab_size;
  const float eps = static_cast<float>(c.norm_eps);
  std::memcpy(b.tokens.data(), tokens, N * sizeof(int32_t));
  std::memcpy(b.targets.data(), targets, N * sizeof(int32_t));
  auto W = [&](const std::string& name) { return w + table_.Find(name).offset; };

  k::embedding_forward(b.layers.empty() ? b.x_final.data() : b.layers[0].x_in.data(), tokens,
                       W("model.embed_tokens.weight"), N, C);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    auto& L = b.layers[l];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    float* x_out = l + 1 < c.n_layers ? b.layers[l + 1].x_in.data() : b.x_final.data();
    k::rmsnorm_forward(L.ln1.data(), L.ln1_rstd.data(), L.x_in.data(),
                       W(p + "input_layernorm.weight"), N, C, eps);
    k::matmul_forward(L.q.data(), L.ln1.data(), W(p + "self_attn.q_proj.weight"), N, C, H * D);
    k::matmul_forward(L.k.data(), L.ln1.data(), W(p + "self_attn.k_proj.weight"), N, C, KV * D);
    k::matmul_forward(L.v.data(), L.ln1.data(), W(p + "self_attn.v_proj.weight"), N, C, KV * D);
    k::rope_forward(L.q.data(), b.rope_cos.data(), b.rope_sin.data(), B_, T_, H, D);
    k::rope_forward(L.k.data(), b.rope_cos.data(), b.rope_sin.data(), B_, T_, KV, D);
    k::attention_forward(L.att.data(), L.probs.data(), L.q.data(), L.k.data(), L.v.data(), B_, T_,
                         H, KV, D);
    k::matmul_forward(L.x_mid.data(), L.att.data(), W(p + "self_attn.o_proj.weight"), N, H * D, C);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N * C; ++i) L.x_mid[i] += L.x_in[i];
    k::rmsnorm_forward(L.ln2.data(), L.ln2_rstd.data(), L.x_mid.data(),
                       W(p + "post_attention_layernorm.weight"), N, C, eps);
    k::matmul_forward(L.gate.data(), L.ln2.data(), W(p + "mlp.gate_proj.weight"), N, C, F);
    k::matmul_forward(L.up.data(), L.ln2.data(), W(p + "mlp.up_proj.weight"), N, C, F);
    k::swiglu_forward(L.hidden.data(), L.gate.data(), L.up.data(), N, F);
    k::matmul_forward(x_out, L.hidden.data(), W(p + "mlp.down_proj.weight"), N, F, C);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N * C; ++i) x_out[i] += L.x_mid[i];
  }
  k::rmsnorm_forward(b.lnf.data(), b.lnf_rstd.data(), b.x_final.data(), W("model.norm.weight"), N,
                     C, eps);
  const float* head = c.tie_embeddings ? W("model.embed_tokens.weight") : W("lm_head.weight");
  k::matmul_forward(b.logits.data(), b.lnf.data(), head, N, C, V);
  int64_t valid =
      k::cross_entropy_forward(b.losses.data(), b.lse.data(), b.logits.data(), targets, N, V);
  if (valid_tokens) *valid_tokens = valid;
  double sum = 0.0;
  for (int64_t i = 0; i < N; ++i) sum += b.losses[i];
  return sum;
}

void LlamaModel::Backward(const float* w, float* grads, float loss_scale) {
  Buffers& b = *buffers_;
  const LlamaConfig& c = config_;
  const int64_t N = B_ * T_, C = c.dim, H = c.n_heads, KV = c.n_kv_heads, D = c.head_dim();
  const int64_t F = c.ffn_hidden_dim, V = c.vocab_size;
  auto W = [&](const std::string& name) { return w + table_.Find(name).offset; };
  auto G = [&](const std::string& name) { return grads + table_.Find(name).offset; };

  // Head and final norm.
  k::cross_entropy_backward(b.logits.data(), b.lse.data(), b.targets.data(), N, V, loss_scale);
  const float* dlogits = b.logits.data();
  const std::string head_name = c.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  std::fill(b.dln.begin(), b.dln.end(), 0.0f);
  k::matmul_backward(b.dln.data(), G(head_name), dlogits, b.lnf.data(), W(head_name), N, C, V,
                     false, false);
  std::fill(b.dx.begin(), b.dx.end(), 0.0f);
  k::rmsnorm_backward(b.dx.data(), G("model.norm.weight"), b.dln.data(), b.x_final.data(),
                      W("model.norm.weight"), b.lnf_rstd.data(), N, C);

  for (int64_t l = c.n_layers - 1; l >= 0; --l) {
    auto& L = b.layers[l];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    // MLP: x_out = x_mid + down(silu(gate(ln2)) * up(ln2)); dx holds d x_out.
    k::matmul_backward(b.dhidden.data(), G(p + "mlp.down_proj.weight"), b.dx.data(),
                       L.hidden.data(), W(p + "mlp.down_proj.weight"), N, F, C, false, false);
    k::swiglu_backward(b.dgate.data(), b.dup.data(), b.dhidden.data(), L.gate.data(), L.up.data(),
                       N, F);
    k::matmul_backward(b.dln.data(), G(p + "mlp.gate_proj.weight"), b.dgate.data(), L.ln2.data(),
                       W(p + "mlp.gate_proj.weight"), N, C, F, false, false);
    k::matmul_backward(b.dln.data(), G(p + "mlp.up_proj.weight"), b.dup.data(), L.ln2.data(),
                       W(p + "mlp.up_proj.weight"), N, C, F, true, false);
    // dx (d x_mid) += rmsnorm backward
    k::rmsnorm_backward(b.dx.data(), G(p + "post_attention_layernorm.weight"), b.dln.data(),
                        L.x_mid.data(), W(p + "post_attention_layernorm.weight"), L.ln2_rstd.data(),
                        N, C);
    // Attention: x_mid = x_in + o_proj(att(rope(q(ln1)), rope(k(ln1)), v(ln1))).
    k::matmul_backward(b.datt.data(), G(p + "self_attn.o_proj.weight"), b.dx.data(), L.att.data(),
                       W(p + "self_attn.o_proj.weight"), N, H * D, C, false, false);
    k::attention_backward(b.dq.data(), b.dk.data(), b.dv.data(), b.att_scratch.data(),
                          b.datt.data(), L.probs.data(), L.q.data(), L.k.data(), L.v.data(), B_, T_,
                          H, KV, D);
    k::rope_backward(b.dq.data(), b.rope_cos.data(), b.rope_sin.data(), B_, T_, H, D);
    k::rope_backward(b.dk.data(), b.rope_cos.data(), b.rope_sin.data(), B_, T_, KV, D);
    k::matmul_backward(b.dln.data(), G(p + "self_attn.q_proj.weight"), b.dq.data(), L.ln1.data(),
                       W(p + "self_attn.q_proj.weight"), N, C, H * D, false, false);
    k::matmul_backward(b.dln.data(), G(p + "self_attn.k_proj.weight"), b.dk.data(), L.ln1.data(),
                       W(p + "self_attn.k_proj.weight"), N, C, KV * D, true, false);
    k::matmul_backward(b.dln.data(), G(p + "self_attn.v_proj.weight"), b.dv.data(), L.ln1.data(),
                       W(p + "self_attn.v_proj.weight"), N, C, KV * D, true, false);
    // dx (d x_in) += rmsnorm backward; the residual path carries dx through unchanged.
    k::rmsnorm_backward(b.dx.data(), G(p + "input_layernorm.weight"), b.dln.data(), L.x_in.data(),
                        W(p + "input_layernorm.weight"), L.ln1_rstd.data(), N, C);
  }
  // Embedding: overwrite (untied) or add to the head's gradient (tied).
  float* dembed = G("model.embed_tokens.weight");
  if (!c.tie_embeddings)
    std::fill(dembed, dembed + table_.Find("model.embed_tokens.weight").numel, 0.0f);
  k::embedding_backward(dembed, b.dx.data(), b.tokens.data(), N, C);
}

}  // namespace crucible
