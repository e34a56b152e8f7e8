// The Llama's inference path (model/model.h InferenceModel): prefill and decode with a KV cache,
// on the weights and kernels of LlamaModel's Forward (the same layer, written for rows that start
// at a position other than 0).
//
// Prefill (one sequence, T rows from position 0): the training forward's products
// (MatmulForward), RoPE from position 0, causal AttentionForward over its own rows; the keys and
// values (after RoPE) copied into the slot's cache; the head on the last row only.
// Decode (n sequences, one row each at its own position p): MatmulRows products, RoPE of each row
// by the table row of its position, its key and value written at position p of its slot, and
// DecodeAttention over positions [0, p] of each slot.
// CopySlot: per layer, the first `length` positions of the source slot's keys and of its values
// (each a contiguous (length, KV, D) block) into the same places of the target slot.
#include <algorithm>
#include <string>
#include <vector>

#include "common/error.h"
#include "compute/backend.h"
#include "kernels/cpu/kernels.h"
#include "model/decoder_common.h"
#include "model/inference_slots.h"
#include "model/inference_weights.h"
#include "model/llama.h"

namespace crucible {
namespace {

class LlamaInference final : public InferenceSlots {
 public:
  LlamaInference(const LlamaConfig& config, ParameterAccess& access, int64_t slots, int64_t max_len,
                 std::shared_ptr<ComputeBackend> backend, WeightType weight_type);

  int64_t vocab_size() const override { return config_.vocab_size; }
  size_t kv_cache_bytes() const override { return cache_.size() * sizeof(float); }
  size_t weight_bytes() const override { return weights_.bytes(); }
  void Prefill(int64_t slot, const int32_t* tokens, int64_t count, float* logits) override;
  void Decode(const int64_t* slots, const int32_t* tokens, int64_t n, float* logits) override;

 private:
  using Floats = DeviceArray<float>;
  void CopyCache(int64_t from, int64_t to, int64_t length) override {
    const size_t n = static_cast<size_t>(length * config_.n_kv_heads * config_.head_dim());
    for (int64_t l = 0; l < config_.n_layers; ++l)
      for (int kv = 0; kv < 2; ++kv) CopyFloats(Cache(to, l, kv), Cache(from, l, kv), n);
  }
  // Where layer l's keys (kv 0) or values (kv 1) of `slot` start: (max_len, KV, D).
  float* Cache(int64_t slot, int64_t layer, int kv) {
    const int64_t KV = config_.n_kv_heads, D = config_.head_dim();
    return cache_.data() + ((slot * config_.n_layers + layer) * 2 + kv) * max_len_ * KV * D;
  }
  // The layer stack over `n` rows whose residual stream is in x_: `attend(l, q, k, v)` writes
  // each layer's attention output to att_ from its q, k, v (before RoPE: the callback rotates).
  template <typename Attend>
  void Layers(int64_t n, bool row_products, Attend attend);
  void Products(bool rows, int unit, const float* inp, int64_t n, int64_t C,
                std::initializer_list<UnitProduct> outs) {
    UnitProducts(*backend_, weights_, rows, unit, inp, n, C, outs);
  }
  // Final norm and head over `n` rows starting at row `first` of x_, logits (n, V) to the host.
  void Head(int64_t first, int64_t n, float* logits);

  LlamaConfig config_;
  ParameterTable table_;
  LlamaTensorOffsets offsets_;
  InferenceWeights weights_;
  Floats cache_;  // slots x layers x {k, v} x max_len x KV x D
  // Scratch for R = max(max_len, slots) rows.
  Floats x_, x_mid_, ln_, rstd_, q_, k_, v_, att_, lse_, gate_, up_, hidden_, logits_;
  Floats rope_cos_, rope_sin_;  // (max_len, D/2)
  DeviceArray<int32_t> tokens_;
};

LlamaInference::LlamaInference(const LlamaConfig& config, ParameterAccess& access, int64_t slots,
                               int64_t max_len, std::shared_ptr<ComputeBackend> backend,
                               WeightType weight_type)
    : InferenceSlots(slots, max_len, std::move(backend)),
      config_(config),
      table_(LlamaParameterTable(config)),
      offsets_(FindLlamaTensors(table_, config)),
      weights_(table_, access, *backend_, weight_type) {
  ComputeBackend& be = *backend_;
  const int64_t C = config.dim, H = config.n_heads, KV = config.n_kv_heads, D = config.head_dim();
  const int64_t F = config.ffn_hidden_dim, V = config.vocab_size, L = config.n_layers;
  const int64_t R = std::max(max_len, slots);
  cache_ = Floats(be, static_cast<size_t>(slots * L * 2 * max_len * KV * D));
  x_ = Scratch<float>(R * C);
  x_mid_ = Scratch<float>(R * C);
  ln_ = Scratch<float>(R * C);
  rstd_ = Scratch<float>(R);
  q_ = Scratch<float>(R * H * D);
  k_ = Scratch<float>(R * KV * D);
  v_ = Scratch<float>(R * KV * D);
  att_ = Scratch<float>(R * H * D);
  lse_ = Scratch<float>(H * R);
  gate_ = Scratch<float>(R * F);
  up_ = Scratch<float>(R * F);
  hidden_ = Scratch<float>(R * F);
  logits_ = Scratch<float>(slots * V);
  tokens_ = Scratch<int32_t>(R);
  RopeTables(D, config.rope_theta, &rope_cos_, &rope_sin_);
}

template <typename Attend>
void LlamaInference::Layers(int64_t n, bool rows, Attend attend) {
  ComputeBackend& be = *backend_;
  const LlamaConfig& c = config_;
  const int64_t C = c.dim, H = c.n_heads, KV = c.n_kv_heads, D = c.head_dim();
  const int64_t F = c.ffn_hidden_dim;
  const float eps = static_cast<float>(c.norm_eps);
  be.EmbeddingForward(x_.data(), tokens_.data(), weights_.unit(0) + offsets_.embed, n, C);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const int unit = static_cast<int>(1 + l);
    const float* w = weights_.unit(unit);
    const LlamaLayerOffsets& o = offsets_.layers[l];
    be.RmsnormForward(ln_.data(), rstd_.data(), x_.data(), w + o.ln1, n, C, eps);
    Products(rows, unit, ln_.data(), n, C,
             {{q_.data(), o.q, H * D}, {k_.data(), o.k, KV * D}, {v_.data(), o.v, KV * D}});
    attend(l);
    Products(rows, unit, att_.data(), n, H * D, {{x_mid_.data(), o.o, C}});
    be.Add(x_mid_.data(), x_.data(), n * C);
    be.RmsnormForward(ln_.data(), rstd_.data(), x_mid_.data(), w + o.ln2, n, C, eps);
    Products(rows, unit, ln_.data(), n, C, {{gate_.data(), o.gate, F}, {up_.data(), o.up, F}});
    be.SwigluForward(hidden_.data(), gate_.data(), up_.data(), n, F);
    Products(rows, unit, hidden_.data(), n, F, {{x_.data(), o.down, C}});
    be.Add(x_.data(), x_mid_.data(), n * C);
  }
}

void LlamaInference::Head(int64_t first, int64_t n, float* logits) {
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

void LlamaInference::Prefill(int64_t slot, const int32_t* tokens, int64_t count, float* logits) {
  const size_t s = BeginPrefill(slot, count);
  kernels::check_targets(tokens, count, config_.vocab_size);
  ComputeBackend& be = *backend_;
  const int64_t H = config_.n_heads, KV = config_.n_kv_heads, D = config_.head_dim();
  tokens_.CopyFrom(tokens, static_cast<size_t>(count));
  Layers(count, false, [&](int64_t l) {
    be.RopeForward(q_.data(), rope_cos_.data(), rope_sin_.data(), 1, count, H, D);
    be.RopeForward(k_.data(), rope_cos_.data(), rope_sin_.data(), 1, count, KV, D);
    be.CopyColumns(Cache(slot, l, 0), KV * D, k_.data(), KV * D, count, KV * D, false);
    be.CopyColumns(Cache(slot, l, 1), KV * D, v_.data(), KV * D, count, KV * D, false);
    be.AttentionForward(att_.data(), lse_.data(), q_.data(), k_.data(), v_.data(), 1, count, H, KV,
                        D, nullptr);
  });
  SetLength(s, count);
  Head(count - 1, 1, logits);
}

void LlamaInference::Decode(const int64_t* slots, const int32_t* tokens, int64_t n, float* logits) {
  const DecodePlan plan = BeginDecode(slots, n);
  const std::vector<int64_t>& positions = plan.positions;
  const std::vector<int64_t>& lengths = plan.lengths;
  kernels::check_targets(tokens, n, config_.vocab_size);
  ComputeBackend& be = *backend_;
  const int64_t H = config_.n_heads, KV = config_.n_kv_heads, D = config_.head_dim();
  tokens_.CopyFrom(tokens, static_cast<size_t>(n));
  std::vector<const float*> keys(static_cast<size_t>(n)), values(static_cast<size_t>(n));
  Layers(n, true, [&](int64_t l) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = positions[i];
      const float* cos = rope_cos_.data() + p * D / 2;
      const float* sin = rope_sin_.data() + p * D / 2;
      be.RopeForward(q_.data() + i * H * D, cos, sin, 1, 1, H, D);
      be.RopeForward(k_.data() + i * KV * D, cos, sin, 1, 1, KV, D);
      float* k = Cache(slots[i], l, 0);
      float* v = Cache(slots[i], l, 1);
      be.CopyColumns(k + p * KV * D, KV * D, k_.data() + i * KV * D, KV * D, 1, KV * D, false);
      be.CopyColumns(v + p * KV * D, KV * D, v_.data() + i * KV * D, KV * D, 1, KV * D, false);
      keys[i] = k;
      values[i] = v;
    }
    be.DecodeAttention(att_.data(), q_.data(), keys.data(), values.data(), lengths.data(), n, H, KV,
                       D);
  });
  EndDecode(slots, plan);
  Head(0, n, logits);
}

}  // namespace

std::unique_ptr<InferenceModel> StartLlamaInference(const LlamaConfig& config,
                                                    ParameterAccess& access, int64_t slots,
                                                    int64_t max_len,
                                                    std::shared_ptr<ComputeBackend> backend,
                                                    WeightType weight_type) {
  return std::make_unique<LlamaInference>(config, access, slots, max_len, std::move(backend),
                                          weight_type);
}

double PlannedLlamaKvCacheBytes(const LlamaConfig& config, double slots, double max_len) {
  return 4.0 * slots * static_cast<double>(config.n_layers) * 2 * max_len *
         static_cast<double>(config.n_kv_heads) * static_cast<double>(config.head_dim());
}

}  // namespace crucible
