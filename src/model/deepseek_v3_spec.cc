// The DeepSeek-V3 family's ModelSpec and its registration as [model] name "deepseek_v3".
#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/philox.h"
#include "common/strings.h"
#include "model/deepseek_v3.h"

namespace crucible {
namespace {

std::shared_ptr<const ModelSpec> BuildDeepSeekV3Spec(Config& config) {
  return std::make_shared<DeepSeekV3Spec>(BuildDeepSeekV3Config(config));
}

ModelRegistrar deepseek_v3_registrar("deepseek_v3", BuildDeepSeekV3Spec,
                                     {"deepseek_v3", "DeepseekV3ForCausalLM",
                                      ReadDeepSeekV3HfConfig},
                                     DeepSeekV3Keys());

}  // namespace

std::string DeepSeekV3Spec::Summary() const {
  const DeepSeekV3Config& c = config_;
  return StrFormat(
      "flavor=%s layers=%lld dim=%lld vocab=%lld experts=%lld top_k=%lld parameters=%.0f "
      "active=%.0f",
      c.flavor.c_str(), (long long)c.n_layers, (long long)c.dim, (long long)c.vocab_size,
      (long long)c.n_routed_experts, (long long)c.num_experts_per_tok,
      PlannedDeepSeekV3Sizes(c).parameters, PlannedDeepSeekV3Sizes(c).active);
}

std::string DeepSeekV3Spec::SizeKeys() const {
  const DeepSeekV3Config& c = config_;
  return StrFormat(
      "model.vocab_size = %lld, model.dim = %lld, model.n_layers = %lld, model.n_routed_experts = "
      "%lld, model.moe_intermediate_size = %lld",
      (long long)c.vocab_size, (long long)c.dim, (long long)c.n_layers,
      (long long)c.n_routed_experts, (long long)c.moe_intermediate_size);
}

std::map<std::string, std::string> DeepSeekV3Spec::WeightsMetadata() const {
  const DeepSeekV3Config& c = config_;
  auto n = [](int64_t v) { return std::to_string(v); };
  return {{"crucible.model", "deepseek_v3"},
          {"crucible.flavor", c.flavor},
          {"crucible.vocab_size", n(c.vocab_size)},
          {"crucible.dim", n(c.dim)},
          {"crucible.n_layers", n(c.n_layers)},
          {"crucible.n_heads", n(c.n_heads)},
          {"crucible.ffn_hidden_dim", n(c.ffn_hidden_dim)},
          {"crucible.q_lora_rank", n(c.q_lora_rank)},
          {"crucible.kv_lora_rank", n(c.kv_lora_rank)},
          {"crucible.qk_nope_head_dim", n(c.qk_nope_head_dim)},
          {"crucible.qk_rope_head_dim", n(c.qk_rope_head_dim)},
          {"crucible.v_head_dim", n(c.v_head_dim)},
          {"crucible.n_routed_experts", n(c.n_routed_experts)},
          {"crucible.n_shared_experts", n(c.n_shared_experts)},
          {"crucible.num_experts_per_tok", n(c.num_experts_per_tok)},
          {"crucible.moe_intermediate_size", n(c.moe_intermediate_size)},
          {"crucible.first_k_dense_replace", n(c.first_k_dense_replace)},
          {"crucible.tie_embeddings", c.tie_embeddings ? "true" : "false"}};
}

ParameterSizes DeepSeekV3Spec::PlannedSizes(const ModelParallelism& parallelism) const {
  const DeepSeekV3Config& c = config_;
  // This rank's table: its block of the routed experts under expert parallelism.
  const DeepSeekV3Sizes s = PlannedDeepSeekV3Sizes(c, parallelism.ep_degree);
  const double L = static_cast<double>(c.n_layers), moe = static_cast<double>(c.moe_layers());
  const double dense = L - moe, tied = c.tie_embeddings ? 0 : 1;
  const double C = static_cast<double>(c.dim);
  const double E = static_cast<double>(c.n_routed_experts / parallelism.ep_degree);  // held
  const double shared = c.n_shared_experts > 0 ? 1 : 0, q_lora = c.q_lora_rank > 0 ? 1 : 0;
  ParameterSizes sizes;
  sizes.parameters = s.parameters;
  sizes.active = s.active;
  sizes.first_unit = s.embedding;
  sizes.largest_unit = s.largest_unit;
  sizes.largest_other_unit = s.largest_other_unit;
  if (c.moe_layers() > 0)
    sizes.largest_expert_block =
        static_cast<double>(c.n_routed_experts / parallelism.ep_degree) * s.expert;
  // Per layer: norms 2 (+ q_a_layernorm) + kv_a_layernorm; attention products q (or q_a, q_b),
  // kv_a, kv_b, o; a dense MLP's 3, or a router, the shared experts' 3 and each expert's 3.
  const double norms = L * (3 + q_lora) + 1;
  const double attention_linear = L * (2 + 1 + q_lora);                  // q or q_a q_b, kv_a, kv_b
  const double mlp_linear = dense * 2 + moe * (1 + 2 * shared + 2 * E);  // the router: 1
  const double mlp_output = dense + moe * (shared + E);
  sizes.tensors = norms + attention_linear + L + mlp_linear + mlp_output + moe + 1 + tied;
  auto set = [&](ParamKind kind, double parameters, double tensors) {
    sizes.kind_parameters[static_cast<size_t>(kind)] = parameters;
    sizes.kind_tensors[static_cast<size_t>(kind)] = tensors;
  };
  const double norm_parameters =
      L * (2 * C + static_cast<double>(c.q_lora_rank) + static_cast<double>(c.kv_lora_rank)) + C;
  const double o_proj = C * static_cast<double>(c.n_heads * c.v_head_dim);
  const double Fm = static_cast<double>(c.moe_intermediate_size);
  const double Fs = static_cast<double>(c.n_shared_experts) * Fm;
  const double F = static_cast<double>(c.ffn_hidden_dim);
  const double output = L * o_proj + dense * C * F + moe * (C * Fs + E * C * Fm);
  set(ParamKind::kEmbedding, s.embedding, 1);
  set(ParamKind::kNorm, norm_parameters, norms);
  set(ParamKind::kOutputProjection, output, L + mlp_output);
  set(ParamKind::kHead, tied * s.embedding, tied);
  const double biases = moe * static_cast<double>(c.n_routed_experts);  // one per expert, all
  set(ParamKind::kBalanceBias, biases, moe);
  set(ParamKind::kLinear,
      s.parameters - s.embedding - norm_parameters - output - tied * s.embedding - biases,
      attention_linear + mlp_linear);
  return sizes;
}

BufferSizes DeepSeekV3Spec::PlannedBuffers(double B, double T,
                                           const ModelParallelism& parallelism) const {
  const double activations = PlannedDeepSeekV3ActivationBytes(config_, B, T, parallelism.ep_degree);
  // Besides the activations (which count the RoPE tables and the tokens' copies): the host's
  // routing of each MoE layer (affinities N x E, four arrays of N x K, the expert offsets).
  const DeepSeekV3Config& c = config_;
  const double N = B * T, K = static_cast<double>(c.num_experts_per_tok);
  const double E = static_cast<double>(c.n_routed_experts);
  const double routing = static_cast<double>(c.moe_layers()) * 4 * (N * E + 4 * N * K + 2 * E);
  return {activations, activations + routing + 8 * N, 4 * N * static_cast<double>(c.vocab_size)};
}

ParameterTable DeepSeekV3Spec::BuildTable(const ModelParallelism& parallelism) const {
  if (std::string why = CheckParallelism(parallelism); !why.empty()) throw UsageError(why);
  return DeepSeekV3ParameterTable(config_, parallelism.ep_degree, parallelism.ep_rank);
}

std::string DeepSeekV3Spec::CheckParallelism(const ModelParallelism& parallelism) const {
  if (parallelism.tp_chunks > 1 || parallelism.tp_degree > 1)
    return "model.name = \"deepseek_v3\" has no tensor-parallel layers yet (set "
           "parallelism.tensor_parallel_degree = 1)";
  const int ep = parallelism.ep_degree;
  if (ep > 1 && config_.moe_layers() == 0)
    return StrFormat(
        "parallelism.expert_parallel_degree = %d: the model has no MoE layer "
        "(model.first_k_dense_replace = %lld, model.n_layers = %lld): set the degree to 1",
        ep, (long long)config_.first_k_dense_replace, (long long)config_.n_layers);
  if (ep > 1 && config_.n_routed_experts % ep != 0)
    return StrFormat(
        "parallelism.expert_parallel_degree = %d does not divide model.n_routed_experts = %lld "
        "(each rank of an expert-parallel group computes an equal block of the experts): choose "
        "a degree that divides the experts",
        ep, (long long)config_.n_routed_experts);
  return "";
}

std::unique_ptr<Model> DeepSeekV3Spec::Build(int64_t batch_size, int64_t seq_len,
                                             std::shared_ptr<ComputeBackend> backend,
                                             const ModelParallelism& parallelism) const {
  if (std::string why = CheckParallelism(parallelism); !why.empty()) throw UsageError(why);
  return std::make_unique<DeepSeekV3Model>(config_, batch_size, seq_len, std::move(backend),
                                           parallelism);
}

void DeepSeekV3Spec::InitWeights(const ParameterTable& table, uint64_t seed, size_t begin,
                                 size_t end, float* out) const {
  const DeepSeekV3Config& c = config_;
  for (size_t index = 0; index < table.params().size(); ++index) {
    const ParamInfo& p = table.params()[index];
    const size_t b = std::max(begin, p.offset), e = std::min(end, p.offset + p.numel);
    if (b >= e) continue;
    float* w = out + (b - begin);
    const size_t first = b - p.offset, count = e - b;
    if (p.kind == ParamKind::kNorm || p.kind == ParamKind::kBalanceBias) {
      std::fill(w, w + count, p.kind == ParamKind::kNorm ? 1.0f : 0.0f);
      continue;
    }
    double std = c.init_std;
    if (p.kind == ParamKind::kOutputProjection) std = c.init_std / std::sqrt(2.0 * c.n_layers);
    if (p.kind == ParamKind::kHead) std = 0.25 / std::sqrt(static_cast<double>(c.dim));
#pragma omp parallel for schedule(static)
    for (size_t j = 0; j < count; ++j) {
      // Each element has its own Philox stream position: thread-count independent.
      const size_t i = p.GlobalIndex(first + j);
      Philox rng(seed, (static_cast<uint64_t>(p.whole_index) << 40) | i);
      double z = rng.NextNormal();
      for (int attempt = 0; attempt < 8 && std::fabs(z) > 3.0; ++attempt) z = rng.NextNormal();
      if (std::fabs(z) > 3.0) z = 0.0;
      w[j] = static_cast<float>(z * std);
    }
  }
}

double DeepSeekV3Spec::TrainFlopsPerToken(const ParameterTable& table, int64_t seq_len) const {
  const DeepSeekV3Config& c = config_;
  const double active_experts = static_cast<double>(c.moe_layers()) *
                                static_cast<double>(c.num_experts_per_tok) *
                                PlannedDeepSeekV3Sizes(c).expert;
  const double attention = 3.0 * static_cast<double>(c.n_layers) * static_cast<double>(seq_len) *
                           static_cast<double>(c.n_heads) *
                           static_cast<double>(c.qk_head_dim() + c.v_head_dim);
  return 6.0 * (static_cast<double>(table.FlopParams()) + active_experts) + attention;
}

}  // namespace crucible
