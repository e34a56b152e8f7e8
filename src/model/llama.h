// The Llama family, registered as [model] name "llama": a Llama-3-style decoder written as plain
// single-process code: token embedding, RMSNorm, rotary embeddings, grouped-query attention,
// SwiGLU MLP, final norm, output head (tied or not). Code outside src/model/ reaches it only
// through model/model.h (LlamaSpec is its ModelSpec, LlamaModel its Model); this header is for
// the family's own files and its tests.
//
// The model owns no parameters. Weights, gradients and optimizer state are flat float buffers
// laid out by the ParameterTable (Hugging Face Llama tensor names, shapes, offsets), so
// checkpointing, reduction, sharding and hashing work on one span. Activation memory is planned
// once from (micro-batch size, seq_len) when the model is built; a step allocates nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "compute/backend.h"
#include "model/decoder_common.h"
#include "model/model.h"
#include "model/parallelism.h"
#include "model/parameters.h"

namespace crucible {

struct LlamaConfig {
  std::string flavor;
  int64_t vocab_size = 0;
  int64_t dim = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t ffn_hidden_dim = 0;
  bool tie_embeddings = false;
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  double init_std = 0.02;
  int64_t head_dim() const { return dim / n_heads; }
};

// Builds the model config from [model] (flavor preset, then explicit keys) and validates it;
// writes the resolved values back into `config` so the run directory records them.
LlamaConfig BuildLlamaConfig(Config& config);
std::vector<std::string> LlamaFlavors();

// The parameter table of a Llama: unit 0 is the embedding, unit 1 + l decoder layer l, the last
// unit the tail (final norm and untied head); Hugging Face tensor names.
ParameterTable LlamaParameterTable(const LlamaConfig& config,
                                   const ModelParallelism& parallelism = {});
// What `parallelism` cannot cut of this Llama ("" when it can): each of query heads, KV heads,
// the FFN width and the vocabulary must divide into tp_chunks.
std::string CheckLlamaParallelism(const LlamaConfig& config, const ModelParallelism& parallelism);

// Where a Llama's tensors are, relative to the first element of their unit: each decoder layer's
// (unit 1 + l), the embedding (unit 0), the final norm and the untied head (the tail unit). Looked
// up per unit in the table, so layers need not be laid out alike (a family whose first layers are
// dense and later ones MoE keeps one such record per unit in the same way).
struct LlamaLayerOffsets {
  size_t ln1 = 0, q = 0, k = 0, v = 0, o = 0, ln2 = 0, gate = 0, up = 0, down = 0;
};
struct LlamaTensorOffsets {
  size_t embed = 0, final_norm = 0, head = 0;  // head: untied only
  std::vector<LlamaLayerOffsets> layers;
};
// Of `table` (LlamaParameterTable(config, ...)); an internal error when a tensor is outside its
// unit.
LlamaTensorOffsets FindLlamaTensors(const ParameterTable& table, const LlamaConfig& config);

// The Llama's inference path (model/model.h InferenceModel; llama_infer.cc) over the whole
// model's table (no tensor parallelism), and the bytes of its KV cache.
std::unique_ptr<InferenceModel> StartLlamaInference(const LlamaConfig& config,
                                                    ParameterAccess& access, int64_t slots,
                                                    int64_t max_len,
                                                    std::shared_ptr<ComputeBackend> backend,
                                                    WeightType weight_type);
double PlannedLlamaKvCacheBytes(const LlamaConfig& config, double slots, double max_len);

// What a config asks for, computed in double so that no config can overflow it (the memory
// check runs on it before anything is allocated): the parameters of each unit (the embedding,
// one decoder layer, the tail), exactly as LlamaParameterTable lays them out, and the activation
// bytes of LlamaModel(config, batch_size, seq_len), exactly its activation_bytes().
struct LlamaSizes {
  double embedding = 0, layer = 0, tail = 0;  // parameters per unit
  double linear = 0, output = 0;  // of one layer: q k v gate up; o down (the rest: its norms)
  double parameters = 0;          // embedding + n_layers x layer + tail
  double largest_unit = 0, largest_other_unit = 0;  // of all units; of all but the embedding
};
// Under tensor parallelism, this rank's parts (`parallelism`'s split: every tensor but the norms
// cut into tp_degree equal parts).
LlamaSizes PlannedLlamaSizes(const LlamaConfig& config, const ModelParallelism& parallelism = {});
double PlannedLlamaActivationBytes(const LlamaConfig& config, double batch_size, double seq_len,
                                   const ModelParallelism& parallelism = {});

// The Llama ModelSpec, and its Hugging Face mapping (LlamaForCausalLM; tensor names are the
// table's, and rotary embeddings use the same rotate-half layout, so no tensor is permuted).
class LlamaSpec final : public ModelSpec, public HfMapping {
 public:
  explicit LlamaSpec(const LlamaConfig& config) : config_(config) {}
  const LlamaConfig& config() const { return config_; }

  std::string name() const override { return "llama"; }
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
  ParameterTable BuildTable(const ModelParallelism& parallelism) const override {
    return LlamaParameterTable(config_, parallelism);
  }
  std::string CheckParallelism(const ModelParallelism& parallelism) const override {
    return CheckLlamaParallelism(config_, parallelism);
  }
  // Llama-reference init: normal(0, init_std) truncated at 3 sigma for embeddings and input
  // projections; output projections (o_proj, down_proj) depth-scaled by 1/sqrt(2 n_layers); the
  // untied output head at std dim^-0.5 / 4, so initial logits have std ~0.25 and the first loss
  // is within ~0.05 of ln(vocab); norms at 1.
  void InitWeights(const ParameterTable& table, uint64_t seed, size_t begin, size_t end,
                   float* out) const override;
  // 6 N + 6 L d T (N from FlopParams(), causal attention counted at half of the dense 12 L d T).
  double TrainFlopsPerToken(const ParameterTable& table, int64_t seq_len) const override;
  using ModelSpec::Build;
  std::unique_ptr<Model> Build(int64_t batch_size, int64_t seq_len,
                               std::shared_ptr<ComputeBackend> backend,
                               const ModelParallelism& parallelism) const override;
  std::unique_ptr<InferenceModel> StartInference(
      ParameterAccess& access, int64_t slots, int64_t max_len,
      std::shared_ptr<ComputeBackend> backend,
      WeightType weight_type = WeightType::kF32) const override {
    return StartLlamaInference(config_, access, slots, max_len, std::move(backend), weight_type);
  }
  double PlannedKvCacheBytes(double slots, double max_len) const override {
    return PlannedLlamaKvCacheBytes(config_, slots, max_len);
  }
  const HfMapping* hf() const override { return this; }

  // HfMapping (llama_hf.cc). A config.json is read as transformers 4 or 5 writes it (the RoPE
  // base is `rope_theta` or `rope_parameters.rope_theta`); refused (DataError) when it describes
  // what this code cannot reproduce exactly: an activation other than silu, biases, a rope_type
  // other than default (llama3, yarn, linear, dynamic, ...), or two RoPE bases that disagree.
  std::string architecture() const override;
  nlohmann::ordered_json ConfigJson(int64_t max_position_embeddings,
                                    const nlohmann::json& bos_token_id,
                                    const nlohmann::json& eos_token_id) const override;
  std::vector<std::string> Differences(const nlohmann::json& config,
                                       const std::string& path) const override;
  std::string TensorName(const ParamInfo& tensor) const override { return tensor.name; }

 private:
  LlamaConfig config_;
};

// The Llama a Hugging Face config.json describes (flavor "hf"): the family's HfConfigReader.
std::shared_ptr<const ModelSpec> ReadLlamaHfConfig(const nlohmann::json& config,
                                                   const std::string& path);

class LlamaModel final : public Model {
 public:
  // Activations in `backend`'s memory, its kernels for every step.
  // Split over ranks as `parallelism` says (model/parallelism.h: column- and row-parallel
  // projections, the vocabulary cut for the embedding and the fused head, every split
  // dimension computed chunk by chunk).
  LlamaModel(const LlamaConfig& config, int64_t batch_size, int64_t seq_len,
             std::shared_ptr<ComputeBackend> backend, const ModelParallelism& parallelism = {});
  ~LlamaModel() override;
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  const LlamaConfig& config() const { return config_; }
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

  // Where decoder layer l's tensors are, relative to the first element of its unit (1 + l).
  using LayerOffsets = LlamaLayerOffsets;
  const LayerOffsets& layer_offsets(int64_t layer) const { return layers_[layer]; }

 private:
  struct Buffers;
  // A unit's weights and gradients as the backend's kernels read and write them
  // (model/decoder_common.h).
  const float* UnitWeights(ParameterAccess& access, int unit) {
    return units_->Weights(access, unit);
  }
  float* UnitGradients(ParameterAccess& access, int unit) {
    return units_->Gradients(access, unit);
  }
  void UnitGradientsReady(ParameterAccess& access, int unit) {
    units_->GradientsReady(access, unit);
  }
  // Copies `targets` (host) to the model's buffers, checked against the vocabulary.
  void SetTargets(const int32_t* targets);
  // The loss sum of the losses of the last Forward against `targets`.
  LossSum SumLosses(const int32_t* targets) const;
  // ForwardOptions::kFused's head and cross-entropy with their backward, chunk by chunk: the
  // losses and lse, dln (d final-norm output) and the head's weight gradient.
  LossSum FusedHead(ParameterAccess& access, const float* head, const int32_t* targets,
                    float loss_scale);
  // ForwardOptions::kScored's head, chunk by chunk: the losses and lse, and the predictions.
  LossSum ScoredHead(const float* head, const int32_t* targets);
  // The vocabulary's log-sum-exp over this rank's chunks `x` (n rows each, vocabulary chunk
  // width), combined over the group: the lse and losses of rows [r, r + n) (device).
  void VocabularyLse(const float* const* x, int64_t r, int64_t n, const int32_t* targets);
  // The largest logit of each of rows [r, r + n) over the whole vocabulary (first on ties).
  void VocabularyArgmax(const float* const* x, int64_t r, int64_t n, const int32_t* targets);
  // The partial-sum buffers of a row-parallel product whose result goes to `out` (n floats).
  std::vector<float*> Partials(float* out);
  // RMSNorm's backward over this rank's rows: dinp += for each row, and the weight's gradient
  // (overwritten) summed per row chunk in the tree (model/parallelism.h), over the group when
  // the rows are split (sequence parallelism).
  void NormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                    const float* weight, const float* rstd);
  // Sequence parallelism: this rank's rows of `local` gathered from the group into `full` (all
  // rows); without it, `local` itself.
  const float* AllRows(const float* local, float* full, const char* what);
  // A row-parallel product's partial sums (of all rows) added over the chunks; under sequence
  // parallelism this rank's rows of the sum go to `out`, else partials[0] (== out) holds it.
  void RowParallelSum(const std::vector<float*>& partials, float* out, const char* what);
  // One column-parallel projection of a layer's input: its weight and gradient at chunk 0, its
  // output gradient at chunk 0 (N rows per chunk) and its rows per chunk.
  struct ColumnProjection {
    float* grad;
    const float* weight;
    const float* dout;
    int64_t width;
  };
  // The backward of the projections that read `inp` (all N rows, C wide), chunk by chunk: their
  // weights' gradients, and chunk k's input gradient (the first overwrites, the others add) in
  // partials[k], for RowParallelSum.
  void ColumnParallelBackward(const std::vector<float*>& partials, const float* inp,
                              std::initializer_list<ColumnProjection> projections);
  LlamaConfig config_;
  ModelParallelism parallelism_;
  std::unique_ptr<TensorParallelOps> tp_;
  // Chunks of this rank, and one chunk's query heads, KV heads, FFN width and vocabulary.
  int64_t chunks_ = 1, Hc_ = 0, KVc_ = 0, Fc_ = 0, Vc_ = 0;
  // The rows of the residual stream and the norms this rank holds: all B x T, or under sequence
  // parallelism its block [row_first_, row_first_ + rows_).
  bool sp_ = false;
  int64_t rows_ = 0, row_first_ = 0;
  // The final norm's output of all rows, which the head reads.
  const float* head_rows_ = nullptr;
  ParameterTable table_;
  // Unit-relative offsets of the tensors outside the layers (embedding in unit 0, final norm and
  // untied head in the tail unit), and of each layer's.
  size_t embed_ = 0, final_norm_ = 0, head_ = 0;
  std::vector<LayerOffsets> layers_;
  // T_: the rows' length of the last Forward (ForwardOptions::seq_len), at most T_max_, the
  // length the buffers were built for.
  int64_t B_, T_, T_max_;
  void SetLength(int64_t seq_len);
  const float* loss_weights_ = nullptr;  // of the last Forward, read by Backward
  // The last Forward was kFused, with this loss scale (its head's backward is done).
  bool fused_ = false;
  float fused_scale_ = 0;
  // The last Forward was kScored: no logits kept, no backward possible.
  bool scored_ = false;
  std::shared_ptr<ComputeBackend> backend_;
  std::unique_ptr<UnitMemory> units_;
  Buffers* buffers_;
};

}  // namespace crucible
