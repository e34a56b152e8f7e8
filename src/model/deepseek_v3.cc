// Forward and backward of the DeepSeek-V3 decoder over one micro-batch (model/deepseek_v3.h).
#include "model/deepseek_v3.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "common/error.h"
#include "common/strings.h"
#include "kernels/cpu/kernels.h"
#include "model/decoder_common.h"

namespace crucible {

// Activations of one micro-batch, planned once, in the backend's memory. N = B*T rows; widths as
// in the header (H heads, Dq, Dv, Rq, Rkv, Dr; F the dense FFN, Fs the shared experts', Fm an
// expert's; E experts, K per token).
struct DeepSeekV3Model::Buffers {
  using Floats = DeviceArray<float>;
  struct Layer {
    Floats x_in, ln1, ln1_rstd;                    // (N,C) (N,C) (N)
    Floats qa, qa_n, qa_rstd;                      // (N,Rq) x2, (N): with query compression
    Floats q;                                      // (N,H,Dq), RoPE on its last Dr of each head
    Floats kv_c, kv_n, kv_rstd;                    // (N,Rkv) x2, (N)
    Floats kpe;                                    // (N,Dr) after RoPE
    Floats kvb;                                    // (N,H,Dn+Dv)
    Floats k, v;                                   // (N,H,Dq) [k_nope | k_pe], (N,H,Dv)
    Floats att, att_lse;                           // (N,H,Dv), (B,H,T)
    Floats x_mid, ln2, ln2_rstd;                   // (N,C) (N,C) (N)
    Floats gate, up, hidden;                       // (N,F) dense, or (N,Fs) shared experts
    Floats router;                                 // (N,E) logits (MoE)
    Floats expert_gate, expert_up, expert_hidden;  // (N K, Fm), expert-sorted rows (MoE)
    Floats expert_out;                             // (N K, C)
    MoeRouting routing;                            // host
    // Expert parallelism: the rows the group sent this rank's experts (M, C), M rows at most
    // ep_degree N K (every token of every rank routed here: dropless), and how they came.
    Floats expert_received;
    ExpertDispatch dispatch;
    std::vector<double> balance_f;  // (B, E) the sequence balance loss's count factors
    DeviceArray<int32_t> rows;      // (N K) routing.row on the device
    Floats weights;                 // (N K) routing.weight on the device
  };
  std::vector<Layer> layers;
  Floats x_final, lnf, lnf_rstd;
  Floats logits, head_chunk, losses, lse;
  std::unique_ptr<RopePositions> rope;  // (T, Dr/2) tables; packed rows (decoder_common.h)
  DeviceArray<int32_t> tokens, targets;
  Floats loss_weights;  // off the host only
  // Backward scratch.
  Floats dx, dln, dq, dk, dv, datt, dkvb, dkv_n, dkv_c, dkpe, dqa_n, dqa;
  Floats dgate, dup, dhidden;  // (N, max(F, Fs))
  Floats expert_in, dexpert_gate, dexpert_up, dexpert_hidden, dexpert_out, dexpert_in;  // MoE
  Floats drouter, dweights;  // (N,E), (N K)
  // Expert parallelism's owner side (M rows): its experts' outputs before they go back, the
  // output gradients it received, the input gradients it sends back; and the weight gradients
  // of its experts from each other rank's tokens ((ep_degree - 1) x its experts' floats).
  Floats expert_result, dexpert_received, dexpert_result, expert_grads_other;
  std::vector<float> host_router, host_dweights, host_drouter, host_bias;  // off the host
  std::vector<float> host_load;  // (E) the balance bias's gradient
  // Each expert's gate, up and down weights (or their gradients) in the unit being run: the
  // grouped products' pointers.
  template <typename T>
  struct ExpertTensors {
    std::vector<T*> gate, up, down;
  };
  ExpertTensors<const float> expert_w;
  ExpertTensors<float> expert_g;
  std::vector<int32_t> host_targets, predictions;
  std::vector<float> host_losses, host_logits, host_chunk;
  bool host_logits_current = false;
};

namespace {

// The floats of each buffer of Buffers, in one place for the model and its plan.
struct BufferPlan {
  double layer_attention = 0, dense_ffn = 0, moe_ffn = 0, rest = 0;
};

BufferPlan PlanBuffers(const DeepSeekV3Config& c, double B, double T, int ep_degree) {
  const double N = B * T, C = static_cast<double>(c.dim), H = static_cast<double>(c.n_heads);
  const double Dq = static_cast<double>(c.qk_head_dim()), Dv = static_cast<double>(c.v_head_dim);
  const double Dn = static_cast<double>(c.qk_nope_head_dim);
  const double Dr = static_cast<double>(c.qk_rope_head_dim);
  const double Rq = static_cast<double>(c.q_lora_rank), Rkv = static_cast<double>(c.kv_lora_rank);
  const double F = static_cast<double>(c.ffn_hidden_dim);
  const double Fm = static_cast<double>(c.moe_intermediate_size);
  const double Fs = static_cast<double>(c.n_shared_experts) * Fm;
  const double E = static_cast<double>(c.n_routed_experts);
  const double NK = N * static_cast<double>(c.num_experts_per_tok);
  const double V = static_cast<double>(c.vocab_size);
  // The rows an expert owner may hold: every token of the group's ranks (the degree's NK).
  const double ep = static_cast<double>(ep_degree), M = ep * NK;
  const double expert_params = 3 * Fm * C * E / ep;  // this rank's experts
  BufferPlan p;
  p.layer_attention = 2 * N * C + N + (Rq > 0 ? 2 * N * Rq + N : 0) + N * H * Dq + 2 * N * Rkv + N +
                      N * Dr + N * H * (Dn + Dv) + N * H * Dq + 2 * N * H * Dv + B * H * T +
                      2 * N * C + N;
  p.dense_ffn = 3 * N * F;
  // The rows and the weights: 4 bytes each, counted as floats.
  p.moe_ffn = 3 * N * Fs + N * E + 3 * M * Fm + NK * C + 2 * NK + (ep > 1 ? M * C : 0);
  const bool any_moe = c.moe_layers() > 0, any_dense = c.moe_layers() < c.n_layers;
  const double ffn = std::max(any_dense ? F : 0.0, any_moe ? Fs : 0.0);
  p.rest = 2 * N * C + N + FusedHeadRowsPlanned(N, V) * V + 2 * N + T * Dr + 2 * N + 2 * N * C +
           2 * N * H * Dq + 2 * N * H * Dv + N * H * (Dn + Dv) + 2 * N * Rkv + N * Dr +
           (Rq > 0 ? 2 * N * Rq : 0) + 3 * N * ffn +
           (any_moe ? 3 * M * Fm + 3 * NK * C + N * E + NK : 0) +
           (any_moe && ep > 1 ? 3 * M * C + (ep - 1) * expert_params : 0);
  return p;
}

}  // namespace

double PlannedDeepSeekV3ActivationBytes(const DeepSeekV3Config& c, double B, double T,
                                        int ep_degree) {
  const BufferPlan p = PlanBuffers(c, B, T, ep_degree);
  const double dense = static_cast<double>(c.n_layers - c.moe_layers());
  const double moe = static_cast<double>(c.moe_layers());
  return 4 * (static_cast<double>(c.n_layers) * p.layer_attention + dense * p.dense_ffn +
              moe * p.moe_ffn + p.rest);
}

DeepSeekV3TensorOffsets FindDeepSeekV3Tensors(const ParameterTable& table,
                                              const DeepSeekV3Config& c, int ep_degree,
                                              int ep_rank) {
  const int64_t C = c.dim, Fm = c.moe_intermediate_size, E = c.n_routed_experts;
  const int64_t Fs = c.n_shared_experts * Fm, Rq = c.q_lora_rank;
  DeepSeekV3TensorOffsets offsets;
  offsets.layers.resize(static_cast<size_t>(c.n_layers));
  auto in_unit = [&](const std::string& name, size_t unit) {
    return table.OffsetInUnit(name, unit);
  };
  const size_t tail = static_cast<size_t>(table.tail_unit());
  offsets.embed = in_unit("model.embed_tokens.weight", 0);
  offsets.final_norm = in_unit("model.norm.weight", tail);
  if (!c.tie_embeddings) offsets.head = in_unit("lm_head.weight", tail);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const size_t unit = static_cast<size_t>(1 + l);
    auto at = [&](const std::string& name) { return in_unit(p + name, unit); };
    DeepSeekV3LayerOffsets& o = offsets.layers[static_cast<size_t>(l)];
    o.ln1 = at("input_layernorm.weight");
    if (Rq > 0) {
      o.q_a = at("self_attn.q_a_proj.weight");
      o.q_a_norm = at("self_attn.q_a_layernorm.weight");
      o.q = at("self_attn.q_b_proj.weight");
    } else {
      o.q = at("self_attn.q_proj.weight");
    }
    o.kv_a = at("self_attn.kv_a_proj_with_mqa.weight");
    o.kv_a_norm = at("self_attn.kv_a_layernorm.weight");
    o.kv_b = at("self_attn.kv_b_proj.weight");
    o.o = at("self_attn.o_proj.weight");
    o.ln2 = at("post_attention_layernorm.weight");
    if (!c.moe_layer(l)) {
      o.gate = at("mlp.gate_proj.weight");
      o.up = at("mlp.up_proj.weight");
      o.down = at("mlp.down_proj.weight");
      continue;
    }
    o.router = at("mlp.gate.weight");
    o.bias = at("mlp.gate.e_score_correction_bias");
    if (Fs > 0) {
      o.gate = at("mlp.shared_experts.gate_proj.weight");
      o.up = at("mlp.shared_experts.up_proj.weight");
      o.down = at("mlp.shared_experts.down_proj.weight");
    }
    // The routed experts this rank holds (all but under expert parallelism), in order.
    const int64_t held = E / ep_degree, first = held * ep_rank;
    o.expert.resize(held);
    for (int64_t e = 0; e < held; ++e) {
      const std::string x = "mlp.experts." + std::to_string(first + e) + ".";
      o.expert[e] = at(x + "gate_proj.weight");
      // The table lays out gate, up, down of an expert one after the other.
      if (at(x + "up_proj.weight") != o.expert[e] + Fm * C ||
          at(x + "down_proj.weight") != o.expert[e] + 2 * Fm * C)
        throw Error(kExitFailure, "internal: expert " + p + x + " is not laid out gate, up, down");
    }
  }
  return offsets;
}

DeepSeekV3Model::DeepSeekV3Model(const DeepSeekV3Config& config, int64_t batch_size,
                                 int64_t seq_len, std::shared_ptr<ComputeBackend> backend,
                                 const ModelParallelism& parallelism)
    : config_(config),
      table_(DeepSeekV3ParameterTable(config, parallelism.ep_degree, parallelism.ep_rank)),
      B_(batch_size),
      T_(seq_len),
      T_max_(seq_len),
      backend_(std::move(backend)),
      buffers_(new Buffers) {
  if (std::string why = backend_->inherited_kernels_refused(); !why.empty())
    throw UsageError("model.name = \"deepseek_v3\" on training.device = \"" + backend_->name() +
                     "\": its MLA and mixture-of-experts kernels have no version on this backend "
                     "yet (" +
                     why + ")");
  if (parallelism.ep_degree > 1) {
    if (!backend_->host_memory())
      throw UsageError(
          "parallelism.expert_parallel_degree > 1 runs on training.device = \"cpu\" "
          "only so far");
    experts_ = std::make_unique<ExpertParallelOps>(parallelism, config.n_routed_experts);
  }
  units_ = std::make_unique<UnitMemory>(table_, *backend_);
  const DeepSeekV3Config& c = config;
  const int64_t N = B_ * T_, C = c.dim, H = c.n_heads, Dq = c.qk_head_dim(), Dv = c.v_head_dim;
  const int64_t Dn = c.qk_nope_head_dim, Dr = c.qk_rope_head_dim, Rq = c.q_lora_rank;
  const int64_t Rkv = c.kv_lora_rank, F = c.ffn_hidden_dim, Fm = c.moe_intermediate_size;
  const int64_t Fs = c.n_shared_experts * Fm, E = c.n_routed_experts;
  const int64_t NK = N * c.num_experts_per_tok, V = c.vocab_size;
  const int64_t ep = parallelism.ep_degree, M = ep * NK;  // an expert owner's rows, at most
  ComputeBackend& be = *backend_;
  Buffers& b = *buffers_;
  auto floats = [&](int64_t n) { return Buffers::Floats(be, static_cast<size_t>(n)); };
  b.layers.resize(c.n_layers);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    Buffers::Layer& L = b.layers[l];
    L.x_in = floats(N * C);
    L.ln1 = floats(N * C);
    L.ln1_rstd = floats(N);
    if (Rq > 0) {
      L.qa = floats(N * Rq);
      L.qa_n = floats(N * Rq);
      L.qa_rstd = floats(N);
    }
    L.q = floats(N * H * Dq);
    L.kv_c = floats(N * Rkv);
    L.kv_n = floats(N * Rkv);
    L.kv_rstd = floats(N);
    L.kpe = floats(N * Dr);
    L.kvb = floats(N * H * (Dn + Dv));
    L.k = floats(N * H * Dq);
    L.v = floats(N * H * Dv);
    L.att = floats(N * H * Dv);
    L.att_lse = floats(B_ * H * T_);
    L.x_mid = floats(N * C);
    L.ln2 = floats(N * C);
    L.ln2_rstd = floats(N);
    const int64_t width = c.moe_layer(l) ? Fs : F;
    L.gate = floats(N * width);
    L.up = floats(N * width);
    L.hidden = floats(N * width);
    if (c.moe_layer(l)) {
      L.router = floats(N * E);
      L.expert_gate = floats(M * Fm);
      L.expert_up = floats(M * Fm);
      L.expert_hidden = floats(M * Fm);
      L.expert_out = floats(NK * C);
      if (ep > 1) L.expert_received = floats(M * C);
      L.rows = DeviceArray<int32_t>(be, NK);
      L.weights = floats(NK);
    }
  }
  b.x_final = floats(N * C);
  b.lnf = floats(N * C);
  b.lnf_rstd = floats(N);
  b.head_chunk = floats(FusedHeadRows(N, V) * V);
  b.losses = floats(N);
  b.lse = floats(N);
  b.rope = std::make_unique<RopePositions>(be, B_, T_, Dr, c.rope_theta);
  b.tokens = DeviceArray<int32_t>(be, N);
  b.targets = DeviceArray<int32_t>(be, N);
  b.host_targets.resize(N);
  b.dx = floats(N * C);
  b.dln = floats(N * C);
  b.dq = floats(N * H * Dq);
  b.dk = floats(N * H * Dq);
  b.dv = floats(N * H * Dv);
  b.datt = floats(N * H * Dv);
  b.dkvb = floats(N * H * (Dn + Dv));
  b.dkv_n = floats(N * Rkv);
  b.dkv_c = floats(N * Rkv);
  b.dkpe = floats(N * Dr);
  if (Rq > 0) {
    b.dqa_n = floats(N * Rq);
    b.dqa = floats(N * Rq);
  }
  const bool any_moe = c.moe_layers() > 0, any_dense = c.moe_layers() < c.n_layers;
  const int64_t ffn = std::max(any_dense ? F : 0, any_moe ? Fs : 0);
  b.dgate = floats(N * ffn);
  b.dup = floats(N * ffn);
  b.dhidden = floats(N * ffn);
  if (any_moe) {
    b.expert_in = floats(NK * C);
    b.dexpert_gate = floats(M * Fm);
    b.dexpert_up = floats(M * Fm);
    b.dexpert_hidden = floats(M * Fm);
    if (ep > 1) {
      b.expert_result = floats(M * C);
      b.dexpert_received = floats(M * C);
      b.dexpert_result = floats(M * C);
      b.expert_grads_other = floats((ep - 1) * 3 * Fm * C * (E / ep));
    }
    b.dexpert_out = floats(NK * C);
    b.dexpert_in = floats(NK * C);
    b.drouter = floats(N * E);
    b.dweights = floats(NK);
  }
  if (!be.host_memory()) {
    b.loss_weights = floats(N);
    b.host_losses.resize(N);
  }

  const DeepSeekV3TensorOffsets offsets =
      FindDeepSeekV3Tensors(table_, c, parallelism.ep_degree, parallelism.ep_rank);
  embed_ = offsets.embed;
  final_norm_ = offsets.final_norm;
  head_ = offsets.head;
  layers_ = offsets.layers;
}

DeepSeekV3Model::~DeepSeekV3Model() {
  delete buffers_;
}

size_t DeepSeekV3Model::activation_bytes() const {
  const Buffers& b = *buffers_;
  size_t floats = 0;
  for (const auto& L : b.layers)
    floats += L.x_in.size() + L.ln1.size() + L.ln1_rstd.size() + L.qa.size() + L.qa_n.size() +
              L.qa_rstd.size() + L.q.size() + L.kv_c.size() + L.kv_n.size() + L.kv_rstd.size() +
              L.kpe.size() + L.kvb.size() + L.k.size() + L.v.size() + L.att.size() +
              L.att_lse.size() + L.x_mid.size() + L.ln2.size() + L.ln2_rstd.size() + L.gate.size() +
              L.up.size() + L.hidden.size() + L.router.size() + L.expert_gate.size() +
              L.expert_up.size() + L.expert_hidden.size() + L.expert_out.size() + L.rows.size() +
              L.weights.size() + L.expert_received.size();
  floats += b.x_final.size() + b.lnf.size() + b.lnf_rstd.size() + b.logits.size() +
            b.head_chunk.size() + b.losses.size() + b.lse.size() + b.rope->floats() +
            b.tokens.size() + b.targets.size() + b.loss_weights.size() + b.dx.size() +
            b.dln.size() + b.dq.size() + b.dk.size() + b.dv.size() + b.datt.size() + b.dkvb.size() +
            b.dkv_n.size() + b.dkv_c.size() + b.dkpe.size() + b.dqa_n.size() + b.dqa.size() +
            b.dgate.size() + b.dup.size() + b.dhidden.size() + b.expert_in.size() +
            b.dexpert_gate.size() + b.dexpert_up.size() + b.dexpert_hidden.size() +
            b.dexpert_out.size() + b.dexpert_in.size() + b.drouter.size() + b.dweights.size() +
            b.expert_result.size() + b.dexpert_received.size() + b.dexpert_result.size() +
            b.expert_grads_other.size();
  return floats * sizeof(float);
}

const MoeRouting* DeepSeekV3Model::routing(int64_t layer) const {
  if (layer < 0 || layer >= config_.n_layers || !config_.moe_layer(layer)) return nullptr;
  return &buffers_->layers[layer].routing;
}

std::vector<ExpertLoad> DeepSeekV3Model::ExpertLoads() const {
  std::vector<ExpertLoad> loads;
  for (int64_t l = 0; l < config_.n_layers; ++l) {
    if (!config_.moe_layer(l)) continue;
    const MoeRouting& r = buffers_->layers[l].routing;
    ExpertLoad& load = loads.emplace_back();
    load.layer = static_cast<int>(l);
    load.tokens.assign(config_.n_routed_experts, 0);
    if (r.expert_begin.empty()) continue;  // before the first Forward
    for (int64_t e = 0; e < config_.n_routed_experts; ++e) load.tokens[e] = r.Load(e);
  }
  return loads;
}

void DeepSeekV3Model::AttentionForward(int64_t l, const float* w) {
  Buffers& b = *buffers_;
  Buffers::Layer& L = b.layers[l];
  ComputeBackend& be = *backend_;
  const DeepSeekV3Config& c = config_;
  const LayerOffsets& o = layers_[l];
  const int64_t N = B_ * T_, C = c.dim, H = c.n_heads, Dq = c.qk_head_dim(), Dv = c.v_head_dim;
  const int64_t Dn = c.qk_nope_head_dim, Dr = c.qk_rope_head_dim, Rq = c.q_lora_rank;
  const int64_t Rkv = c.kv_lora_rank;
  const float eps = static_cast<float>(c.norm_eps);
  const float* ln1 = L.ln1.data();
  // Queries, through their latent when compressed.
  if (Rq > 0) {
    be.MatmulForward(L.qa.data(), ln1, w + o.q_a, N, C, Rq);
    be.RmsnormForward(L.qa_n.data(), L.qa_rstd.data(), L.qa.data(), w + o.q_a_norm, N, Rq, eps);
    be.MatmulForward(L.q.data(), L.qa_n.data(), w + o.q, N, Rq, H * Dq);
  } else {
    be.MatmulForward(L.q.data(), ln1, w + o.q, N, C, H * Dq);
  }
  // The key/value latent and the shared RoPE key: rows [0, Rkv) and [Rkv, Rkv + Dr) of
  // kv_a_proj_with_mqa, as two products.
  be.MatmulForward(L.kv_c.data(), ln1, w + o.kv_a, N, C, Rkv);
  be.MatmulForward(L.kpe.data(), ln1, w + o.kv_a + Rkv * C, N, C, Dr);
  be.RmsnormForward(L.kv_n.data(), L.kv_rstd.data(), L.kv_c.data(), w + o.kv_a_norm, N, Rkv, eps);
  be.MatmulForward(L.kvb.data(), L.kv_n.data(), w + o.kv_b, N, Rkv, H * (Dn + Dv));
  const RopePositions& rope = *b.rope;
  be.RopeForwardStrided(L.q.data(), rope.cos(), rope.sin(), rope.batch(), rope.seq(), H, Dr, Dq,
                        Dn);
  be.RopeForward(L.kpe.data(), rope.cos(), rope.sin(), rope.batch(), rope.seq(), 1, Dr);
  // key = [k_nope | k_pe] per head; the values at their own width (HeadDims).
  be.CopyColumns(L.k.data(), Dq, L.kvb.data(), Dn + Dv, N * H, Dn, false);
  for (int64_t h = 0; h < H; ++h)
    be.CopyColumns(L.k.data() + h * Dq + Dn, H * Dq, L.kpe.data(), Dr, N, Dr, false);
  be.CopyColumns(L.v.data(), Dv, L.kvb.data() + Dn, Dn + Dv, N * H, Dv, false);
  be.AttentionForward(L.att.data(), L.att_lse.data(), L.q.data(), L.k.data(), L.v.data(), B_, T_, H,
                      H, HeadDims(Dq, Dv), rope.positions());
  be.MatmulForward(L.x_mid.data(), L.att.data(), w + o.o, N, H * Dv, C);
  be.Add(L.x_mid.data(), L.x_in.data(), N * C);
}

void DeepSeekV3Model::FfnForward(int64_t l, const float* w, float* x_out) {
  Buffers& b = *buffers_;
  Buffers::Layer& L = b.layers[l];
  ComputeBackend& be = *backend_;
  const DeepSeekV3Config& c = config_;
  const LayerOffsets& o = layers_[l];
  const int64_t N = B_ * T_, C = c.dim, F = c.ffn_hidden_dim, Fm = c.moe_intermediate_size;
  const int64_t Fs = c.n_shared_experts * Fm, E = c.n_routed_experts;
  const int64_t K = c.num_experts_per_tok;
  const float* ln2 = L.ln2.data();
  auto mlp = [&](int64_t width) {
    be.MatmulForward(L.gate.data(), ln2, w + o.gate, N, C, width);
    be.MatmulForward(L.up.data(), ln2, w + o.up, N, C, width);
    be.SwigluForward(L.hidden.data(), L.gate.data(), L.up.data(), N, width);
    be.MatmulForward(x_out, L.hidden.data(), w + o.down, N, width, C);
  };
  if (!c.moe_layer(l)) {
    mlp(F);
    be.Add(x_out, L.x_mid.data(), N * C);
    return;
  }
  // Route on the host.
  be.MatmulForward(L.router.data(), ln2, w + o.router, N, C, E);
  const float* logits = L.router.data();
  if (!be.host_memory()) {
    b.host_router.resize(N * E);
    L.router.CopyTo(b.host_router.data(), N * E);
    logits = b.host_router.data();
  }
  const float* bias = w + o.bias;
  if (!be.host_memory()) {
    b.host_bias.resize(E);
    be.CopyToHost(b.host_bias.data(), bias, E * sizeof(float));
    bias = b.host_bias.data();
  }
  RouteTokens(c.router(), logits, bias, N, &L.routing);
  if (c.aux_loss_alpha > 0)
    aux_ += SequenceBalanceLoss(c.router(), L.routing, B_, T_, &L.balance_f);
  L.rows.CopyFrom(L.routing.row.data(), N * K);
  L.weights.CopyFrom(L.routing.weight.data(), N * K);
  // The shared experts write x_out; the routed experts' weighted outputs are added to it.
  if (Fs > 0)
    mlp(Fs);
  else
    be.Fill(x_out, N * C, 0.0f);
  be.GatherRows(b.expert_in.data(), ln2, L.rows.data(), N, K, C);
  ExpertsForward(l, w);
  be.MoeCombine(x_out, L.expert_out.data(), L.rows.data(), L.weights.data(), N, K, C);
  be.Add(x_out, L.x_mid.data(), N * C);
}

namespace {

// The experts' weight (or gradient) pointers of the grouped products' groups, source-major:
// group s El + e is this rank's expert e's (`expert`: the offsets of the El experts it holds),
// for every source s of `sources` (1 without expert parallelism); `other` (not null) gives a
// source's group its own gradient buffers instead, except for source `self`'s.
template <typename T, typename Tensors>
void GroupPointers(T* base, const std::vector<size_t>& expert, size_t size, int64_t El, int sources,
                   int self, T* other, Tensors* out) {
  const size_t G = static_cast<size_t>(sources) * static_cast<size_t>(El);
  out->gate.resize(G);
  out->up.resize(G);
  out->down.resize(G);
  for (int s = 0; s < sources; ++s)
    for (int64_t e = 0; e < El; ++e) {
      const size_t g = static_cast<size_t>(s) * static_cast<size_t>(El) + static_cast<size_t>(e);
      T* at = base + expert[static_cast<size_t>(e)];
      if (other && s != self)  // the other sources' buffers, in source order without self
        at = other + (static_cast<size_t>(s < self ? s : s - 1) * static_cast<size_t>(El) +
                      static_cast<size_t>(e)) *
                         3 * size;
      out->gate[g] = at;
      out->up[g] = at + size;
      out->down[g] = at + 2 * size;
    }
}

std::string LayerWhat(const char* what, int64_t l) {
  return StrFormat("expert_parallel %s of layer %lld", what, (long long)l);
}

}  // namespace

void DeepSeekV3Model::ExpertsForward(int64_t l, const float* w) {
  Buffers& b = *buffers_;
  Buffers::Layer& L = b.layers[l];
  ComputeBackend& be = *backend_;
  const DeepSeekV3Config& c = config_;
  const int64_t C = c.dim, Fm = c.moe_intermediate_size;
  // This rank's expert-sorted rows, one group per expert; under expert parallelism they go to
  // their experts' owners first, and the owner runs one group per (source, expert) of what it
  // received (each group alone: the bits of degree 1) and sends the results back.
  const float* rows = b.expert_in.data();
  const int64_t* begin = L.routing.expert_begin.data();
  float* out = L.expert_out.data();
  int sources = 1, self = 0;
  if (experts_) {
    ExpertParallelOps& ep = *experts_;
    L.dispatch = ep.Plan(begin, LayerWhat("row counts", l).c_str());
    ep.Dispatch(L.dispatch, rows, L.expert_received.data(), C, LayerWhat("dispatch", l).c_str());
    rows = L.expert_received.data();
    begin = L.dispatch.begin.data();
    out = b.expert_result.data();
    sources = ep.degree();
    self = ep.rank();
  }
  const int64_t El = static_cast<int64_t>(layers_[l].expert.size()), G = sources * El;
  const int64_t M = begin[G] - begin[0];
  GroupPointers(w, layers_[l].expert, static_cast<size_t>(Fm * C), El, sources, self,
                static_cast<const float*>(nullptr), &b.expert_w);
  be.GroupedMatmulForward(L.expert_gate.data(), rows, b.expert_w.gate.data(), begin, G, C, Fm);
  be.GroupedMatmulForward(L.expert_up.data(), rows, b.expert_w.up.data(), begin, G, C, Fm);
  be.SwigluForward(L.expert_hidden.data(), L.expert_gate.data(), L.expert_up.data(), M, Fm);
  be.GroupedMatmulForward(out, L.expert_hidden.data(), b.expert_w.down.data(), begin, G, Fm, C);
  if (experts_)
    experts_->Combine(L.dispatch, out, L.expert_out.data(), C, LayerWhat("combine", l).c_str());
}

void DeepSeekV3Model::ExpertsBackward(int64_t l, const float* w, float* g,
                                      ParameterAccess& access) {
  Buffers& b = *buffers_;
  Buffers::Layer& L = b.layers[l];
  ComputeBackend& be = *backend_;
  const DeepSeekV3Config& c = config_;
  const int64_t C = c.dim, Fm = c.moe_intermediate_size;
  // As ExpertsForward: the output gradients to the owners, the products over the same groups,
  // the input gradients back. An expert no row of a group chose gets a zero gradient there (the
  // grouped products write it).
  const float* dout = b.dexpert_out.data();
  const float* rows = b.expert_in.data();
  const int64_t* begin = L.routing.expert_begin.data();
  float* din = b.dexpert_in.data();
  float* other = nullptr;  // the other sources' weight gradients, each added by itself below
  int sources = 1, self = 0;
  if (experts_) {
    ExpertParallelOps& ep = *experts_;
    ep.Dispatch(L.dispatch, dout, b.dexpert_received.data(), C,
                LayerWhat("gradient dispatch", l).c_str());
    dout = b.dexpert_received.data();
    rows = L.expert_received.data();
    begin = L.dispatch.begin.data();
    din = b.dexpert_result.data();
    other = b.expert_grads_other.data();
    sources = ep.degree();
    self = ep.rank();
  } else {
    be.GatherRows(b.expert_in.data(), L.ln2.data(), L.rows.data(), B_ * T_, c.num_experts_per_tok,
                  C);
  }
  const std::vector<size_t>& expert = layers_[l].expert;
  const size_t size = static_cast<size_t>(Fm * C);
  const int64_t El = static_cast<int64_t>(expert.size()), G = sources * El;
  const int64_t M = begin[G] - begin[0];
  GroupPointers(w, expert, size, El, sources, self, static_cast<const float*>(nullptr),
                &b.expert_w);
  GroupPointers(g, expert, size, El, sources, self, other, &b.expert_g);
  be.GroupedMatmulBackward(b.dexpert_hidden.data(), b.expert_g.down.data(), dout,
                           L.expert_hidden.data(), b.expert_w.down.data(), begin, G, Fm, C, false);
  be.SwigluBackward(b.dexpert_gate.data(), b.dexpert_up.data(), b.dexpert_hidden.data(),
                    L.expert_gate.data(), L.expert_up.data(), M, Fm);
  be.GroupedMatmulBackward(din, b.expert_g.gate.data(), b.dexpert_gate.data(), rows,
                           b.expert_w.gate.data(), begin, G, C, Fm, false);
  be.GroupedMatmulBackward(din, b.expert_g.up.data(), b.dexpert_up.data(), rows,
                           b.expert_w.up.data(), begin, G, C, Fm, true);
  if (!experts_) return;
  experts_->Combine(L.dispatch, din, b.dexpert_in.data(), C,
                    LayerWhat("gradient combine", l).c_str());
  const int unit = static_cast<int>(1 + l);
  const size_t mine = table_.units()[static_cast<size_t>(unit)].begin + expert[0];
  const size_t count = static_cast<size_t>(El) * 3 * size;
  for (int s = 0; s + 1 < sources; ++s)
    access.AddGradient(unit, mine, mine + count, other + static_cast<size_t>(s) * count);
}

void DeepSeekV3Model::SetLength(int64_t seq_len) {
  const int64_t T = seq_len > 0 ? seq_len : T_max_;
  if (T > T_max_ || (T != T_max_ && experts_))
    throw Error(kExitFailure,
                StrFormat("internal: a forward of rows of %lld positions on a model built for "
                          "%lld%s",
                          (long long)T, (long long)T_max_,
                          T > T_max_ ? "" : " under expert parallelism (not supported)"));
  T_ = T;
  buffers_->rope->SetLength(T);
}

LossSum DeepSeekV3Model::Forward(ParameterAccess& access, const int32_t* tokens,
                                 const int32_t* targets, const float* loss_weights,
                                 const ForwardOptions& options) {
  SetLength(options.seq_len);
  Buffers& b = *buffers_;
  ComputeBackend& be = *backend_;
  const DeepSeekV3Config& c = config_;
  const int64_t N = B_ * T_, C = c.dim, V = c.vocab_size, L = c.n_layers;
  const int tail = table_.tail_unit();
  const float eps = static_cast<float>(c.norm_eps);
  b.tokens.CopyFrom(tokens, N);
  b.rope->Set(options.positions);
  aux_ = 0;
  loss_weights_ = loss_weights;
  if (loss_weights && !be.host_memory()) b.loss_weights.CopyFrom(loss_weights, N);
  const float* unit0 = units_->Weights(access, 0);
  access.Prefetch(L > 0 ? 1 : tail);
  float* x0 = b.layers.empty() ? b.x_final.data() : b.layers[0].x_in.data();
  be.EmbeddingForward(x0, b.tokens.data(), unit0 + embed_, N, C);
  if (!c.tie_embeddings) access.ReleaseWeights(0);
  for (int64_t l = 0; l < L; ++l) {
    Buffers::Layer& Lb = b.layers[l];
    const int unit = static_cast<int>(1 + l);
    const float* w = units_->Weights(access, unit);
    access.Prefetch(l + 1 < L ? unit + 1 : tail);
    float* x_out = l + 1 < L ? b.layers[l + 1].x_in.data() : b.x_final.data();
    be.RmsnormForward(Lb.ln1.data(), Lb.ln1_rstd.data(), Lb.x_in.data(), w + layers_[l].ln1, N, C,
                      eps);
    AttentionForward(l, w);
    be.RmsnormForward(Lb.ln2.data(), Lb.ln2_rstd.data(), Lb.x_mid.data(), w + layers_[l].ln2, N, C,
                      eps);
    FfnForward(l, w, x_out);
    access.ReleaseWeights(unit);
  }
  const float* wt = units_->Weights(access, tail);
  be.RmsnormForward(b.lnf.data(), b.lnf_rstd.data(), b.x_final.data(), wt + final_norm_, N, C, eps);
  const float* head = c.tie_embeddings ? unit0 + embed_ : wt + head_;
  SetTargets(targets);
  fused_ = scored_ = false;
  if (options.head == ForwardOptions::Head::kFused) {
    const int unit = c.tie_embeddings ? 0 : tail;
    float* dhead = units_->Gradients(access, unit) + (c.tie_embeddings ? embed_ : head_);
    const float* weights =
        loss_weights ? (be.host_memory() ? loss_weights : b.loss_weights.data()) : nullptr;
    FusedHeadChunks(be, b.lnf.data(), head, N, C, V, b.targets.data(), weights, options.loss_scale,
                    b.head_chunk.data(), b.losses.data(), b.lse.data(), b.dln.data(), dhead);
    fused_ = true;
    fused_scale_ = options.loss_scale;
  } else if (options.head == ForwardOptions::Head::kScored) {
    b.predictions.assign(N, -1);
    ScoredHeadChunks(be, b.lnf.data(), head, N, C, V, b.targets.data(), targets,
                     b.head_chunk.data(), b.losses.data(), b.lse.data(), b.predictions.data(),
                     &b.host_chunk);
    scored_ = true;
  } else {
    if (!b.logits.data())  // for the longest rows
      b.logits = Buffers::Floats(be, static_cast<size_t>(B_ * T_max_ * V));
    be.MatmulForward(b.logits.data(), b.lnf.data(), head, N, C, V);
    be.CrossEntropyForward(b.losses.data(), b.lse.data(), b.logits.data(), b.targets.data(), N, V);
    b.host_logits_current = false;
  }
  if (!be.host_memory()) b.losses.CopyTo(b.host_losses.data(), N);
  access.ReleaseWeights(tail);
  if (c.tie_embeddings) access.ReleaseWeights(0);
  return SumWithAux(SumLosses(losses(), targets, loss_weights_, N));
}

LossSum DeepSeekV3Model::SumWithAux(LossSum sum) const {
  // Each sequence's balance loss counts as its T tokens (DeepSeekV3Config::aux_loss_alpha).
  sum.aux = config_.aux_loss_alpha * static_cast<double>(T_) * aux_;
  return sum;
}

void DeepSeekV3Model::SetTargets(const int32_t* targets) {
  Buffers& b = *buffers_;
  const int64_t N = B_ * T_;
  kernels::check_targets(targets, N, config_.vocab_size);
  std::memcpy(b.host_targets.data(), targets, N * sizeof(int32_t));
  b.targets.CopyFrom(targets, N);
}

const float* DeepSeekV3Model::logits() const {
  Buffers& b = *buffers_;
  if (fused_ || scored_ || !b.logits.data())
    throw Error(kExitFailure,
                "internal: logits() after a fused or scored forward (ask Forward for "
                "ForwardOptions::Logits())");
  if (backend_->host_memory()) return b.logits.data();
  if (!b.host_logits_current) {
    b.host_logits.resize(b.logits.size());
    b.logits.CopyTo(b.host_logits.data(), b.logits.size());
    b.host_logits_current = true;
  }
  return b.host_logits.data();
}

const float* DeepSeekV3Model::losses() const {
  return backend_->host_memory() ? buffers_->losses.data() : buffers_->host_losses.data();
}

const int32_t* DeepSeekV3Model::predictions() const {
  if (!scored_)
    throw Error(kExitFailure,
                "internal: predictions() without a scored forward (ask Forward for "
                "ForwardOptions::Scored())");
  return buffers_->predictions.data();
}

LossSum DeepSeekV3Model::Retarget(const int32_t* targets) {
  Buffers& b = *buffers_;
  const int64_t N = B_ * T_;
  if (fused_ || scored_ || !b.logits.data())
    throw Error(kExitFailure,
                "internal: Retarget after a fused or scored forward (no logits kept; ask "
                "Forward for ForwardOptions::Logits())");
  SetTargets(targets);
  backend_->CrossEntropyForward(b.losses.data(), b.lse.data(), b.logits.data(), b.targets.data(), N,
                                config_.vocab_size);
  b.host_logits_current = false;
  if (!backend_->host_memory()) b.losses.CopyTo(b.host_losses.data(), N);
  return SumWithAux(SumLosses(losses(), targets, loss_weights_, N));  // the forward's aux
}

LossSum DeepSeekV3Model::Reweight(const float* loss_weights) {
  Buffers& b = *buffers_;
  const int64_t N = B_ * T_;
  if (fused_ || scored_ || !b.logits.data())
    throw Error(kExitFailure,
                "internal: Reweight after a fused or scored forward (no logits kept; ask "
                "Forward for ForwardOptions::Logits())");
  loss_weights_ = loss_weights;
  if (loss_weights && !backend_->host_memory()) b.loss_weights.CopyFrom(loss_weights, N);
  return SumWithAux(SumLosses(losses(), b.host_targets.data(), loss_weights_, N));  // forward's aux
}

void DeepSeekV3Model::FfnBackward(int64_t l, const float* w, float* g, float loss_scale,
                                  ParameterAccess& access) {
  Buffers& b = *buffers_;
  Buffers::Layer& L = b.layers[l];
  ComputeBackend& be = *backend_;
  const DeepSeekV3Config& c = config_;
  const LayerOffsets& o = layers_[l];
  const int64_t N = B_ * T_, C = c.dim, F = c.ffn_hidden_dim, Fm = c.moe_intermediate_size;
  const int64_t Fs = c.n_shared_experts * Fm, E = c.n_routed_experts;
  const int64_t K = c.num_experts_per_tok;
  const float* ln2 = L.ln2.data();
  const float* dx = b.dx.data();  // d x_out
  // A SwiGLU MLP's backward from dx: d ln2 into dln (overwritten).
  auto mlp = [&](int64_t width) {
    be.MatmulBackward(b.dhidden.data(), g + o.down, dx, L.hidden.data(), w + o.down, N, width, C,
                      false, false);
    be.SwigluBackward(b.dgate.data(), b.dup.data(), b.dhidden.data(), L.gate.data(), L.up.data(), N,
                      width);
    be.MatmulBackward(b.dln.data(), g + o.gate, b.dgate.data(), ln2, w + o.gate, N, C, width, false,
                      false);
    be.MatmulBackward(b.dln.data(), g + o.up, b.dup.data(), ln2, w + o.up, N, C, width, true,
                      false);
  };
  if (!c.moe_layer(l)) {
    mlp(F);
    return;
  }
  if (Fs > 0)
    mlp(Fs);
  else
    be.Fill(b.dln.data(), N * C, 0.0f);
  const MoeRouting& r = L.routing;
  // The weighted combine: each expert row's output gradient, and dL/dw of each slot.
  be.MoeCombineBackward(b.dexpert_out.data(), b.dweights.data(), dx, L.expert_out.data(),
                        L.rows.data(), L.weights.data(), N, K, C);
  ExpertsBackward(l, w, g, access);
  be.ScatterAddRows(b.dln.data(), b.dexpert_in.data(), L.rows.data(), N, K, C);
  // The router: through the weights to the logits, then its product.
  const float* dweights = b.dweights.data();
  float* drouter = b.drouter.data();
  if (!be.host_memory()) {
    b.host_dweights.resize(N * K);
    b.host_drouter.resize(N * E);
    b.dweights.CopyTo(b.host_dweights.data(), N * K);
    dweights = b.host_dweights.data();
    drouter = b.host_drouter.data();
  }
  RouteBackward(c.router(), r, dweights, drouter);
  if (c.aux_loss_alpha > 0)
    SequenceBalanceBackward(c.router(), r, B_, T_, L.balance_f,
                            c.aux_loss_alpha * static_cast<double>(loss_scale), drouter);
  if (!be.host_memory()) b.drouter.CopyFrom(b.host_drouter.data(), N * E);
  be.MatmulBackward(b.dln.data(), g + o.router, b.drouter.data(), ln2, w + o.router, N, C, E, true,
                    false);
  // The balance bias's slot: each expert's share of the N K token slots above the uniform 1/E.
  std::vector<float>& load = b.host_load;
  load.resize(E);
  for (int64_t e = 0; e < E; ++e)
    load[e] = static_cast<float>(static_cast<double>(r.Load(e)) / static_cast<double>(N * K) -
                                 1.0 / static_cast<double>(E));
  be.CopyToDevice(g + o.bias, load.data(), E * sizeof(float));
}

void DeepSeekV3Model::AttentionBackward(int64_t l, const float* w, float* g) {
  Buffers& b = *buffers_;
  Buffers::Layer& L = b.layers[l];
  ComputeBackend& be = *backend_;
  const DeepSeekV3Config& c = config_;
  const LayerOffsets& o = layers_[l];
  const int64_t N = B_ * T_, C = c.dim, H = c.n_heads, Dq = c.qk_head_dim(), Dv = c.v_head_dim;
  const int64_t Dn = c.qk_nope_head_dim, Dr = c.qk_rope_head_dim, Rq = c.q_lora_rank;
  const int64_t Rkv = c.kv_lora_rank;
  const float* ln1 = L.ln1.data();
  // dx holds d x_mid.
  be.MatmulBackward(b.datt.data(), g + o.o, b.dx.data(), L.att.data(), w + o.o, N, H * Dv, C, false,
                    false);
  be.AttentionBackward(b.dq.data(), b.dk.data(), b.dv.data(), b.datt.data(), L.att.data(),
                       L.att_lse.data(), L.q.data(), L.k.data(), L.v.data(), B_, T_, H, H,
                       HeadDims(Dq, Dv), b.rope->positions());
  const RopePositions& rope = *b.rope;
  be.RopeBackwardStrided(b.dq.data(), rope.cos(), rope.sin(), rope.batch(), rope.seq(), H, Dr, Dq,
                         Dn);
  // [k_nope | v] per head back to kv_b's output; k_pe's gradient summed over the heads in order.
  be.CopyColumns(b.dkvb.data(), Dn + Dv, b.dk.data(), Dq, N * H, Dn, false);
  be.CopyColumns(b.dkvb.data() + Dn, Dn + Dv, b.dv.data(), Dv, N * H, Dv, false);
  for (int64_t h = 0; h < H; ++h)
    be.CopyColumns(b.dkpe.data(), Dr, b.dk.data() + h * Dq + Dn, H * Dq, N, Dr, h > 0);
  be.RopeBackward(b.dkpe.data(), rope.cos(), rope.sin(), rope.batch(), rope.seq(), 1, Dr);
  be.MatmulBackward(b.dkv_n.data(), g + o.kv_b, b.dkvb.data(), L.kv_n.data(), w + o.kv_b, N, Rkv,
                    H * (Dn + Dv), false, false);
  be.Fill(b.dkv_c.data(), N * Rkv, 0.0f);
  be.RmsnormBackward(b.dkv_c.data(), g + o.kv_a_norm, b.dkv_n.data(), L.kv_c.data(),
                     w + o.kv_a_norm, L.kv_rstd.data(), N, Rkv);
  // d ln1 from the three products that read it.
  be.MatmulBackward(b.dln.data(), g + o.kv_a, b.dkv_c.data(), ln1, w + o.kv_a, N, C, Rkv, false,
                    false);
  be.MatmulBackward(b.dln.data(), g + o.kv_a + Rkv * C, b.dkpe.data(), ln1, w + o.kv_a + Rkv * C, N,
                    C, Dr, true, false);
  if (Rq > 0) {
    be.MatmulBackward(b.dqa_n.data(), g + o.q, b.dq.data(), L.qa_n.data(), w + o.q, N, Rq, H * Dq,
                      false, false);
    be.Fill(b.dqa.data(), N * Rq, 0.0f);
    be.RmsnormBackward(b.dqa.data(), g + o.q_a_norm, b.dqa_n.data(), L.qa.data(), w + o.q_a_norm,
                       L.qa_rstd.data(), N, Rq);
    be.MatmulBackward(b.dln.data(), g + o.q_a, b.dqa.data(), ln1, w + o.q_a, N, C, Rq, true, false);
  } else {
    be.MatmulBackward(b.dln.data(), g + o.q, b.dq.data(), ln1, w + o.q, N, C, H * Dq, true, false);
  }
}

void DeepSeekV3Model::Backward(ParameterAccess& access, float loss_scale) {
  Buffers& b = *buffers_;
  ComputeBackend& be = *backend_;
  const DeepSeekV3Config& c = config_;
  const int64_t N = B_ * T_, C = c.dim, V = c.vocab_size, L = c.n_layers;
  const int tail = table_.tail_unit();
  if (scored_)
    throw Error(kExitFailure,
                "internal: Backward after a scored forward (ask Forward for "
                "ForwardOptions::Logits() or Fused)");
  const float* wt = units_->Weights(access, tail);
  const float* unit0 = c.tie_embeddings ? units_->Weights(access, 0) : nullptr;
  if (L > 0) access.Prefetch(static_cast<int>(L));
  float* gt = units_->Gradients(access, tail);
  float* g0 = c.tie_embeddings ? units_->Gradients(access, 0) : nullptr;
  if (fused_) {
    if (loss_scale != fused_scale_)
      throw Error(kExitFailure,
                  "internal: Backward's loss scale differs from the fused forward's (ask Forward "
                  "for ForwardOptions::Fused with the scale Backward will get)");
  } else {
    const float* weights =
        loss_weights_ ? (be.host_memory() ? loss_weights_ : b.loss_weights.data()) : nullptr;
    be.CrossEntropyBackward(b.logits.data(), b.lse.data(), b.targets.data(), N, V, loss_scale,
                            weights);
    b.host_logits_current = false;
    if (c.tie_embeddings)
      be.MatmulBackward(b.dln.data(), g0 + embed_, b.logits.data(), b.lnf.data(), unit0 + embed_, N,
                        C, V, false, false);
    else
      be.MatmulBackward(b.dln.data(), gt + head_, b.logits.data(), b.lnf.data(), wt + head_, N, C,
                        V, false, false);
  }
  fused_ = false;
  be.Fill(b.dx.data(), b.dx.size(), 0.0f);
  be.RmsnormBackward(b.dx.data(), gt + final_norm_, b.dln.data(), b.x_final.data(),
                     wt + final_norm_, b.lnf_rstd.data(), N, C);
  access.ReleaseWeights(tail);
  units_->GradientsReady(access, tail);
  for (int64_t l = L - 1; l >= 0; --l) {
    Buffers::Layer& Lb = b.layers[l];
    const int unit = static_cast<int>(1 + l);
    const float* w = units_->Weights(access, unit);
    if (l > 0) access.Prefetch(unit - 1);
    float* g = units_->Gradients(access, unit);
    const LayerOffsets& o = layers_[l];
    FfnBackward(l, w, g, loss_scale, access);  // dln = d ln2
    be.RmsnormBackward(b.dx.data(), g + o.ln2, b.dln.data(), Lb.x_mid.data(), w + o.ln2,
                       Lb.ln2_rstd.data(), N, C);
    AttentionBackward(l, w, g);  // dln = d ln1
    be.RmsnormBackward(b.dx.data(), g + o.ln1, b.dln.data(), Lb.x_in.data(), w + o.ln1,
                       Lb.ln1_rstd.data(), N, C);
    access.ReleaseWeights(unit);
    units_->GradientsReady(access, unit);
  }
  if (!g0) g0 = units_->Gradients(access, 0);
  float* dembed = g0 + embed_;
  if (!c.tie_embeddings) be.Fill(dembed, table_.params()[0].numel, 0.0f);
  be.EmbeddingBackward(dembed, b.dx.data(), b.tokens.data(), N, C);
  if (c.tie_embeddings) access.ReleaseWeights(0);
  units_->GradientsReady(access, 0);
}

}  // namespace crucible
