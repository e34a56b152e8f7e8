// A Llama-3-style decoder written as plain single-process code: token embedding, RMSNorm,
// rotary embeddings, grouped-query attention, SwiGLU MLP, final norm, output head (tied or not).
//
// The model owns no parameters. Weights, gradients and optimizer state are flat float buffers
// laid out by the ParameterTable (Hugging Face Llama tensor names, shapes, offsets), so
// checkpointing, reduction, sharding and hashing work on one span. Activation memory is planned
// once from (micro-batch size, seq_len) when the model is built; a step allocates nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
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
ParameterTable LlamaParameterTable(const LlamaConfig& config);

// What a config asks for, computed in double so that no config can overflow it (the memory
// check runs on it before anything is allocated): the parameters of each unit (the embedding,
// one decoder layer, the tail), exactly as LlamaParameterTable lays them out, and the activation
// bytes of LlamaModel(config, batch_size, seq_len), exactly its activation_bytes().
struct LlamaSizes {
  double embedding = 0, layer = 0, tail = 0;        // parameters per unit
  double parameters = 0;                            // embedding + n_layers x layer + tail
  double largest_unit = 0, largest_other_unit = 0;  // of all units; of all but the embedding
};
LlamaSizes PlannedSizes(const LlamaConfig& config);
double PlannedActivationBytes(const LlamaConfig& config, double batch_size, double seq_len);

// Llama-reference init: normal(0, init_std) truncated at 3 sigma for embeddings and input
// projections; output projections (o_proj, down_proj) depth-scaled by 1/sqrt(2 n_layers); the
// untied output head at std dim^-0.5 / 4, so initial logits have std ~0.25 and the first loss is
// within ~0.05 of ln(vocab); norms at 1. A pure function of (seed, tensor, element).
void InitWeights(const LlamaConfig& config, const ParameterTable& table, uint64_t seed,
                 float* weights);
// The same values for flat elements [begin, end) only, written to out[0, end - begin) (a
// ZeRO-3 rank initialises its shard without materialising the whole model).
void InitWeightsRange(const LlamaConfig& config, const ParameterTable& table, uint64_t seed,
                      size_t begin, size_t end, float* out);

// Floating-point operations per trained token: 6 N + 6 L d T (forward + backward; N from
// FlopParams(), causal attention counted at half of the dense 12 L d T).
double TrainFlopsPerToken(const LlamaConfig& config, const ParameterTable& table, int64_t seq_len);

class LlamaModel {
 public:
  LlamaModel(const LlamaConfig& config, int64_t batch_size, int64_t seq_len);
  ~LlamaModel();
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  const LlamaConfig& config() const { return config_; }
  const ParameterTable& table() const { return table_; }
  int64_t batch_size() const { return B_; }
  int64_t seq_len() const { return T_; }
  size_t activation_bytes() const;

  // tokens, targets (B,T); targets -1 are ignored. Keeps what the backward pass needs.
  // Returns the sum of the per-token losses (double, fixed order) and sets *valid_tokens.
  double Forward(const float* weights, const int32_t* tokens, const int32_t* targets,
                 int64_t* valid_tokens);
  // Logits (B*T, V) of the last Forward (valid until Backward, which overwrites them).
  const float* logits() const;
  // Per-token losses (B*T) of the last Forward.
  const float* losses() const;
  // Gradient of loss_scale * (sum of losses of the last Forward), written over `grads`.
  void Backward(const float* weights, float* grads, float loss_scale);
  // The same, reaching parameters and gradients unit by unit through `access`.
  double Forward(ParameterAccess& access, const int32_t* tokens, const int32_t* targets,
                 int64_t* valid_tokens);
  void Backward(ParameterAccess& access, float loss_scale);

 private:
  struct Buffers;
  LlamaConfig config_;
  ParameterTable table_;
  // Unit-relative offsets of the tensors (every decoder layer has the same layout).
  struct LayerOffsets {
    size_t ln1 = 0, q = 0, k = 0, v = 0, o = 0, ln2 = 0, gate = 0, up = 0, down = 0;
  };
  struct P {
    size_t embed = 0, final_norm = 0, head = 0;
    LayerOffsets layer;
  };
  P params_;
  int64_t B_, T_;
  Buffers* buffers_;
};

}  // namespace crucible
