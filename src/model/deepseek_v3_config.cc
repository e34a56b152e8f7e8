// The DeepSeek-V3 family's flavors, config validation, parameter table and planned sizes.
#include <algorithm>

#include "common/error.h"
#include "common/strings.h"
#include "model/deepseek_v3.h"

namespace crucible {
namespace {

struct Flavor {
  const char* name;
  int64_t vocab_size, dim, n_layers, n_heads, ffn_hidden_dim;
  int64_t q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
  int64_t n_routed_experts, n_shared_experts, num_experts_per_tok, moe_intermediate_size;
  int64_t n_group, topk_group;
  double routed_scaling_factor;
  int64_t first_k_dense_replace;
};

// Total and active parameters (`crucible model info`): debug 1.03M / 0.88M, small 61.3M / 23.5M,
// base 122.1M / 78.8M. DeepSeek-V3's proportions at small scale: one dense layer first, one shared
// expert, top-2 of 8 or 16 routed experts in groups, the routed scaling factor of V3.
constexpr Flavor kFlavors[] = {
    {"debug", 2048, 128, 2, 4, 352, 96, 64, 32, 16, 32, 8, 1, 2, 64, 2, 1, 2.5, 1},
    {"small", 8192, 512, 6, 8, 1376, 256, 128, 64, 32, 64, 16, 1, 2, 352, 4, 2, 2.5, 1},
    {"base", 32000, 768, 8, 12, 2048, 384, 256, 64, 32, 64, 16, 1, 2, 192, 4, 2, 2.5, 1},
};

const char* const kKeys[] = {
    "model.q_lora_rank",
    "model.kv_lora_rank",
    "model.qk_nope_head_dim",
    "model.qk_rope_head_dim",
    "model.v_head_dim",
    "model.n_routed_experts",
    "model.n_shared_experts",
    "model.num_experts_per_tok",
    "model.moe_intermediate_size",
    "model.n_group",
    "model.topk_group",
    "model.routed_scaling_factor",
    "model.norm_topk_prob",
    "model.first_k_dense_replace",
    "model.bias_update_speed",
    "model.aux_loss_alpha",
};

}  // namespace

std::vector<const char*> DeepSeekV3Keys() {
  return {std::begin(kKeys), std::end(kKeys)};
}

std::vector<std::string> DeepSeekV3Flavors() {
  std::vector<std::string> names;
  for (const auto& f : kFlavors) names.push_back(f.name);
  return names;
}

std::string CheckDeepSeekV3Config(const DeepSeekV3Config& m) {
  auto fmt = [](const char* format, auto... values) {
    return StrFormat(format, static_cast<long long>(values)...);
  };
  const std::pair<const char*, int64_t> positive[] = {
      {"model.vocab_size", m.vocab_size},
      {"model.dim", m.dim},
      {"model.n_heads", m.n_heads},
      {"model.kv_lora_rank", m.kv_lora_rank},
      {"model.qk_nope_head_dim", m.qk_nope_head_dim},
      {"model.qk_rope_head_dim", m.qk_rope_head_dim},
      {"model.v_head_dim", m.v_head_dim},
      {"model.n_routed_experts", m.n_routed_experts},
      {"model.num_experts_per_tok", m.num_experts_per_tok},
      {"model.moe_intermediate_size", m.moe_intermediate_size},
      {"model.n_group", m.n_group},
      {"model.topk_group", m.topk_group},
      {"model.ffn_hidden_dim", m.ffn_hidden_dim}};
  for (const auto& [key, value] : positive)
    if (value <= 0) return StrFormat("%s must be positive, got %lld", key, (long long)value);
  if (m.q_lora_rank > m.dim)
    return fmt(
        "model.q_lora_rank (%lld) is larger than model.dim (%lld): a latent rank above the "
        "model dimension compresses nothing; lower it, or set 0 for no query compression",
        m.q_lora_rank, m.dim);
  if (m.kv_lora_rank > m.dim)
    return fmt(
        "model.kv_lora_rank (%lld) is larger than model.dim (%lld): a latent rank above the "
        "model dimension compresses nothing; lower it",
        m.kv_lora_rank, m.dim);
  if (m.qk_rope_head_dim % 2 != 0)
    return fmt("model.qk_rope_head_dim (%lld) must be even for rotary embeddings",
               m.qk_rope_head_dim);
  if (m.n_routed_experts % m.n_group != 0)
    return fmt("model.n_routed_experts (%lld) must be divisible by model.n_group (%lld)",
               m.n_routed_experts, m.n_group);
  if (m.topk_group > m.n_group)
    return fmt("model.topk_group (%lld) is larger than model.n_group (%lld)", m.topk_group,
               m.n_group);
  if (m.num_experts_per_tok > m.n_routed_experts)
    return fmt(
        "model.num_experts_per_tok (%lld) is larger than model.n_routed_experts (%lld): a token "
        "cannot go to more experts than there are",
        m.num_experts_per_tok, m.n_routed_experts);
  const int64_t eligible = m.topk_group * (m.n_routed_experts / m.n_group);
  if (m.num_experts_per_tok > eligible)
    return fmt(
        "model.num_experts_per_tok (%lld) is larger than the %lld experts of the model.topk_group "
        "= %lld groups a token may use (n_routed_experts / n_group each); raise topk_group or "
        "lower num_experts_per_tok",
        m.num_experts_per_tok, eligible, m.topk_group);
  if (m.first_k_dense_replace < 0 || m.first_k_dense_replace > m.n_layers)
    return fmt("model.first_k_dense_replace (%lld) must be between 0 and model.n_layers (%lld)",
               m.first_k_dense_replace, m.n_layers);
  if (m.n_shared_experts < 0) return "model.n_shared_experts must not be negative";
  if (m.vocab_size > (int64_t{1} << 31) - 1) return "model.vocab_size: too large";
  if (m.n_routed_experts > (int64_t{1} << 20))
    return "model.n_routed_experts: more than 2^20 experts is not supported";
  if (!(m.routed_scaling_factor > 0)) return "model.routed_scaling_factor must be positive";
  if (!(m.rope_theta > 0) || !(m.norm_eps > 0) || !(m.init_std > 0))
    return "model: rope_theta, norm_eps and init_std must be positive";
  return "";
}

DeepSeekV3Config BuildDeepSeekV3Config(Config& config) {
  const std::string& name = config.String("model.flavor");
  const Flavor* flavor = nullptr;
  for (const auto& f : kFlavors)
    if (name == f.name) flavor = &f;
  if (!flavor) {
    std::string all;
    for (const auto& f : kFlavors) all += std::string(all.empty() ? "" : ", ") + f.name;
    throw UsageError("model.flavor: unknown deepseek_v3 flavor '" + name + "' (choose one of " +
                     all + ")");
  }
  DeepSeekV3Config m;
  m.flavor = name;
  // 0 (or -1 where 0 is a value) takes the flavor's.
  auto pick = [&](const char* key, int64_t preset, int64_t unset = 0) {
    const int64_t value = config.Int(key);
    const int64_t resolved = value == unset ? preset : value;
    if (resolved < 0) throw UsageError(std::string(key) + ": must not be negative");
    config.Set(key, resolved);
    return resolved;
  };
  m.vocab_size = pick("model.vocab_size", flavor->vocab_size);
  m.dim = pick("model.dim", flavor->dim);
  m.n_layers = pick("model.n_layers", flavor->n_layers);
  m.n_heads = pick("model.n_heads", flavor->n_heads);
  m.ffn_hidden_dim = pick("model.ffn_hidden_dim", flavor->ffn_hidden_dim);
  m.q_lora_rank = pick("model.q_lora_rank", flavor->q_lora_rank, -1);
  m.kv_lora_rank = pick("model.kv_lora_rank", flavor->kv_lora_rank);
  m.qk_nope_head_dim = pick("model.qk_nope_head_dim", flavor->qk_nope_head_dim);
  m.qk_rope_head_dim = pick("model.qk_rope_head_dim", flavor->qk_rope_head_dim);
  m.v_head_dim = pick("model.v_head_dim", flavor->v_head_dim);
  m.n_routed_experts = pick("model.n_routed_experts", flavor->n_routed_experts);
  m.n_shared_experts = pick("model.n_shared_experts", flavor->n_shared_experts, -1);
  m.num_experts_per_tok = pick("model.num_experts_per_tok", flavor->num_experts_per_tok);
  m.moe_intermediate_size = pick("model.moe_intermediate_size", flavor->moe_intermediate_size);
  m.n_group = pick("model.n_group", flavor->n_group);
  m.topk_group = pick("model.topk_group", flavor->topk_group);
  m.first_k_dense_replace = pick("model.first_k_dense_replace", flavor->first_k_dense_replace, -1);
  const double factor = config.Float("model.routed_scaling_factor");
  m.routed_scaling_factor = factor > 0 ? factor : flavor->routed_scaling_factor;
  config.Set("model.routed_scaling_factor", m.routed_scaling_factor);
  auto flag = [&](const char* key, bool preset) {
    const std::string& value = config.String(key);
    bool resolved = preset;
    if (value == "true" || value == "false")
      resolved = value == "true";
    else if (value != "flavor")
      throw UsageError(std::string(key) + ": expected true, false or flavor, got '" + value + "'");
    config.Set(key, std::string(resolved ? "true" : "false"));
    return resolved;
  };
  m.norm_topk_prob = flag("model.norm_topk_prob", true);
  m.tie_embeddings = flag("model.tie_embeddings", false);
  m.rope_theta = config.Float("model.rope_theta");
  m.norm_eps = config.Float("model.norm_eps");
  m.init_std = config.Float("model.init_std");
  m.aux_loss_alpha = config.Float("model.aux_loss_alpha");
  if (std::string why = CheckDeepSeekV3Config(m); !why.empty()) throw UsageError(why);
  // Refused before a backend is made, so that a machine without a GPU says this too.
  const std::string& device = config.String("training.device");
  if (device != "cpu")
    throw UsageError("training.device = \"" + device +
                     "\": the MLA and mixture-of-experts kernels of model.name = \"deepseek_v3\" "
                     "have no version for this device yet; set training.device = \"cpu\"");
  if (config.Bool("debug.portable_exact"))
    throw UsageError(
        "debug.portable_exact: the MLA and mixture-of-experts kernels of model.name = "
        "\"deepseek_v3\" have no portable version yet; set debug.portable_exact = false");
  return m;
}

DeepSeekV3Sizes PlannedDeepSeekV3Sizes(const DeepSeekV3Config& c, int ep_degree) {
  const double C = static_cast<double>(c.dim), H = static_cast<double>(c.n_heads);
  const double Rq = static_cast<double>(c.q_lora_rank), Rkv = static_cast<double>(c.kv_lora_rank);
  const double Dn = static_cast<double>(c.qk_nope_head_dim);
  const double Dr = static_cast<double>(c.qk_rope_head_dim);
  const double Dv = static_cast<double>(c.v_head_dim), Dq = Dn + Dr;
  const double E = static_cast<double>(c.n_routed_experts);
  const double Fm = static_cast<double>(c.moe_intermediate_size);
  const double Fs = static_cast<double>(c.n_shared_experts) * Fm;
  DeepSeekV3Sizes s;
  s.embedding = static_cast<double>(c.vocab_size) * C;
  const double query = c.q_lora_rank > 0 ? Rq * C + Rq + H * Dq * Rq : H * Dq * C;
  s.attention = query + (Rkv + Dr) * C + Rkv + H * (Dn + Dv) * Rkv + C * H * Dv;
  s.dense_mlp = 3 * C * static_cast<double>(c.ffn_hidden_dim);
  s.router = E * C + E;  // the router's weight and its balance bias
  s.moe_shared = 3 * C * Fs;
  s.expert = 3 * C * Fm;
  s.dense_layer = 2 * C + s.attention + s.dense_mlp;
  const double held = E / static_cast<double>(ep_degree);  // routed experts this rank holds
  s.moe_layer = 2 * C + s.attention + s.router + s.moe_shared + held * s.expert;
  s.tail = C + (c.tie_embeddings ? 0 : s.embedding);
  const double dense = static_cast<double>(c.n_layers - c.moe_layers());
  const double moe = static_cast<double>(c.moe_layers());
  s.parameters = s.embedding + dense * s.dense_layer + moe * s.moe_layer + s.tail;
  s.active = s.parameters - moe * (held - static_cast<double>(c.num_experts_per_tok)) * s.expert;
  s.largest_other_unit = s.tail;
  if (dense > 0) s.largest_other_unit = std::max(s.largest_other_unit, s.dense_layer);
  if (moe > 0) s.largest_other_unit = std::max(s.largest_other_unit, s.moe_layer);
  s.largest_unit = std::max(s.embedding, s.largest_other_unit);
  return s;
}

ParameterTable DeepSeekV3ParameterTable(const DeepSeekV3Config& c, int ep_degree, int ep_rank) {
  const int64_t held = c.n_routed_experts / ep_degree, first = held * ep_rank;
  ParameterTable table;
  const int64_t C = c.dim, H = c.n_heads, Dq = c.qk_head_dim(), Dr = c.qk_rope_head_dim;
  const int64_t Dn = c.qk_nope_head_dim, Dv = c.v_head_dim, Rkv = c.kv_lora_rank;
  const int64_t Fm = c.moe_intermediate_size, Fs = c.n_shared_experts * Fm;
  // The input embedding is a lookup; it counts in FLOPs only as the tied output head.
  table.Add("model.embed_tokens.weight", {c.vocab_size, C}, ParamKind::kEmbedding, -1,
            c.tie_embeddings);
  table.EndUnit();
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    table.Add(p + "input_layernorm.weight", {C}, ParamKind::kNorm, l);
    if (c.q_lora_rank > 0) {
      table.Add(p + "self_attn.q_a_proj.weight", {c.q_lora_rank, C}, ParamKind::kLinear, l);
      table.Add(p + "self_attn.q_a_layernorm.weight", {c.q_lora_rank}, ParamKind::kNorm, l);
      table.Add(p + "self_attn.q_b_proj.weight", {H * Dq, c.q_lora_rank}, ParamKind::kLinear, l);
    } else {
      table.Add(p + "self_attn.q_proj.weight", {H * Dq, C}, ParamKind::kLinear, l);
    }
    table.Add(p + "self_attn.kv_a_proj_with_mqa.weight", {Rkv + Dr, C}, ParamKind::kLinear, l);
    table.Add(p + "self_attn.kv_a_layernorm.weight", {Rkv}, ParamKind::kNorm, l);
    table.Add(p + "self_attn.kv_b_proj.weight", {H * (Dn + Dv), Rkv}, ParamKind::kLinear, l);
    table.Add(p + "self_attn.o_proj.weight", {C, H * Dv}, ParamKind::kOutputProjection, l);
    table.Add(p + "post_attention_layernorm.weight", {C}, ParamKind::kNorm, l);
    auto mlp = [&](const std::string& prefix, int64_t F, bool in_flops) {
      table.Add(prefix + "gate_proj.weight", {F, C}, ParamKind::kLinear, l, in_flops);
      table.Add(prefix + "up_proj.weight", {F, C}, ParamKind::kLinear, l, in_flops);
      table.Add(prefix + "down_proj.weight", {C, F}, ParamKind::kOutputProjection, l, in_flops);
    };
    if (!c.moe_layer(l)) {
      mlp(p + "mlp.", c.ffn_hidden_dim, true);
    } else {
      // The router is a hidden matrix to the optimizers (Muon orthogonalises it like the others).
      table.Add(p + "mlp.gate.weight", {c.n_routed_experts, C}, ParamKind::kLinear, l);
      // Chooses experts, weighs nothing: no product, no optimizer (optim/balance_bias.h).
      table.Add(p + "mlp.gate.e_score_correction_bias", {c.n_routed_experts},
                ParamKind::kBalanceBias, l, false);
      if (Fs > 0) mlp(p + "mlp.shared_experts.", Fs, true);
      // A token uses num_experts_per_tok experts: they count in FLOPs through
      // TrainFlopsPerToken, not the table.
      for (int64_t e = 0; e < c.n_routed_experts; ++e) {
        if (e < first || e >= first + held) {  // another rank's: gate, up, down
          for (int k = 0; k < 3; ++k) table.Skip();
          continue;
        }
        table.SetExpert(static_cast<int>(e));
        mlp(p + "mlp.experts." + std::to_string(e) + ".", Fm, false);
      }
      table.SetExpert(-1);
    }
    table.EndUnit();
  }
  table.Add("model.norm.weight", {C}, ParamKind::kNorm, -1);
  if (!c.tie_embeddings) table.Add("lm_head.weight", {c.vocab_size, C}, ParamKind::kHead, -1);
  table.EndUnit();
  return table;
}

}  // namespace crucible
