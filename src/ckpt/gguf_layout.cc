// What each llama.cpp architecture holds (ckpt/gguf.h has the tables): its keys and its tensors
// under llama.cpp's names and in its layout, converted from the model's Hugging Face form as
// llama.cpp's convert_hf_to_gguf.py converts a LlamaForCausalLM (LlamaModel) or a
// DeepseekV3ForCausalLM (DeepseekV2Model) folder.
#include "ckpt/gguf_layout.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "common/error.h"
#include "common/strings.h"

namespace crucible {
namespace {

// llama.cpp's LLAMA_MAX_LAYERS and LLAMA_MAX_EXPERTS (src/llama-hparams.h): it asserts on more.
constexpr int64_t kLlamaMaxLayers = 512, kLlamaMaxExperts = 1024;
// llama_expert_gating_func_type: LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID.
constexpr uint32_t kGatingSigmoid = 2;

int64_t ConfigInt(const nlohmann::ordered_json& c, const char* key) {
  if (!c.contains(key) || !c[key].is_number_integer())
    throw Error(kExitFailure,
                std::string("internal: export gguf: config.json has no integer ") + key);
  return c[key].get<int64_t>();
}

double ConfigNumber(const nlohmann::ordered_json& c, const char* key) {
  if (!c.contains(key) || !c[key].is_number())
    throw Error(kExitFailure,
                std::string("internal: export gguf: config.json has no number ") + key);
  return c[key].get<double>();
}

bool ConfigBool(const nlohmann::ordered_json& c, const char* key) {
  if (!c.contains(key) || !c[key].is_boolean())
    throw Error(kExitFailure,
                std::string("internal: export gguf: config.json has no boolean ") + key);
  return c[key].get<bool>();
}

void CheckLayers(int64_t layers) {
  if (layers > kLlamaMaxLayers)
    throw UsageError(
        StrFormat("export gguf: model.n_layers = %lld: llama.cpp loads at most %lld "
                  "layers (LLAMA_MAX_LAYERS)",
                  (long long)layers, (long long)kLlamaMaxLayers));
}

// "model.layers.<N>.<rest>": N and rest; false for a tensor outside the layers.
bool SplitLayerName(const std::string& hf, std::string* layer, std::string* rest) {
  const std::string prefix = "model.layers.";
  if (!StartsWith(hf, prefix)) return false;
  const size_t dot = hf.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size()) return false;
  *layer = hf.substr(prefix.size(), dot - prefix.size());
  *rest = hf.substr(dot + 1);
  return layer->find_first_not_of("0123456789") == std::string::npos;
}

std::string NoName(const std::string& hf) {
  return "internal: export gguf: no llama.cpp name for tensor " + hf;
}

// A tensor of `shape` (Hugging Face's order, the last dimension contiguous).
GgufTensor Tensor(const std::string& name, const std::vector<int64_t>& shape, bool matrix,
                  std::function<void(float*)> fill) {
  GgufTensor t;
  t.name = name;
  t.dims.assign(shape.rbegin(), shape.rend());
  t.matrix = matrix;
  t.fill = std::move(fill);
  return t;
}

// The names shared by both architectures.
const std::map<std::string, std::string>& CommonNames() {
  static const std::map<std::string, std::string> names = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"},
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"}};
  return names;
}

}  // namespace

uint64_t GgufTensor::numel() const {
  uint64_t n = 1;
  for (int64_t d : dims) n *= static_cast<uint64_t>(d);
  return n;
}

void InterleaveRopeRows(float* rows, int64_t count, int64_t columns) {
  const int64_t half = count / 2;
  const std::vector<float> copy(rows, rows + count * columns);
  for (int64_t i = 0; i < half; ++i)
    for (int64_t pair = 0; pair < 2; ++pair)
      std::memcpy(rows + (2 * i + pair) * columns, copy.data() + (pair * half + i) * columns,
                  columns * sizeof(float));
}

std::vector<GgufTensor> LlamaGgufLayout(const HfMapping& hf, const nlohmann::ordered_json& c,
                                        const ParameterTable& table, const float* weights,
                                        GgufMetadata* m) {
  const int64_t heads = ConfigInt(c, "num_attention_heads");
  const int64_t kv_heads = ConfigInt(c, "num_key_value_heads");
  const int64_t head_dim = ConfigInt(c, "head_dim");
  CheckLayers(ConfigInt(c, "num_hidden_layers"));
  m->Uint32("llama.context_length", ConfigInt(c, "max_position_embeddings"));
  m->Uint32("llama.embedding_length", ConfigInt(c, "hidden_size"));
  m->Uint32("llama.block_count", ConfigInt(c, "num_hidden_layers"));
  m->Uint32("llama.feed_forward_length", ConfigInt(c, "intermediate_size"));
  m->Uint32("llama.attention.head_count", heads);
  m->Uint32("llama.attention.head_count_kv", kv_heads);
  m->Float32("llama.rope.freq_base", ConfigNumber(c, "rope_theta"));
  m->Float32("llama.attention.layer_norm_rms_epsilon", ConfigNumber(c, "rms_norm_eps"));
  m->Uint32("llama.rope.dimension_count", head_dim);
  m->Uint32("llama.attention.key_length", head_dim);
  m->Uint32("llama.attention.value_length", head_dim);
  m->Uint32("llama.vocab_size", ConfigInt(c, "vocab_size"));

  static const std::map<std::string, std::string> attention = {
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"}};
  std::vector<GgufTensor> tensors;
  for (const ParamInfo& p : table.params()) {
    const std::string name = hf.TensorName(p);
    std::string layer, rest, gguf;
    const bool in_layer = SplitLayerName(name, &layer, &rest);
    const auto& names = CommonNames();
    if (auto it = names.find(in_layer ? rest : name); it != names.end()) gguf = it->second;
    if (auto it = attention.find(rest); in_layer && it != attention.end()) gguf = it->second;
    const bool layer_name = StartsWith(gguf, "attn_") || StartsWith(gguf, "ffn_");
    if (gguf.empty() || in_layer != layer_name) throw Error(kExitFailure, NoName(name));
    if (in_layer) gguf = "blk." + layer + "." + gguf;
    // RoPE pairs: each head of q_proj and k_proj interleaved.
    const int64_t rope_heads = rest == "self_attn.q_proj.weight"   ? heads
                               : rest == "self_attn.k_proj.weight" ? kv_heads
                                                                   : 0;
    const float* values = weights + p.offset;
    const size_t numel = p.numel;
    const int64_t columns = p.shape.size() == 2 ? p.shape[1] : 1;
    tensors.push_back(Tensor(gguf, p.shape, p.shape.size() == 2, [=](float* out) {
      std::memcpy(out, values, numel * sizeof(float));
      for (int64_t h = 0; h < rope_heads; ++h)
        InterleaveRopeRows(out + h * head_dim * columns, head_dim, columns);
    }));
  }
  return tensors;
}

std::vector<GgufTensor> DeepSeek2GgufLayout(const HfMapping& hf, const nlohmann::ordered_json& c,
                                            const ParameterTable& table, const float* weights,
                                            GgufMetadata* m) {
  const int64_t layers = ConfigInt(c, "num_hidden_layers"), H = ConfigInt(c, "num_attention_heads");
  const int64_t Rq =
      c.contains("q_lora_rank") && c["q_lora_rank"].is_null() ? 0 : ConfigInt(c, "q_lora_rank");
  const int64_t Rkv = ConfigInt(c, "kv_lora_rank"), Dn = ConfigInt(c, "qk_nope_head_dim");
  const int64_t Dr = ConfigInt(c, "qk_rope_head_dim"), Dv = ConfigInt(c, "v_head_dim");
  const int64_t Dq = Dn + Dr, E = ConfigInt(c, "n_routed_experts");
  const int64_t shared = ConfigInt(c, "n_shared_experts");
  const int64_t dense = std::min(layers, ConfigInt(c, "first_k_dense_replace"));
  int64_t groups = ConfigInt(c, "n_group"), groups_used = ConfigInt(c, "topk_group");
  CheckLayers(layers);
  if (ConfigBool(c, "rope_interleave"))
    throw Error(kExitFailure, "internal: export gguf: config.json keeps the RoPE rows interleaved");
  if (dense < layers && shared == 0)
    throw UsageError(
        "export gguf: model.n_shared_experts = 0: llama.cpp's deepseek2 architecture requires "
        "shared experts in every MoE layer (blk.N.ffn_{gate,up,down}_shexp); it cannot run "
        "routed experts alone");
  if (E > kLlamaMaxExperts)
    throw UsageError(
        StrFormat("export gguf: model.n_routed_experts = %lld: llama.cpp loads at "
                  "most %lld experts (LLAMA_MAX_EXPERTS)",
                  (long long)E, (long long)kLlamaMaxExperts));
  // llama.cpp scores a group by its two largest scores and asserts that a group holds two. With
  // one expert a group, the topk_group best experts are eligible and the top num_experts_per_tok
  // (<= topk_group) of them are the plain top-k: written as one group, the same choice.
  if (groups > 1 && E / groups == 1) groups = groups_used = 1;

  // The keys in convert_hf_to_gguf.py's order (TextModel, then DeepseekV2Model).
  const std::string a = "deepseek2.";  // the architecture's keys' prefix
  m->Uint32(a + "block_count", layers);
  m->Uint32(a + "context_length", ConfigInt(c, "max_position_embeddings"));
  m->Uint32(a + "embedding_length", ConfigInt(c, "hidden_size"));
  m->Uint32(a + "feed_forward_length", ConfigInt(c, "intermediate_size"));
  m->Uint32(a + "attention.head_count", H);
  m->Uint32(a + "attention.head_count_kv", 1);  // MLA as MQA over the latent
  m->Float32(a + "rope.freq_base", ConfigNumber(c, "rope_theta"));
  m->Float32(a + "attention.layer_norm_rms_epsilon", ConfigNumber(c, "rms_norm_eps"));
  m->Uint32(a + "expert_count", E);
  m->Uint32(a + "expert_used_count", ConfigInt(c, "num_experts_per_tok"));
  m->Uint32(a + "expert_group_count", groups);
  m->Uint32(a + "expert_group_used_count", groups_used);
  m->Uint32(a + "expert_gating_func", kGatingSigmoid);  // DeepSeek-V3's scoring_func "sigmoid"
  m->Uint32(a + "leading_dense_block_count", dense);
  m->Uint32(a + "vocab_size", ConfigInt(c, "vocab_size"));
  // convert_hf_to_gguf.py leaves it out when q_lora_rank is null, but llama.cpp requires it of
  // every model but a few "lite" layer counts: 0 selects the plain attn_q.
  m->Uint32(a + "attention.q_lora_rank", Rq);
  m->Uint32(a + "attention.kv_lora_rank", Rkv);
  m->Uint32(a + "attention.key_length", Rkv + Dr);
  m->Uint32(a + "attention.value_length", Rkv);
  m->Uint32(a + "attention.key_length_mla", Dq);
  m->Uint32(a + "attention.value_length_mla", Dv);
  m->Uint32(a + "expert_feed_forward_length", ConfigInt(c, "moe_intermediate_size"));
  m->Uint32(a + "expert_shared_count", shared);
  m->Float32(a + "expert_weights_scale", ConfigNumber(c, "routed_scaling_factor"));
  if (ConfigBool(c, "norm_topk_prob")) m->Bool(a + "expert_weights_norm", true);
  m->Uint32(a + "rope.dimension_count", Dr);

  static const std::map<std::string, std::string> names = {
      {"self_attn.q_a_proj.weight", "attn_q_a.weight"},
      {"self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight"},
      {"self_attn.q_b_proj.weight", "attn_q_b.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight"},
      {"self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight"},
      {"mlp.gate.weight", "ffn_gate_inp.weight"},
      {"mlp.gate.e_score_correction_bias", "exp_probs_b.bias"},
      {"mlp.shared_experts.gate_proj.weight", "ffn_gate_shexp.weight"},
      {"mlp.shared_experts.up_proj.weight", "ffn_up_shexp.weight"},
      {"mlp.shared_experts.down_proj.weight", "ffn_down_shexp.weight"}};
  std::map<std::string, const ParamInfo*> by_name;
  for (const ParamInfo& p : table.params()) by_name[hf.TensorName(p)] = &p;
  std::vector<GgufTensor> tensors;
  for (const ParamInfo& p : table.params()) {
    const std::string name = hf.TensorName(p);
    const float* values = weights + p.offset;
    const size_t numel = p.numel;
    const int64_t columns = p.shape.size() == 2 ? p.shape[1] : 1;
    auto copy = [=](float* out) { std::memcpy(out, values, numel * sizeof(float)); };
    std::string layer, rest;
    if (!SplitLayerName(name, &layer, &rest)) {
      auto it = CommonNames().find(name);
      if (it == CommonNames().end() || StartsWith(it->second, "attn_") ||
          StartsWith(it->second, "ffn_"))
        throw Error(kExitFailure, NoName(name));
      tensors.push_back(Tensor(it->second, p.shape, p.shape.size() == 2, copy));
      continue;
    }
    const std::string blk = "blk." + layer + ".";
    if (rest == "self_attn.kv_b_proj.weight") {
      // (H, Dn + Dv, Rkv) split: k_b transposed to (H, Rkv, Dn), v_b (H, Dv, Rkv), for
      // llama.cpp's absorbed MLA (the queries meet the latent, the values leave it per head).
      tensors.push_back(Tensor(blk + "attn_k_b.weight", {H, Rkv, Dn}, true, [=](float* out) {
        for (int64_t h = 0; h < H; ++h)
          for (int64_t r = 0; r < Rkv; ++r)
            for (int64_t d = 0; d < Dn; ++d)
              out[(h * Rkv + r) * Dn + d] = values[(h * (Dn + Dv) + d) * Rkv + r];
      }));
      tensors.push_back(Tensor(blk + "attn_v_b.weight", {H, Dv, Rkv}, true, [=](float* out) {
        for (int64_t h = 0; h < H; ++h)
          std::memcpy(out + h * Dv * Rkv, values + (h * (Dn + Dv) + Dn) * Rkv,
                      Dv * Rkv * sizeof(float));
      }));
      continue;
    }
    const std::string experts = "mlp.experts.";
    if (StartsWith(rest, experts)) {
      // Expert e's {gate,up,down}_proj stacked into one (E, rows, columns) tensor per kind,
      // written where expert 0's stands.
      const std::string suffix = "_proj.weight";
      const size_t dot = rest.find('.', experts.size());
      const std::string kind = dot == std::string::npos ? "" : rest.substr(dot + 1);
      if (!EndsWith(kind, suffix) || kind.size() == suffix.size())
        throw Error(kExitFailure, NoName(name));
      if (rest.substr(experts.size(), dot - experts.size()) != "0") continue;
      std::vector<const float*> sources;
      for (int64_t e = 0; e < E; ++e) {
        auto it =
            by_name.find("model.layers." + layer + "." + experts + std::to_string(e) + "." + kind);
        if (it == by_name.end() || it->second->shape != p.shape)
          throw Error(kExitFailure, "internal: export gguf: layer " + layer + " lacks expert " +
                                        std::to_string(e) + "'s " + kind);
        sources.push_back(weights + it->second->offset);
      }
      const std::string merged =
          blk + "ffn_" + kind.substr(0, kind.size() - suffix.size()) + "_exps.weight";
      tensors.push_back(Tensor(merged, {E, p.shape[0], p.shape[1]}, true, [=](float* out) {
        for (size_t e = 0; e < sources.size(); ++e)
          std::memcpy(out + e * numel, sources[e], numel * sizeof(float));
      }));
      continue;
    }
    std::string gguf;
    if (auto it = CommonNames().find(rest); it != CommonNames().end()) gguf = it->second;
    if (auto it = names.find(rest); it != names.end()) gguf = it->second;
    if (gguf.empty() ||
        !(StartsWith(gguf, "attn_") || StartsWith(gguf, "ffn_") || StartsWith(gguf, "exp_probs_b")))
      throw Error(kExitFailure, NoName(name));
    // RoPE pairs: the last Dr rows of each query head, the last Dr rows of kv_a (k_pe),
    // interleaved: convert_hf_to_gguf.py writes DeepSeek's own rows as they are, which keep the
    // pairs adjacent (rope_interleave); ours are rotate-half (config.json rope_interleave false).
    std::vector<int64_t> rope_rows;  // the first row of each block of Dr
    if (rest == "self_attn.q_b_proj.weight" || rest == "self_attn.q_proj.weight")
      for (int64_t h = 0; h < H; ++h) rope_rows.push_back(h * Dq + Dn);
    if (rest == "self_attn.kv_a_proj_with_mqa.weight") rope_rows.push_back(Rkv);
    // The router stays F32, as convert_hf_to_gguf.py keeps FFN_GATE_INP.
    const bool matrix = p.shape.size() == 2 && rest != "mlp.gate.weight";
    tensors.push_back(Tensor(blk + gguf, p.shape, matrix, [=](float* out) {
      copy(out);
      for (int64_t row : rope_rows) InterleaveRopeRows(out + row * columns, Dr, columns);
    }));
  }
  return tensors;
}

}  // namespace crucible
