// Flavors, config validation, the parameter table and the planned sizes.
#include <algorithm>

#include "common/error.h"
#include "common/strings.h"
#include "model/llama.h"

namespace crucible {
namespace {

struct Flavor {
  const char* name;
  int64_t vocab_size, dim, n_layers, n_heads, n_kv_heads, ffn_hidden_dim;
  bool tie_embeddings;
};

// Parameter counts: debug 0.89M, tiny 5.0M, small 25.8M, base 124.7M, 1b 1.10B (`crucible model
// info`; 1b is Llama-3.2-1B's shape with a 32000 vocabulary, untied: the GPU benchmark's).
constexpr Flavor kFlavors[] = {
    {"debug", 2048, 128, 2, 4, 2, 352, false},   {"tiny", 8192, 256, 4, 8, 4, 688, true},
    {"small", 8192, 512, 6, 8, 4, 1376, false},  {"base", 32000, 768, 12, 12, 4, 2048, false},
    {"1b", 32000, 2048, 16, 32, 8, 8192, false},
};

}  // namespace

std::vector<std::string> LlamaFlavors() {
  std::vector<std::string> names;
  for (const auto& f : kFlavors) names.push_back(f.name);
  return names;
}

LlamaConfig BuildLlamaConfig(Config& config) {
  const std::string& name = config.String("model.flavor");
  const Flavor* flavor = nullptr;
  for (const auto& f : kFlavors)
    if (name == f.name) flavor = &f;
  if (!flavor) {
    std::string all;
    for (const auto& f : kFlavors) all += std::string(all.empty() ? "" : ", ") + f.name;
    throw UsageError("model.flavor: unknown flavor '" + name + "' (choose one of " + all + ")");
  }
  LlamaConfig m;
  m.flavor = name;
  auto pick = [&](const char* key, int64_t preset) {
    int64_t value = config.Int(key);
    if (value < 0) throw UsageError(std::string(key) + ": must not be negative");
    int64_t resolved = value > 0 ? value : preset;
    config.Set(key, resolved);
    return resolved;
  };
  m.vocab_size = pick("model.vocab_size", flavor->vocab_size);
  m.dim = pick("model.dim", flavor->dim);
  m.n_layers = pick("model.n_layers", flavor->n_layers);
  m.n_heads = pick("model.n_heads", flavor->n_heads);
  m.n_kv_heads = pick("model.n_kv_heads", flavor->n_kv_heads);
  m.ffn_hidden_dim = pick("model.ffn_hidden_dim", flavor->ffn_hidden_dim);
  const std::string& tie = config.String("model.tie_embeddings");
  if (tie == "flavor") {
    m.tie_embeddings = flavor->tie_embeddings;
  } else if (tie == "true" || tie == "false") {
    m.tie_embeddings = tie == "true";
  } else {
    throw UsageError("model.tie_embeddings: expected true, false or flavor, got '" + tie + "'");
  }
  config.Set("model.tie_embeddings", std::string(m.tie_embeddings ? "true" : "false"));
  m.rope_theta = config.Float("model.rope_theta");
  m.norm_eps = config.Float("model.norm_eps");
  m.init_std = config.Float("model.init_std");
  if (m.dim % m.n_heads != 0)
    throw UsageError(StrFormat("model.dim (%lld) must be divisible by model.n_heads (%lld)",
                               (long long)m.dim, (long long)m.n_heads));
  if (m.n_heads % m.n_kv_heads != 0)
    throw UsageError(StrFormat("model.n_heads (%lld) must be divisible by model.n_kv_heads (%lld)",
                               (long long)m.n_heads, (long long)m.n_kv_heads));
  if (m.head_dim() % 2 != 0)
    throw UsageError("model: the head dimension dim/n_heads must be even for rotary embeddings");
  if (m.vocab_size > (int64_t{1} << 31) - 1) throw UsageError("model.vocab_size: too large");
  if (!(m.rope_theta > 0) || !(m.norm_eps > 0) || !(m.init_std > 0))
    throw UsageError("model: rope_theta, norm_eps and init_std must be positive");
  return m;
}

LlamaSizes PlannedLlamaSizes(const LlamaConfig& c, const ModelParallelism& p) {
  // A rank's share of each cut dimension (heads, KV heads, the FFN width, the vocabulary).
  const double share = 1.0 / static_cast<double>(p.tp_degree);
  const double V = static_cast<double>(c.vocab_size) * share, C = static_cast<double>(c.dim);
  const double H = static_cast<double>(c.n_heads) * share;
  const double KV = static_cast<double>(c.n_kv_heads) * share;
  const double D = static_cast<double>(c.head_dim());
  const double F = static_cast<double>(c.ffn_hidden_dim) * share;
  LlamaSizes s;
  s.embedding = V * C;
  s.linear = H * D * C + 2 * KV * D * C + 2 * F * C;  // q k v, gate up
  s.output = C * H * D + F * C;                       // o, down
  s.layer = 2 * C + s.linear + s.output;              // with the two norms
  s.tail = C + (c.tie_embeddings ? 0 : V * C);
  s.parameters = s.embedding + static_cast<double>(c.n_layers) * s.layer + s.tail;
  s.largest_other_unit = std::max(c.n_layers > 0 ? s.layer : 0.0, s.tail);
  s.largest_unit = std::max(s.embedding, s.largest_other_unit);
  return s;
}

std::string CheckLlamaParallelism(const LlamaConfig& c, const ModelParallelism& p) {
  if (std::string why = p.Check(); !why.empty()) return why;
  if (p.ep_degree > 1)
    return StrFormat(
        "parallelism.expert_parallel_degree = %d: model.name = \"llama\" has no experts to split "
        "(set it to 1, or train a mixture of experts: model.name = \"deepseek_v3\")",
        p.ep_degree);
  const int64_t chunks = p.tp_chunks;
  if (chunks == 1) return "";
  // Every split dimension is cut into tp_chunks chunks (model/parallelism.h).
  const std::pair<const char*, int64_t> splits[] = {{"model.n_heads", c.n_heads},
                                                    {"model.n_kv_heads", c.n_kv_heads},
                                                    {"model.ffn_hidden_dim", c.ffn_hidden_dim},
                                                    {"model.vocab_size", c.vocab_size}};
  for (const auto& [key, value] : splits)
    if (value % chunks != 0)
      return StrFormat(
          "%s = %lld is not divisible by the %lld tensor-parallel chunks (query heads, KV heads, "
          "the FFN width and the vocabulary are each cut into that many; a GQA model with fewer "
          "KV heads than chunks is not supported yet)",
          key, (long long)value, (long long)chunks);
  if (c.vocab_size > (int64_t{1} << 24))
    return "model.vocab_size above 2^24 is not supported with tensor parallelism yet";
  return "";
}

ParameterTable LlamaParameterTable(const LlamaConfig& c, const ModelParallelism& parallelism) {
  if (std::string why = CheckLlamaParallelism(c, parallelism); !why.empty()) throw UsageError(why);
  ParameterTable table;
  const int64_t C = c.dim, D = c.head_dim(), F = c.ffn_hidden_dim;
  // Megatron's layers: the embedding and the head cut along the vocabulary, q k v and gate up
  // along their outputs (column-parallel), o and down along their inputs (row-parallel); the
  // norms whole on every rank.
  const TensorSplit rows{0, parallelism.tp_degree, parallelism.tp_rank, parallelism.tp_chunks};
  const TensorSplit columns{1, parallelism.tp_degree, parallelism.tp_rank, parallelism.tp_chunks};
  // The input embedding is a lookup; it counts in FLOPs only as the tied output head.
  table.Add("model.embed_tokens.weight", {c.vocab_size, C}, ParamKind::kEmbedding, -1,
            c.tie_embeddings, rows);
  table.EndUnit();
  for (int l = 0; l < c.n_layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    table.Add(p + "input_layernorm.weight", {C}, ParamKind::kNorm, l);
    table.Add(p + "self_attn.q_proj.weight", {c.n_heads * D, C}, ParamKind::kLinear, l, true, rows);
    table.Add(p + "self_attn.k_proj.weight", {c.n_kv_heads * D, C}, ParamKind::kLinear, l, true,
              rows);
    table.Add(p + "self_attn.v_proj.weight", {c.n_kv_heads * D, C}, ParamKind::kLinear, l, true,
              rows);
    table.Add(p + "self_attn.o_proj.weight", {C, c.n_heads * D}, ParamKind::kOutputProjection, l,
              true, columns);
    table.Add(p + "post_attention_layernorm.weight", {C}, ParamKind::kNorm, l);
    table.Add(p + "mlp.gate_proj.weight", {F, C}, ParamKind::kLinear, l, true, rows);
    table.Add(p + "mlp.up_proj.weight", {F, C}, ParamKind::kLinear, l, true, rows);
    table.Add(p + "mlp.down_proj.weight", {C, F}, ParamKind::kOutputProjection, l, true, columns);
    table.EndUnit();
  }
  table.Add("model.norm.weight", {C}, ParamKind::kNorm, -1);
  if (!c.tie_embeddings)
    table.Add("lm_head.weight", {c.vocab_size, C}, ParamKind::kHead, -1, true, rows);
  table.EndUnit();
  return table;
}

}  // namespace crucible
