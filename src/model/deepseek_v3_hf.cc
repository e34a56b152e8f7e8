// The DeepSeek-V3 family's Hugging Face mapping (DeepseekV3ForCausalLM): config.json written from
// a DeepSeekV3Config, read back into one and compared with one; the RoPE rows of a folder that
// keeps them interleaved (rope_interleave, transformers' default) turned into this layout.
#include <cmath>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/strings.h"
#include "model/deepseek_v3.h"
#include "model/hf_config.h"

namespace crucible {
namespace {

// Refuses (DataError naming the file and key) what this family cannot reproduce exactly.
void RequireReproducible(const nlohmann::json& c, const std::string& path) {
  RequireHfSiluWithoutBiases(c, path, "DeepSeek-V3", {"attention_bias"});
  // Older DeepSeek configs spell the router's choices; only V3's is implemented.
  const std::pair<const char*, const char*> expected[] = {{"scoring_func", "sigmoid"},
                                                          {"topk_method", "noaux_tc"}};
  for (const auto& [key, value] : expected)
    if (c.contains(key) && c[key] != value)
      throw DataError(path + ": " + key + " " + HfQuoted(c[key]) +
                      " is not supported: crucible's router is DeepSeek-V3's (" + key + " '" +
                      value + "')");
  if (c.contains("moe_layer_freq") && c["moe_layer_freq"] != 1)
    throw DataError(path + ": moe_layer_freq " + HfQuoted(c["moe_layer_freq"]) +
                    " is not supported: every layer after first_k_dense_replace is a MoE layer");
  if (c.contains("num_key_value_heads") && c.contains("num_attention_heads") &&
      c["num_key_value_heads"] != c["num_attention_heads"])
    throw DataError(path +
                    ": num_key_value_heads differs from num_attention_heads: MLA has one "
                    "latent for every head (transformers sets them equal)");
  ReadHfRopeTheta(c, path);
}

int64_t Integer(const nlohmann::json& c, const char* key, int64_t fallback,
                const std::string& path) {
  if (c.contains(key) && c[key].is_number_integer()) return c[key].get<int64_t>();
  if (c.contains(key) && !c[key].is_null())
    throw DataError(path + ": '" + key + "' is not an integer");
  if (fallback >= 0) return fallback;
  throw DataError(path + ": no integer '" + key + "'");
}

DeepSeekV3Config FromConfigJson(const nlohmann::json& c, const std::string& path) {
  RequireReproducible(c, path);
  DeepSeekV3Config m;
  m.flavor = "hf";
  m.vocab_size = Integer(c, "vocab_size", -1, path);
  m.dim = Integer(c, "hidden_size", -1, path);
  m.ffn_hidden_dim = Integer(c, "intermediate_size", -1, path);
  m.n_layers = Integer(c, "num_hidden_layers", -1, path);
  m.n_heads = Integer(c, "num_attention_heads", -1, path);
  m.q_lora_rank = Integer(c, "q_lora_rank", 0, path);  // null: no query compression
  m.kv_lora_rank = Integer(c, "kv_lora_rank", -1, path);
  m.qk_nope_head_dim = Integer(c, "qk_nope_head_dim", -1, path);
  m.qk_rope_head_dim = Integer(c, "qk_rope_head_dim", -1, path);
  m.v_head_dim = Integer(c, "v_head_dim", -1, path);
  m.n_routed_experts = Integer(c, "n_routed_experts", -1, path);
  m.n_shared_experts = Integer(c, "n_shared_experts", 0, path);
  m.num_experts_per_tok = Integer(c, "num_experts_per_tok", -1, path);
  m.moe_intermediate_size = Integer(c, "moe_intermediate_size", -1, path);
  m.n_group = Integer(c, "n_group", 1, path);
  m.topk_group = Integer(c, "topk_group", 1, path);
  m.first_k_dense_replace = Integer(c, "first_k_dense_replace", 0, path);
  m.routed_scaling_factor =
      HfNumber(c, "routed_scaling_factor", "routed_scaling_factor", path).value_or(1.0);
  m.norm_topk_prob = HfBoolean(c, "norm_topk_prob", false, path);
  m.tie_embeddings = HfBoolean(c, "tie_word_embeddings", false, path);
  m.norm_eps = HfNumber(c, "rms_norm_eps", "rms_norm_eps", path).value_or(1e-6);
  m.rope_theta = ReadHfRopeTheta(c, path);
  if (c.contains("initializer_range") && c["initializer_range"].is_number())
    m.init_std = c["initializer_range"].get<double>();
  return m;
}

}  // namespace

std::string DeepSeekV3Spec::architecture() const {
  return "DeepseekV3ForCausalLM";
}

nlohmann::ordered_json DeepSeekV3Spec::ConfigJson(int64_t max_position_embeddings,
                                                  const nlohmann::json& bos_token_id,
                                                  const nlohmann::json& eos_token_id) const {
  const DeepSeekV3Config& m = config_;
  nlohmann::ordered_json config = {
      {"architectures", {architecture()}},
      {"model_type", "deepseek_v3"},
      {"vocab_size", m.vocab_size},
      {"hidden_size", m.dim},
      {"intermediate_size", m.ffn_hidden_dim},
      {"moe_intermediate_size", m.moe_intermediate_size},
      {"num_hidden_layers", m.n_layers},
      {"num_attention_heads", m.n_heads},
      {"num_key_value_heads", m.n_heads},
      {"n_shared_experts", m.n_shared_experts},
      {"n_routed_experts", m.n_routed_experts},
      {"routed_scaling_factor", m.routed_scaling_factor},
      {"kv_lora_rank", m.kv_lora_rank},
      {"q_lora_rank", m.q_lora_rank > 0 ? nlohmann::ordered_json(m.q_lora_rank) : nullptr},
      {"qk_rope_head_dim", m.qk_rope_head_dim},
      {"v_head_dim", m.v_head_dim},
      {"qk_nope_head_dim", m.qk_nope_head_dim},
      {"n_group", m.n_group},
      {"topk_group", m.topk_group},
      {"num_experts_per_tok", m.num_experts_per_tok},
      {"first_k_dense_replace", m.first_k_dense_replace},
      {"norm_topk_prob", m.norm_topk_prob},
      // This layout's RoPE pairs are (i, i + D/2) as stored: no interleave to undo.
      {"rope_interleave", false}};
  AppendHfCommonKeys({max_position_embeddings, m.norm_eps, m.rope_theta, m.init_std,
                      m.tie_embeddings, bos_token_id, eos_token_id},
                     &config);
  return config;
}

std::vector<std::string> DeepSeekV3Spec::Differences(const nlohmann::json& c,
                                                     const std::string& path) const {
  const DeepSeekV3Config theirs = FromConfigJson(c, path);
  const DeepSeekV3Config& m = config_;
  std::vector<std::string> differences;
  auto integer = [&](const char* key, int64_t a, const char* our_key, int64_t b) {
    if (a != b)
      differences.push_back(
          StrFormat("%s=%lld vs %s=%lld", key, (long long)a, our_key, (long long)b));
  };
  integer("vocab_size", theirs.vocab_size, "model.vocab_size", m.vocab_size);
  integer("hidden_size", theirs.dim, "model.dim", m.dim);
  integer("intermediate_size", theirs.ffn_hidden_dim, "model.ffn_hidden_dim", m.ffn_hidden_dim);
  integer("num_hidden_layers", theirs.n_layers, "model.n_layers", m.n_layers);
  integer("num_attention_heads", theirs.n_heads, "model.n_heads", m.n_heads);
  integer("q_lora_rank", theirs.q_lora_rank, "model.q_lora_rank", m.q_lora_rank);
  integer("kv_lora_rank", theirs.kv_lora_rank, "model.kv_lora_rank", m.kv_lora_rank);
  integer("qk_nope_head_dim", theirs.qk_nope_head_dim, "model.qk_nope_head_dim",
          m.qk_nope_head_dim);
  integer("qk_rope_head_dim", theirs.qk_rope_head_dim, "model.qk_rope_head_dim",
          m.qk_rope_head_dim);
  integer("v_head_dim", theirs.v_head_dim, "model.v_head_dim", m.v_head_dim);
  integer("n_routed_experts", theirs.n_routed_experts, "model.n_routed_experts",
          m.n_routed_experts);
  integer("n_shared_experts", theirs.n_shared_experts, "model.n_shared_experts",
          m.n_shared_experts);
  integer("num_experts_per_tok", theirs.num_experts_per_tok, "model.num_experts_per_tok",
          m.num_experts_per_tok);
  integer("moe_intermediate_size", theirs.moe_intermediate_size, "model.moe_intermediate_size",
          m.moe_intermediate_size);
  integer("n_group", theirs.n_group, "model.n_group", m.n_group);
  integer("topk_group", theirs.topk_group, "model.topk_group", m.topk_group);
  integer("first_k_dense_replace", theirs.first_k_dense_replace, "model.first_k_dense_replace",
          m.first_k_dense_replace);
  auto real = [&](const char* key, double a, const char* our_key, double b) {
    if (std::fabs(a - b) > 1e-12 * std::max(1.0, std::fabs(b)))
      differences.push_back(StrFormat("%s=%g vs %s=%g", key, a, our_key, b));
  };
  real("routed_scaling_factor", theirs.routed_scaling_factor, "model.routed_scaling_factor",
       m.routed_scaling_factor);
  real("rms_norm_eps", theirs.norm_eps, "model.norm_eps", m.norm_eps);
  real("rope_theta", theirs.rope_theta, "model.rope_theta", m.rope_theta);
  auto boolean = [&](const char* key, bool a, const char* our_key, bool b) {
    if (a != b)
      differences.push_back(
          StrFormat("%s=%s vs %s=%s", key, a ? "true" : "false", our_key, b ? "true" : "false"));
  };
  boolean("norm_topk_prob", theirs.norm_topk_prob, "model.norm_topk_prob", m.norm_topk_prob);
  boolean("tie_word_embeddings", theirs.tie_embeddings, "model.tie_embeddings", m.tie_embeddings);
  return differences;
}

void DeepSeekV3Spec::FromHf(const nlohmann::json& c, const ParamInfo& tensor, float* values) const {
  // transformers' default (rope_interleave absent) is true: its RoPE rows hold the pairs
  // (2i, 2i + 1), which it de-interleaves to (i, i + D/2) before rotating; this layout stores
  // them de-interleaved.
  if (!HfBoolean(c, "rope_interleave", true, "config.json")) return;
  const DeepSeekV3Config& m = config_;
  const int64_t Dr = m.qk_rope_head_dim, Dq = m.qk_head_dim(), half = Dr / 2;
  const int64_t columns = tensor.shape.size() == 2 ? tensor.shape[1] : 0;
  auto deinterleave = [&](float* rows) {  // Dr rows of `columns` floats
    std::vector<float> copy(rows, rows + Dr * columns);
    for (int64_t i = 0; i < half; ++i) {
      std::copy_n(copy.data() + (2 * i) * columns, columns, rows + i * columns);
      std::copy_n(copy.data() + (2 * i + 1) * columns, columns, rows + (half + i) * columns);
    }
  };
  const std::string& name = tensor.name;
  auto ends = [&](const char* suffix) {
    const std::string s = suffix;
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  if (ends("self_attn.q_b_proj.weight") || ends("self_attn.q_proj.weight")) {
    for (int64_t h = 0; h < m.n_heads; ++h)
      deinterleave(values + (h * Dq + m.qk_nope_head_dim) * columns);
  } else if (ends("self_attn.kv_a_proj_with_mqa.weight")) {
    deinterleave(values + m.kv_lora_rank * columns);
  }
}

std::shared_ptr<const ModelSpec> ReadDeepSeekV3HfConfig(const nlohmann::json& c,
                                                        const std::string& path) {
  const DeepSeekV3Config m = FromConfigJson(c, path);
  if (std::string why = CheckDeepSeekV3Config(m); !why.empty()) throw DataError(path + ": " + why);
  return std::make_shared<DeepSeekV3Spec>(m);
}

}  // namespace crucible
