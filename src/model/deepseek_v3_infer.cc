// The DeepSeek-V3 family's inference path (model/model.h InferenceModel): prefill and decode with
// a KV cache, on the parameter table, tensor offsets (FindDeepSeekV3Tensors), router
// (RouteTokens) and kernels of DeepSeekV3Model's Forward: the same layer, written for rows that
// start at a position other than 0.
//
// The cache holds the expanded keys and values of every head, not MLA's compressed latent: per
// slot, layer and position, keys (H, Dq) = [k_nope | k_pe] after RoPE and values (H, Dv), so that
// the attention is the training one's (per-head keys and values) and decode reads them directly;
// 4 L H (Dq + Dv) bytes per position (the latent would take 4 L (kv_lora_rank + Dr), at the price
// of re-expanding kv_b_proj or absorbing it into the queries at every step).
//
// Prefill (one sequence, T rows from position 0): the training forward's products
// (MatmulForward), its routing and grouped expert GEMMs, RoPE from position 0, causal
// AttentionForward with HeadDims(Dq, Dv) over the keys and values written straight into the
// slot's cache (its first T positions are a (1, T, H, D) tensor); the head on the last row only.
// Decode (n sequences, one row each at its own position p): every product through MatmulRows
// (a row's bits depend on that row alone), RoPE of each row by the table row of its position, its
// key and value written at position p of its slot, DecodeAttention with HeadDims(Dq, Dv). MoE:
// each row is routed alone (RouteTokens decides per token), and each expert's rows go through
// MatmulRows against that expert's weights, so a row's expert products do not depend on which
// other rows chose the same expert; the weighted combine adds a row's K experts in slot order.
// CopySlot: per layer, the first `length` positions of the source slot's keys (length, H, Dq) and
// of its values (length, H, Dv), each contiguous, into the same places of the target slot.
#include <algorithm>
#include <string>
#include <vector>

#include "common/error.h"
#include "compute/backend.h"
#include "kernels/cpu/kernels.h"
#include "model/decoder_common.h"
#include "model/deepseek_v3.h"
#include "model/inference_slots.h"
#include "model/inference_weights.h"

namespace crucible {
namespace {

class DeepSeekV3Inference final : public InferenceSlots {
 public:
  DeepSeekV3Inference(const DeepSeekV3Config& config, ParameterAccess& access, int64_t slots,
                      int64_t max_len, std::shared_ptr<ComputeBackend> backend,
                      WeightType weight_type);

  int64_t vocab_size() const override { return config_.vocab_size; }
  size_t kv_cache_bytes() const override { return cache_.size() * sizeof(float); }
  size_t weight_bytes() const override { return weights_.bytes(); }
  void Prefill(int64_t slot, const int32_t* tokens, int64_t count, float* logits) override;
  void Decode(const int64_t* slots, const int32_t* tokens, int64_t n, float* logits) override;

 private:
  using Floats = DeviceArray<float>;
  // Layer l's keys (max_len, H, Dq) of `slot`; its values (max_len, H, Dv) follow them.
  float* Keys(int64_t slot, int64_t layer) {
    const int64_t per_position = config_.n_heads * (config_.qk_head_dim() + config_.v_head_dim);
    return cache_.data() + (slot * config_.n_layers + layer) * max_len_ * per_position;
  }
  float* Values(int64_t slot, int64_t layer) {
    return Keys(slot, layer) + max_len_ * config_.n_heads * config_.qk_head_dim();
  }
  void CopyCache(int64_t from, int64_t to, int64_t length) override {
    const int64_t H = config_.n_heads;
    const size_t keys = static_cast<size_t>(length * H * config_.qk_head_dim());
    const size_t values = static_cast<size_t>(length * H * config_.v_head_dim);
    for (int64_t l = 0; l < config_.n_layers; ++l) {
      CopyFloats(Keys(to, l), Keys(from, l), keys);
      CopyFloats(Values(to, l), Values(from, l), values);
    }
  }
  // Writes `rows` positions of keys [k_nope | k_pe] and values from kvb_ and kpe_ (RoPE applied)
  // starting at row `first`, to `keys` (rows, H, Dq) and `values` (rows, H, Dv).
  void StoreKeysValues(int64_t first, int64_t rows, float* keys, float* values);
  // The layer stack over `n` rows whose tokens are in tokens_: `attend(l)` rotates q_ and kpe_,
  // stores the keys and values and writes the attention output to att_. `rows`: the decode
  // step's row-wise products, else the training GEMMs.
  template <typename Attend>
  void Layers(int64_t n, bool rows, Attend attend);
  // The FFN of layer l over n rows: x_ = x_mid_ + FFN(ln_).
  void Ffn(int64_t l, int unit, int64_t n, bool rows);
  void Products(bool rows, int unit, const float* inp, int64_t n, int64_t C,
                std::initializer_list<UnitProduct> outs) {
    UnitProducts(*backend_, weights_, rows, unit, inp, n, C, outs);
  }
  // Final norm and head over `n` rows starting at row `first` of x_, logits (n, V) to the host.
  void Head(int64_t first, int64_t n, float* logits);

  DeepSeekV3Config config_;
  ParameterTable table_;
  DeepSeekV3TensorOffsets offsets_;
  InferenceWeights weights_;
  Floats cache_;  // slots x layers x (keys, values)
  // Scratch for R = max(max_len, slots) rows (RK = R x num_experts_per_tok expert rows).
  Floats x_, x_mid_, ln_, rstd_, qa_, qa_n_, q_, kv_c_, kv_n_, kpe_, kvb_, att_, lse_;
  Floats gate_, up_, hidden_, router_, expert_in_, expert_gate_, expert_up_, expert_hidden_;
  Floats expert_out_, expert_weights_, logits_;
  Floats rope_cos_, rope_sin_;  // (max_len, Dr/2)
  DeviceArray<int32_t> tokens_, expert_rows_;
  MoeRouting routing_;                          // host
  std::vector<float> host_router_, host_bias_;  // off the host
  std::vector<const float*> expert_gate_w_, expert_up_w_, expert_down_w_;
};

DeepSeekV3Inference::DeepSeekV3Inference(const DeepSeekV3Config& config, ParameterAccess& access,
                                         int64_t slots, int64_t max_len,
                                         std::shared_ptr<ComputeBackend> backend,
                                         WeightType weight_type)
    : InferenceSlots(slots, max_len, std::move(backend)),
      config_(config),
      table_(DeepSeekV3ParameterTable(config)),
      offsets_(FindDeepSeekV3Tensors(table_, config)),
      // The routers stay float32 under a 16-bit type: their top-k picks experts.
      weights_(table_, access, *backend_, weight_type,
               [](const ParamInfo& p) { return p.name.ends_with("mlp.gate.weight"); }) {
  if (std::string why = backend_->inherited_kernels_refused(); !why.empty())
    throw UsageError("model.name = \"deepseek_v3\" on training.device = \"" + backend_->name() +
                     "\": its MLA and mixture-of-experts kernels have no version on this backend "
                     "yet (" +
                     why + ")");
  ComputeBackend& be = *backend_;
  const DeepSeekV3Config& c = config;
  const int64_t C = c.dim, H = c.n_heads, Dq = c.qk_head_dim(), Dv = c.v_head_dim;
  const int64_t Dn = c.qk_nope_head_dim, Dr = c.qk_rope_head_dim, Rq = c.q_lora_rank;
  const int64_t Rkv = c.kv_lora_rank, Fm = c.moe_intermediate_size;
  const int64_t Fs = c.n_shared_experts * Fm, E = c.n_routed_experts, K = c.num_experts_per_tok;
  const bool any_moe = c.moe_layers() > 0, any_dense = c.moe_layers() < c.n_layers;
  const int64_t F = std::max(any_dense ? c.ffn_hidden_dim : 0, any_moe ? Fs : 0);
  const int64_t V = c.vocab_size, L = c.n_layers, R = std::max(max_len, slots);
  const int64_t RK = any_moe ? R * K : 0;
  cache_ = Floats(be, static_cast<size_t>(slots * L * max_len * H * (Dq + Dv)));
  x_ = Scratch<float>(R * C);
  x_mid_ = Scratch<float>(R * C);
  ln_ = Scratch<float>(R * C);
  rstd_ = Scratch<float>(R);
  if (Rq > 0) {
    qa_ = Scratch<float>(R * Rq);
    qa_n_ = Scratch<float>(R * Rq);
  }
  q_ = Scratch<float>(R * H * Dq);
  kv_c_ = Scratch<float>(R * Rkv);
  kv_n_ = Scratch<float>(R * Rkv);
  kpe_ = Scratch<float>(R * Dr);
  kvb_ = Scratch<float>(R * H * (Dn + Dv));
  att_ = Scratch<float>(R * H * Dv);
  lse_ = Scratch<float>(H * R);
  gate_ = Scratch<float>(R * F);
  up_ = Scratch<float>(R * F);
  hidden_ = Scratch<float>(R * F);
  if (any_moe) {
    router_ = Scratch<float>(R * E);
    expert_in_ = Scratch<float>(RK * C);
    expert_gate_ = Scratch<float>(RK * Fm);
    expert_up_ = Scratch<float>(RK * Fm);
    expert_hidden_ = Scratch<float>(RK * Fm);
    expert_out_ = Scratch<float>(RK * C);
    expert_weights_ = Scratch<float>(RK);
    expert_rows_ = Scratch<int32_t>(RK);
  }
  logits_ = Scratch<float>(slots * V);
  tokens_ = Scratch<int32_t>(R);
  RopeTables(Dr, c.rope_theta, &rope_cos_, &rope_sin_);
}

void DeepSeekV3Inference::StoreKeysValues(int64_t first, int64_t rows, float* keys, float* values) {
  ComputeBackend& be = *backend_;
  const DeepSeekV3Config& c = config_;
  const int64_t H = c.n_heads, Dq = c.qk_head_dim(), Dv = c.v_head_dim;
  const int64_t Dn = c.qk_nope_head_dim, Dr = c.qk_rope_head_dim;
  const float* kvb = kvb_.data() + first * H * (Dn + Dv);
  // key = [k_nope | k_pe] per head (k_pe shared by the heads), the values at their own width.
  be.CopyColumns(keys, Dq, kvb, Dn + Dv, rows * H, Dn, false);
  for (int64_t h = 0; h < H; ++h)
    be.CopyColumns(keys + h * Dq + Dn, H * Dq, kpe_.data() + first * Dr, Dr, rows, Dr, false);
  be.CopyColumns(values, Dv, kvb + Dn, Dn + Dv, rows * H, Dv, false);
}

template <typename Attend>
void DeepSeekV3Inference::Layers(int64_t n, bool rows, Attend attend) {
  ComputeBackend& be = *backend_;
  const DeepSeekV3Config& c = config_;
  const int64_t C = c.dim, H = c.n_heads, Dq = c.qk_head_dim(), Dv = c.v_head_dim;
  const int64_t Dn = c.qk_nope_head_dim, Dr = c.qk_rope_head_dim, Rq = c.q_lora_rank;
  const int64_t Rkv = c.kv_lora_rank;
  const float eps = static_cast<float>(c.norm_eps);
  be.EmbeddingForward(x_.data(), tokens_.data(), weights_.unit(0) + offsets_.embed, n, C);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const int unit = static_cast<int>(1 + l);
    const float* w = weights_.unit(unit);
    const DeepSeekV3LayerOffsets& o = offsets_.layers[static_cast<size_t>(l)];
    be.RmsnormForward(ln_.data(), rstd_.data(), x_.data(), w + o.ln1, n, C, eps);
    // MLA's projections, as DeepSeekV3Model::AttentionForward computes them: those of the
    // normed input in one pass (kv_a_proj's rows are the latent's, then k_pe's).
    const size_t kpe = o.kv_a + static_cast<size_t>(Rkv * C);
    if (Rq > 0) {
      Products(rows, unit, ln_.data(), n, C,
               {{qa_.data(), o.q_a, Rq}, {kv_c_.data(), o.kv_a, Rkv}, {kpe_.data(), kpe, Dr}});
      be.RmsnormForward(qa_n_.data(), rstd_.data(), qa_.data(), w + o.q_a_norm, n, Rq, eps);
      Products(rows, unit, qa_n_.data(), n, Rq, {{q_.data(), o.q, H * Dq}});
    } else {
      Products(rows, unit, ln_.data(), n, C,
               {{q_.data(), o.q, H * Dq}, {kv_c_.data(), o.kv_a, Rkv}, {kpe_.data(), kpe, Dr}});
    }
    be.RmsnormForward(kv_n_.data(), rstd_.data(), kv_c_.data(), w + o.kv_a_norm, n, Rkv, eps);
    Products(rows, unit, kv_n_.data(), n, Rkv, {{kvb_.data(), o.kv_b, H * (Dn + Dv)}});
    attend(l);
    Products(rows, unit, att_.data(), n, H * Dv, {{x_mid_.data(), o.o, C}});
    be.Add(x_mid_.data(), x_.data(), n * C);
    be.RmsnormForward(ln_.data(), rstd_.data(), x_mid_.data(), w + o.ln2, n, C, eps);
    Ffn(l, unit, n, rows);
  }
}

void DeepSeekV3Inference::Ffn(int64_t l, int unit, int64_t n, bool rows) {
  ComputeBackend& be = *backend_;
  const DeepSeekV3Config& c = config_;
  const DeepSeekV3LayerOffsets& o = offsets_.layers[static_cast<size_t>(l)];
  const int64_t C = c.dim, Fm = c.moe_intermediate_size, Fs = c.n_shared_experts * Fm;
  const int64_t E = c.n_routed_experts, K = c.num_experts_per_tok;
  float* out = x_.data();
  const float* ln2 = ln_.data();
  const float* w = weights_.unit(unit);
  auto mlp = [&](int64_t width) {
    Products(rows, unit, ln2, n, C, {{gate_.data(), o.gate, width}, {up_.data(), o.up, width}});
    be.SwigluForward(hidden_.data(), gate_.data(), up_.data(), n, width);
    Products(rows, unit, hidden_.data(), n, width, {{out, o.down, C}});
  };
  if (!c.moe_layer(l)) {
    mlp(c.ffn_hidden_dim);
    be.Add(out, x_mid_.data(), n * C);
    return;
  }
  // Route on the host, each row by its own logits (moe_routing.h).
  Products(rows, unit, ln2, n, C, {{router_.data(), o.router, E}});
  const float* logits = router_.data();
  const float* bias = w + o.bias;
  if (!be.host_memory()) {
    host_router_.resize(static_cast<size_t>(n * E));
    router_.CopyTo(host_router_.data(), n * E);
    logits = host_router_.data();
    host_bias_.resize(static_cast<size_t>(E));
    be.CopyToHost(host_bias_.data(), bias, E * sizeof(float));
    bias = host_bias_.data();
  }
  RouteTokens(c.router(), logits, bias, n, &routing_);
  expert_rows_.CopyFrom(routing_.row.data(), n * K);
  expert_weights_.CopyFrom(routing_.weight.data(), n * K);
  // The shared experts write out; the routed experts' weighted outputs are added to it.
  if (Fs > 0)
    mlp(Fs);
  else
    be.Fill(out, n * C, 0.0f);
  be.GatherRows(expert_in_.data(), ln2, expert_rows_.data(), n, K, C);
  const int64_t* begin = routing_.expert_begin.data();
  const size_t size = static_cast<size_t>(Fm * C);
  if (rows) {
    // One expert's rows at a time, each row's products its own (MatmulRows).
    for (int64_t e = 0; e < E; ++e) {
      const int64_t first = begin[e], count = begin[e + 1] - begin[e];
      if (count == 0) continue;
      const RowWeights we = weights_.rows(unit, o.expert[static_cast<size_t>(e)]);
      const ComputeBackend::RowProduct products[2] = {
          {expert_gate_.data() + first * Fm, we, Fm},
          {expert_up_.data() + first * Fm, we.Plus(size), Fm}};
      be.MatmulRowsMany(products, 2, expert_in_.data() + first * C, count, C);
    }
    be.SwigluForward(expert_hidden_.data(), expert_gate_.data(), expert_up_.data(), n * K, Fm);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t first = begin[e], count = begin[e + 1] - begin[e];
      if (count == 0) continue;
      const RowWeights we = weights_.rows(unit, o.expert[static_cast<size_t>(e)]);
      be.MatmulRows(expert_out_.data() + first * C, expert_hidden_.data() + first * Fm,
                    we.Plus(2 * size), count, Fm, C);
    }
  } else {
    // The training forward's grouped GEMMs, one group per expert (DeepSeekV3Model's
    // ExpertsForward at expert-parallel degree 1).
    expert_gate_w_.resize(static_cast<size_t>(E));
    expert_up_w_.resize(static_cast<size_t>(E));
    expert_down_w_.resize(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      const float* we = w + o.expert[static_cast<size_t>(e)];
      expert_gate_w_[e] = we;
      expert_up_w_[e] = we + size;
      expert_down_w_[e] = we + 2 * size;
    }
    be.GroupedMatmulForward(expert_gate_.data(), expert_in_.data(), expert_gate_w_.data(), begin, E,
                            C, Fm);
    be.GroupedMatmulForward(expert_up_.data(), expert_in_.data(), expert_up_w_.data(), begin, E, C,
                            Fm);
    be.SwigluForward(expert_hidden_.data(), expert_gate_.data(), expert_up_.data(), n * K, Fm);
    be.GroupedMatmulForward(expert_out_.data(), expert_hidden_.data(), expert_down_w_.data(), begin,
                            E, Fm, C);
  }
  be.MoeCombine(out, expert_out_.data(), expert_rows_.data(), expert_weights_.data(), n, K, C);
  be.Add(out, x_mid_.data(), n * C);
}

void DeepSeekV3Inference::Head(int64_t first, int64_t n, float* logits) {
  ComputeBackend& be = *backend_;
  const int64_t C = config_.dim, V = config_.vocab_size;
  const int tail = table_.tail_unit();
  const RowWeights head = config_.tie_embeddings ? weights_.rows(0, offsets_.embed)
                                                 : weights_.rows(tail, offsets_.head);
  be.RmsnormForward(ln_.data(), rstd_.data(), x_.data() + first * C,
                    weights_.unit(tail) + offsets_.final_norm, n, C,
                    static_cast<float>(config_.norm_eps));
  be.MatmulRows(logits_.data(), ln_.data(), head, n, C, V);
  be.CopyToHost(logits, logits_.data(), static_cast<size_t>(n * V) * sizeof(float));
}

void DeepSeekV3Inference::Prefill(int64_t slot, const int32_t* tokens, int64_t count,
                                  float* logits) {
  const size_t s = BeginPrefill(slot, count);
  kernels::check_targets(tokens, count, config_.vocab_size);
  ComputeBackend& be = *backend_;
  const int64_t H = config_.n_heads, Dq = config_.qk_head_dim(), Dv = config_.v_head_dim;
  const int64_t Dn = config_.qk_nope_head_dim, Dr = config_.qk_rope_head_dim;
  tokens_.CopyFrom(tokens, static_cast<size_t>(count));
  Layers(count, false, [&](int64_t l) {
    be.RopeForwardStrided(q_.data(), rope_cos_.data(), rope_sin_.data(), 1, count, H, Dr, Dq, Dn);
    be.RopeForward(kpe_.data(), rope_cos_.data(), rope_sin_.data(), 1, count, 1, Dr);
    float* keys = Keys(slot, l);
    float* values = Values(slot, l);
    StoreKeysValues(0, count, keys, values);
    be.AttentionForward(att_.data(), lse_.data(), q_.data(), keys, values, 1, count, H, H,
                        HeadDims(Dq, Dv), nullptr);
  });
  SetLength(s, count);
  Head(count - 1, 1, logits);
}

void DeepSeekV3Inference::Decode(const int64_t* slots, const int32_t* tokens, int64_t n,
                                 float* logits) {
  const DecodePlan plan = BeginDecode(slots, n);
  const std::vector<int64_t>& positions = plan.positions;
  const std::vector<int64_t>& lengths = plan.lengths;
  kernels::check_targets(tokens, n, config_.vocab_size);
  ComputeBackend& be = *backend_;
  const int64_t H = config_.n_heads, Dq = config_.qk_head_dim(), Dv = config_.v_head_dim;
  const int64_t Dn = config_.qk_nope_head_dim, Dr = config_.qk_rope_head_dim;
  tokens_.CopyFrom(tokens, static_cast<size_t>(n));
  std::vector<const float*> keys(static_cast<size_t>(n)), values(static_cast<size_t>(n));
  Layers(n, true, [&](int64_t l) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = positions[i];
      const float* cos = rope_cos_.data() + p * Dr / 2;
      const float* sin = rope_sin_.data() + p * Dr / 2;
      be.RopeForwardStrided(q_.data() + i * H * Dq, cos, sin, 1, 1, H, Dr, Dq, Dn);
      be.RopeForward(kpe_.data() + i * Dr, cos, sin, 1, 1, 1, Dr);
      float* k = Keys(slots[i], l);
      float* v = Values(slots[i], l);
      StoreKeysValues(i, 1, k + p * H * Dq, v + p * H * Dv);
      keys[i] = k;
      values[i] = v;
    }
    be.DecodeAttention(att_.data(), q_.data(), keys.data(), values.data(), lengths.data(), n, H, H,
                       HeadDims(Dq, Dv));
  });
  EndDecode(slots, plan);
  Head(0, n, logits);
}

}  // namespace

std::unique_ptr<InferenceModel> StartDeepSeekV3Inference(const DeepSeekV3Config& config,
                                                         ParameterAccess& access, int64_t slots,
                                                         int64_t max_len,
                                                         std::shared_ptr<ComputeBackend> backend,
                                                         WeightType weight_type) {
  return std::make_unique<DeepSeekV3Inference>(config, access, slots, max_len, std::move(backend),
                                               weight_type);
}

double PlannedDeepSeekV3KvCacheBytes(const DeepSeekV3Config& config, double slots, double max_len) {
  return 4.0 * slots * static_cast<double>(config.n_layers) * max_len *
         static_cast<double>(config.n_heads) *
         static_cast<double>(config.qk_head_dim() + config.v_head_dim);
}

}  // namespace crucible
