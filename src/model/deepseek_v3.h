// The DeepSeek-V3 family, registered as [model] name "deepseek_v3": multi-head latent attention
// (MLA) and a mixture of experts (MoE), after DeepSeek-V2/V3 and transformers'
// DeepseekV3ForCausalLM, written as plain single-process code like the Llama family
// (model/llama.h), on the same kernels: RMSNorm, SwiGLU, RoPE, the attention tiles, the fused head
// (model/decoder_head.h).
//
// A layer: x_mid = x + o_proj(MLA(norm1(x))); x_out = x_mid + FFN(norm2(x_mid)). The first
// first_k_dense_replace layers' FFN is a SwiGLU MLP of ffn_hidden_dim; the others' is a MoE:
// shared experts (one SwiGLU MLP of n_shared_experts x moe_intermediate_size) plus the routed
// experts (SwiGLU MLPs of moe_intermediate_size), each token going to num_experts_per_tok of them
// (model/moe_routing.h states the router).
//
// MLA, per token (H heads; Dn = qk_nope_head_dim, Dr = qk_rope_head_dim, Dq = Dn + Dr, Dv =
// v_head_dim):
//   q = q_b_proj(q_a_layernorm(q_a_proj(x)))  (q_proj(x) when q_lora_rank = 0)    (H, Dq)
//   c_kv = kv_a_layernorm(kv_a_proj_with_mqa(x)[:kv_lora_rank])                   (kv_lora_rank)
//   k_pe = kv_a_proj_with_mqa(x)[kv_lora_rank:]                                   (Dr), one head
//   [k_nope | v] = kv_b_proj(c_kv)                                                (H, Dn + Dv)
//   RoPE (rotate-half on our layout) on the last Dr values of each query head and on k_pe;
//   key = [k_nope | k_pe] for every head; causal softmax(q key^T / sqrt(Dq)) v; o_proj.
// transformers' rope_interleave = true keeps the RoPE pairs interleaved in its weights; the
// Hugging Face mapping (deepseek_v3_hf.cc) permutes those rows to this layout when it reads such
// a folder (the scores do not change) and exports with rope_interleave = false.
//
// The attention kernel takes the two head widths (HeadDims): q and k at Dq, v and the output at
// Dv, either larger (no padding of v to Dq, as transformers does for flash attention).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "compute/backend.h"
#include "model/decoder_common.h"
#include "model/expert_parallel.h"
#include "model/model.h"
#include "model/moe_routing.h"
#include "model/parameters.h"

namespace crucible {

struct DeepSeekV3Config {
  std::string flavor;
  int64_t vocab_size = 0, dim = 0, n_layers = 0, n_heads = 0;
  int64_t ffn_hidden_dim = 0;  // the dense layers' SwiGLU (transformers' intermediate_size)
  int64_t q_lora_rank = 0;     // 0: no query compression (q_proj)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  int64_t n_routed_experts = 0, n_shared_experts = 0, num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t n_group = 1, topk_group = 1;
  double routed_scaling_factor = 1.0;
  bool norm_topk_prob = true;
  int64_t first_k_dense_replace = 0;
  // The sequence-wise balance loss's coefficient (0: none; moe_routing.h's SequenceBalanceLoss):
  // each sequence's loss counts as its T tokens do, so with every target counted the objective
  // is the cross-entropy's mean plus aux_loss_alpha times the mean over sequences and MoE layers'
  // sum, as DeepSeek-V3 states it.
  double aux_loss_alpha = 0;
  bool tie_embeddings = false;
  double rope_theta = 10000.0, norm_eps = 1e-6, init_std = 0.02;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool moe_layer(int64_t layer) const { return layer >= first_k_dense_replace; }
  int64_t moe_layers() const { return n_layers - std::min(n_layers, first_k_dense_replace); }
  MoeRouterConfig router() const {
    return {n_routed_experts,
            num_experts_per_tok,
            n_group,
            topk_group,
            static_cast<float>(routed_scaling_factor),
            norm_topk_prob};
  }
};

// The [model] keys only this family reads (refused for another model.name).
std::vector<const char*> DeepSeekV3Keys();
// Resolves [model] (flavor preset, then explicit keys), validates it (UsageError naming the key)
// and writes the resolved values back into `config`.
DeepSeekV3Config BuildDeepSeekV3Config(Config& config);
std::vector<std::string> DeepSeekV3Flavors();
// What is wrong with a resolved config ("" when nothing): the checks of BuildDeepSeekV3Config, for
// a config read from a Hugging Face folder too.
std::string CheckDeepSeekV3Config(const DeepSeekV3Config& config);

// Unit 0 the embedding, unit 1 + l decoder layer l, the last unit the tail (final norm, untied
// head); transformers' tensor names. A MoE layer's tensors: mlp.gate.weight (the router),
// mlp.gate.e_score_correction_bias (its balance bias, ParamKind::kBalanceBias),
// mlp.shared_experts.{gate,up,down}_proj.weight, then expert e's mlp.experts.e.{gate,up,down}_proj.
//
// Load balancing without an auxiliary loss (DeepSeek-V3): the bias only chooses (model/
// moe_routing.h); Backward writes in its gradient slot each expert's share of the micro-batch's
// token slots minus 1/E, and optim/balance_bias.h moves it by model.bias_update_speed a step
// against the sign of the reduced sum.
// Expert parallelism (ep_degree > 1): the table of rank ep_rank of the group, which holds the
// routed experts [ep_rank E / ep_degree, (ep_rank + 1) E / ep_degree) of each MoE layer and leaves
// the others out (ParameterTable::Skip): every other tensor is the whole model's.
ParameterTable DeepSeekV3ParameterTable(const DeepSeekV3Config& config, int ep_degree = 1,
                                        int ep_rank = 0);

// Unit-relative offsets of a layer's tensors in DeepSeekV3ParameterTable's table; q_a / q_a_norm
// are 0 without query compression (q then holds q_proj, else q_b_proj), gate/up/down the dense
// MLP's or the shared experts'.
struct DeepSeekV3LayerOffsets {
  size_t ln1 = 0, q_a = 0, q_a_norm = 0, q = 0, kv_a = 0, kv_a_norm = 0, kv_b = 0, o = 0, ln2 = 0;
  size_t gate = 0, up = 0, down = 0;  // dense MLP, or shared experts (MoE, when any)
  size_t router = 0, bias = 0;        // MoE: the router's weight, its balance bias
  std::vector<size_t> expert;         // MoE: each held expert's gate_proj (up and down follow)
};
struct DeepSeekV3TensorOffsets {
  size_t embed = 0, final_norm = 0, head = 0;  // head: untied only
  std::vector<DeepSeekV3LayerOffsets> layers;
};
// Of `table` (DeepSeekV3ParameterTable(config, ep_degree, ep_rank)): the experts that rank holds,
// in order. An internal error when a tensor is outside its unit or an expert's gate, up and down
// do not follow each other.
DeepSeekV3TensorOffsets FindDeepSeekV3Tensors(const ParameterTable& table,
                                              const DeepSeekV3Config& config, int ep_degree = 1,
                                              int ep_rank = 0);

// The family's inference path (model/model.h InferenceModel; deepseek_v3_infer.cc) over the
// whole model's table, on one process, and the bytes of its KV cache: per slot and layer,
// max_len x H x (qk_head_dim + v_head_dim) floats (the expanded keys after RoPE and the values).
std::unique_ptr<InferenceModel> StartDeepSeekV3Inference(const DeepSeekV3Config& config,
                                                         ParameterAccess& access, int64_t slots,
                                                         int64_t max_len,
                                                         std::shared_ptr<ComputeBackend> backend,
                                                         WeightType weight_type);
double PlannedDeepSeekV3KvCacheBytes(const DeepSeekV3Config& config, double slots, double max_len);

// Parameter counts in double: per unit as the table lays them out, and the active parameters of
// a token (the routed experts counted num_experts_per_tok times, not n_routed_experts).
struct DeepSeekV3Sizes {
  double embedding = 0, attention = 0, dense_mlp = 0, moe_shared = 0, router = 0, expert = 0;
  double dense_layer = 0, moe_layer = 0, tail = 0;
  double parameters = 0, active = 0;
  double largest_unit = 0, largest_other_unit = 0;
};
// `ep_degree`: of the table of a rank that holds 1 / ep_degree of the routed experts (`active`
// is the whole model's at every degree).
DeepSeekV3Sizes PlannedDeepSeekV3Sizes(const DeepSeekV3Config& config, int ep_degree = 1);
// Exactly DeepSeekV3Model(config, B, T, backend, a parallelism of ep_degree).activation_bytes().
double PlannedDeepSeekV3ActivationBytes(const DeepSeekV3Config& config, double B, double T,
                                        int ep_degree = 1);

class DeepSeekV3Spec final : public ModelSpec, public HfMapping {
 public:
  explicit DeepSeekV3Spec(const DeepSeekV3Config& config) : config_(config) {}
  const DeepSeekV3Config& config() const { return config_; }

  std::string name() const override { return "deepseek_v3"; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  std::string Summary() const override;
  std::string SizeKeys() const override;
  std::map<std::string, std::string> WeightsMetadata() const override;
  using ModelSpec::PlannedSizes;
  ParameterSizes PlannedSizes(const ModelParallelism& parallelism) const override;
  using ModelSpec::PlannedBuffers;
  BufferSizes PlannedBuffers(double batch_size, double seq_len,
                             const ModelParallelism& parallelism) const override;
  using ModelSpec::BuildTable;
  ParameterTable BuildTable(const ModelParallelism& parallelism) const override;
  std::string CheckParallelism(const ModelParallelism& parallelism) const override;
  // As Llama's: normal(0, init_std) truncated at 3 sigma; output projections (o_proj and every
  // down_proj) depth-scaled by 1/sqrt(2 n_layers); the untied head at dim^-0.5 / 4; norms at 1;
  // the balance biases at 0.
  void InitWeights(const ParameterTable& table, uint64_t seed, size_t begin, size_t end,
                   float* out) const override;
  // 6 x the active parameters of the products (the router and num_experts_per_tok experts; the
  // untied embedding is a lookup) + causal attention 3 L T H (Dq + Dv).
  double TrainFlopsPerToken(const ParameterTable& table, int64_t seq_len) const override;
  using ModelSpec::Build;
  std::unique_ptr<Model> Build(int64_t batch_size, int64_t seq_len,
                               std::shared_ptr<ComputeBackend> backend,
                               const ModelParallelism& parallelism) const override;
  std::unique_ptr<InferenceModel> StartInference(
      ParameterAccess& access, int64_t slots, int64_t max_len,
      std::shared_ptr<ComputeBackend> backend,
      WeightType weight_type = WeightType::kF32) const override {
    return StartDeepSeekV3Inference(config_, access, slots, max_len, std::move(backend),
                                    weight_type);
  }
  double PlannedKvCacheBytes(double slots, double max_len) const override {
    return PlannedDeepSeekV3KvCacheBytes(config_, slots, max_len);
  }
  const HfMapping* hf() const override { return this; }
  bool has_aux_loss() const override { return config_.aux_loss_alpha > 0; }

  // HfMapping (deepseek_v3_hf.cc): DeepseekV3ForCausalLM, tensor names the table's (experts one
  // by one, as transformers saves them with save_original_format, its default). A config.json
  // is refused (DataError) when it describes what this code cannot reproduce exactly: another
  // activation, attention biases, a RoPE other than the default (DeepSeek-V3's own checkpoints
  // use yarn), another router (scoring_func, topk_method), MoE layers not every layer after
  // first_k_dense_replace. An export says rope_interleave = false; a folder with rope_interleave
  // true (or absent, transformers' default) has its RoPE rows de-interleaved when read.
  std::string architecture() const override;
  nlohmann::ordered_json ConfigJson(int64_t max_position_embeddings,
                                    const nlohmann::json& bos_token_id,
                                    const nlohmann::json& eos_token_id) const override;
  std::vector<std::string> Differences(const nlohmann::json& config,
                                       const std::string& path) const override;
  std::string TensorName(const ParamInfo& tensor) const override { return tensor.name; }
  void FromHf(const nlohmann::json& config, const ParamInfo& tensor, float* values) const override;

 private:
  DeepSeekV3Config config_;
};

// The DeepSeek-V3 a Hugging Face config.json describes (flavor "hf"): the family's HfConfigReader.
std::shared_ptr<const ModelSpec> ReadDeepSeekV3HfConfig(const nlohmann::json& config,
                                                        const std::string& path);

class DeepSeekV3Model final : public Model {
 public:
  // UsageError when `backend` refuses the family's inherited kernels (compute/backend.h).
  // `parallelism`: expert parallelism's group (ep_degree divides n_routed_experts; the backend's
  // memory must be the host's); no tensor parallelism.
  DeepSeekV3Model(const DeepSeekV3Config& config, int64_t batch_size, int64_t seq_len,
                  std::shared_ptr<ComputeBackend> backend,
                  const ModelParallelism& parallelism = {});
  ~DeepSeekV3Model() override;
  DeepSeekV3Model(const DeepSeekV3Model&) = delete;
  DeepSeekV3Model& operator=(const DeepSeekV3Model&) = delete;

  const ParameterTable& table() const override { return table_; }
  int64_t batch_size() const override { return B_; }
  int64_t seq_len() const override { return T_max_; }
  size_t activation_bytes() const override;

  LossSum Forward(ParameterAccess& access, const int32_t* tokens, const int32_t* targets,
                  const float* loss_weights, const ForwardOptions& options) override;
  const float* logits() const override;
  LossSum Retarget(const int32_t* targets) override;
  LossSum Reweight(const float* loss_weights) override;
  const float* losses() const override;
  const int32_t* predictions() const override;
  void Backward(ParameterAccess& access, float loss_scale) override;

  // The routing of MoE layer `layer`'s tokens in the last Forward (nullptr for a dense layer).
  const MoeRouting* routing(int64_t layer) const;
  std::vector<ExpertLoad> ExpertLoads() const override;

 private:
  struct Buffers;
  using LayerOffsets = DeepSeekV3LayerOffsets;
  void AttentionForward(int64_t l, const float* w);
  void AttentionBackward(int64_t l, const float* w, float* g);
  void FfnForward(int64_t l, const float* w, float* x_out);
  // `loss_scale`: Backward's, for the sequence balance loss's gradient. `access`: where an
  // expert owner adds the other ranks' gradient contributions (expert parallelism).
  void FfnBackward(int64_t l, const float* w, float* g, float loss_scale, ParameterAccess& access);
  // The routed experts' products of MoE layer l, forward and backward: over this rank's tokens,
  // or (expert parallelism) over the tokens every rank of the group sent to this rank's experts.
  void ExpertsForward(int64_t l, const float* w);
  void ExpertsBackward(int64_t l, const float* w, float* g, ParameterAccess& access);
  // `sum` with the forward's auxiliary loss (aux_) in its units.
  LossSum SumWithAux(LossSum sum) const;
  // Copies `targets` (host) to the model's buffers, checked against the vocabulary.
  void SetTargets(const int32_t* targets);
  DeepSeekV3Config config_;
  ParameterTable table_;
  // T_: the rows' length of the last Forward (ForwardOptions::seq_len), at most T_max_, the
  // length the buffers were built for.
  int64_t B_, T_, T_max_;
  void SetLength(int64_t seq_len);
  std::shared_ptr<ComputeBackend> backend_;
  std::unique_ptr<ExpertParallelOps> experts_;  // expert parallelism (ep_degree > 1)
  std::unique_ptr<UnitMemory> units_;
  std::vector<LayerOffsets> layers_;
  size_t embed_ = 0, final_norm_ = 0, head_ = 0;
  const float* loss_weights_ = nullptr;  // of the last Forward, read by Backward
  // The last Forward was kFused (its head's backward done, with this scale), or kScored.
  bool fused_ = false, scored_ = false;
  float fused_scale_ = 0;
  double aux_ = 0;  // the forward's sum of sequence balance losses over MoE layers
  Buffers* buffers_;
};

}  // namespace crucible
