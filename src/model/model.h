// The model interface: everything the trainer, eval, checkpoints, export and the CLI know of a
// model. A model family implements two classes and registers itself under its [model] name:
//
//   ModelSpec  the model a run config describes, resolved but not built: its sizes, FLOPs,
//              initial weights, weights-file metadata and Hugging Face mapping. Building one
//              allocates nothing proportional to the model, so the memory plan can ask an absurd
//              config what it would need before anything is allocated.
//   Model      the model built for micro-batches of (batch_size, seq_len): its parameter table
//              and activation buffers (planned once; a step allocates nothing), forward and
//              backward through a ParameterAccess.
//
// A family's .cc file registers it with one line, as the CLI commands are registered:
//
//   ModelRegistrar llama_registrar("llama", BuildLlamaSpec, {"llama", "LlamaForCausalLM", ...});
//
// and `[model] name = "llama"` selects it (docs/architecture.md, "How to add a model").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "common/config.h"
#include "compute/backend.h"
#include "model/parallelism.h"
#include "model/parameters.h"

namespace crucible {

// What a forward pass adds up over its micro-batch, over the positions i whose target is not
// ignored (target >= 0), in double and in position order: the loss sum of w_i * l_i (l_i the
// cross-entropy of position i, w_i its loss weight) and the weight sum of w_i (their count when
// the weights are omitted).
struct LossSum {
  double loss = 0;
  double weight = 0;
  // The auxiliary losses of the forward (a MoE's sequence-wise balance loss), summed, in the
  // units of `loss`: the trainer's objective is (loss + aux) / (the global weight sum), its
  // gradient what Backward writes. Reported apart from the loss (metrics' aux_loss), which stays
  // the cross-entropy that eval and a dense model report. 0 for a model without one.
  double aux = 0;
};

// How a Forward ends. kLogits keeps the whole (B*T, V) logits: logits(), Retarget and a Backward
// with any loss scale may follow (`crucible model`, SophiaG's sampled targets). kFused is
// the training forward: the head and the cross-entropy run over chunks of token rows, each
// chunk's backward at once with `loss_scale` (Liger-kernel style, nothing recomputed), so the
// whole logits never exist and the head's weight gradient is written during Forward, through
// ParameterAccess::Gradients of its unit (GradientsReady waits for Backward). The Backward that
// follows must get the same loss scale; logits() and Retarget are refused (internal error).
// kScored is the scorer's forward (eval, validation): the same chunks, the losses and each
// position's argmax (predictions()) and no backward; logits(), Retarget and Backward are refused.
// A model may serve kFused or kScored as kLogits (its whole head in Backward; predictions() then
// returns nullptr and the caller reads logits()): the results are the same.
struct ForwardOptions {
  enum class Head { kLogits, kFused, kScored };
  Head head = Head::kLogits;
  float loss_scale = 0;  // kFused: what the following Backward will be given
  // Packed documents (SFT packing, data/token_source.h): (B,T) host positions of each input
  // token in its document, 0 where a document starts; attention stays inside each document and
  // RoPE counts from its start. nullptr: each row is one document (positions 0..T-1). Read
  // again by Backward, so it must stay valid and unchanged until then.
  const int32_t* positions = nullptr;
  // The rows' length for this Forward and the Backward that follows: 0 (the built seq_len), or
  // 1..seq_len, the tokens, targets, loss weights and positions then (B, seq_len) contiguous and
  // the model computes only those positions (a StepBatches whose rows are shorter than
  // training.seq_len: GRPO's micro-batches, Batch::micro_lengths). Without tensor or expert
  // parallelism only (an internal error).
  int64_t seq_len = 0;

  static ForwardOptions Logits() { return {}; }
  static ForwardOptions Fused(float loss_scale) { return {Head::kFused, loss_scale, nullptr}; }
  static ForwardOptions Scored() { return {Head::kScored, 0, nullptr}; }
};

// A mixture of experts' routing in one Forward: how many token slots each expert of a routed
// layer received (a token sent to K experts fills K slots).
struct ExpertLoad {
  int layer = -1;
  std::vector<int64_t> tokens;  // per expert
};

class Model {
 public:
  virtual ~Model() = default;

  virtual const ParameterTable& table() const = 0;
  virtual int64_t batch_size() const = 0;
  virtual int64_t seq_len() const = 0;
  // The activation buffers of one micro-batch (ModelSpec::PlannedBuffers().activation_bytes,
  // plus whole_logits_bytes once a kLogits Forward has run).
  virtual size_t activation_bytes() const = 0;

  // tokens, targets, loss_weights (B,T); a target -1 is ignored. loss_weights nullptr weighs
  // every position 1 (pre-training); SFT masks and RL objectives pass their own (any finite
  // value). Keeps what Backward needs; `loss_weights` is read again by Backward, so it must stay
  // valid and unchanged until then. `options`: how it ends (above).
  virtual LossSum Forward(ParameterAccess& access, const int32_t* tokens, const int32_t* targets,
                          const float* loss_weights, const ForwardOptions& options) = 0;
  // Logits (B*T, vocab) of the last kLogits Forward, valid until Backward (which overwrites
  // them).
  virtual const float* logits() const = 0;
  // Per-position cross-entropies l_i (B*T) of the last Forward, unweighted; 0 where ignored.
  virtual const float* losses() const = 0;
  // After a kScored Forward: per position (B*T), the index of its largest logit (the first of
  // equal ones, as std::max_element finds it), -1 where the target is ignored. nullptr from a
  // model that served kScored as kLogits (the default): read logits().
  virtual const int32_t* predictions() const { return nullptr; }
  // Replaces the targets of the last kLogits Forward (before its Backward): the next Backward is
  // the gradient against `targets` (B,T; -1 ignored), with the same loss weights; returns their
  // loss sum. For a Hessian pass against targets sampled from logits()
  // (train/sampled_targets.h). A model without it refuses an optimizer that needs it (the
  // default: an error naming it).
  virtual LossSum Retarget(const int32_t* targets);
  // Replaces the loss weights of the last kLogits Forward (before its Backward): the next
  // Backward is the gradient with `loss_weights` (B,T; the same contract as Forward's), against
  // the same targets; returns their loss sum (aux: the forward's). For an objective whose
  // weights are computed from the forward's own log-probabilities (StepBatches::
  // WeightsFromForward, GRPO). The default: an internal error (every family has it).
  virtual LossSum Reweight(const float* loss_weights);
  // The gradient of loss_scale * (the loss sum of the last Forward), written over every unit's
  // gradient through `access`.
  virtual void Backward(ParameterAccess& access, float loss_scale) = 0;
  // The routing of the last Forward, per routed layer in layer order; empty for a model without
  // routed experts (the default). The trainer adds them over a step's micro-batches and its
  // data-parallel ranks (train/expert_load.h: metrics and the dead-expert detector).
  virtual std::vector<ExpertLoad> ExpertLoads() const { return {}; }
};

// A model's inference path: prefill and decode with a KV cache, the same weights and kernels as
// its Model (ModelSpec::StartInference builds one). It holds `slots` sequence slots, each with a
// KV cache of `max_len` positions (per slot: layers x max_len x one position's keys and values,
// laid out as the family states; allocated once), and scratch for a prefill of up to max_len
// tokens; a call allocates nothing.
//
// Batch invariance: a sequence's logits are the same bits whichever slots share its Decode call
// and however many threads run it. Prefill runs one sequence's prompt alone (its products are the
// training GEMMs over its own rows); Decode's products and attention are ComputeBackend's
// MatmulRows and DecodeAttention, whose rows do not depend on each other. Prefill and Decode of
// the same position agree with Model::Forward to float tolerance, not bit for bit.
class InferenceModel {
 public:
  virtual ~InferenceModel() = default;
  virtual int64_t slots() const = 0;
  virtual int64_t max_len() const = 0;  // positions per slot
  virtual int64_t vocab_size() const = 0;
  // The KV cache of all slots, and everything else it allocated (scratch, position tables).
  virtual size_t kv_cache_bytes() const = 0;
  virtual size_t scratch_bytes() const = 0;
  // Its own copy of the weights (model/inference_weights.h).
  virtual size_t weight_bytes() const = 0;
  // Positions held in `slot`'s cache.
  virtual int64_t length(int64_t slot) const = 0;
  // Runs `count` (>= 1) tokens of an empty slot from position 0, keeps their keys and values, and
  // writes the last position's logits (vocab_size floats, host). Error naming the slot and the
  // limit when count > max_len; an internal error when the slot is not empty.
  virtual void Prefill(int64_t slot, const int32_t* tokens, int64_t count, float* logits) = 0;
  // One token for each of `n` distinct slots (each holding >= 1 position), at the next position
  // of each: appends their keys and values and writes logits (n, vocab_size) (host). Error naming
  // the slot and the limit when a slot is full (length == max_len).
  virtual void Decode(const int64_t* slots, const int32_t* tokens, int64_t n, float* logits) = 0;
  // Makes the empty slot `to` a copy of the non-empty slot `from`: the same length, and the same
  // bits of keys and values at each of its positions, so that a Decode of `to` gives the bits a
  // Decode of `from` would (what a prefill of the same prompt into `to` would have left: the
  // engine's shared prompt prefill). Internal errors for a slot outside [0, slots), from == to,
  // an empty `from` or a non-empty `to`.
  virtual void CopySlot(int64_t from, int64_t to) = 0;
  // Empties `slot` (its cache is overwritten by the next Prefill).
  virtual void Free(int64_t slot) = 0;
};

// Parameter counts a config asks for, in double so that no config can overflow them: exactly
// the unit sizes of the table ModelSpec::BuildTable() lays out.
struct ParameterSizes {
  double parameters = 0;          // the whole table
  double first_unit = 0;          // unit 0 (a decoder's embedding)
  double largest_unit = 0;        // of all units
  double largest_other_unit = 0;  // of all units but the first
  double tensors = 0;             // how many tensors the table holds
  // The elements and the tensors of each ParamKind (indexed by its value): what an optimizer
  // state carried by some kinds only (optim/optimizer.h) takes.
  std::array<double, kParamKindCount> kind_parameters{}, kind_tensors{};
  // The parameters one token uses: `parameters` for a dense model, a mixture of experts' own
  // experts only (0: not stated, read as `parameters`).
  double active = 0;
  // The routed experts' elements of the unit that holds the most (0 without experts): what
  // ZeRO-3 keeps of the other ranks' contributions under expert parallelism.
  double largest_expert_block = 0;
};

// Bytes Build(batch_size, seq_len) allocates, in double.
struct BufferSizes {
  double activation_bytes = 0;  // exactly Model::activation_bytes() of a model just built
  double total_bytes = 0;       // everything: activations, scratch, tables, copies of the inputs
  // What the first kLogits Forward allocates besides (the whole logits); the training forward
  // (kFused) never does, so a run plans it only when its optimizer samples targets.
  double whole_logits_bytes = 0;
};

// How a model is written as a Hugging Face transformers folder and read back from one. Data
// only: ckpt/hf.cc reads and writes the files (src/model does no file I/O).
class HfMapping {
 public:
  virtual ~HfMapping() = default;
  // The transformers class, e.g. "LlamaForCausalLM".
  virtual std::string architecture() const = 0;
  // config.json of this model: its own keys, with max_position_embeddings and the tokenizer's
  // BOS and EOS ids (null when it has none) where transformers expects them.
  virtual nlohmann::ordered_json ConfigJson(int64_t max_position_embeddings,
                                            const nlohmann::json& bos_token_id,
                                            const nlohmann::json& eos_token_id) const = 0;
  // How `config` (the config.json at `path`, whose model_type names this model) differs from
  // this model: one "theirs vs ours" entry per key ("hidden_size=256 vs model.dim=128"), empty
  // when it describes this model. DataError naming `path` and the key when it describes what
  // the model cannot reproduce exactly.
  virtual std::vector<std::string> Differences(const nlohmann::json& config,
                                               const std::string& path) const = 0;
  // The transformers name of a tensor of the table.
  virtual std::string TensorName(const ParamInfo& tensor) const = 0;
  // Turns `values` (the tensor as the folder whose config.json is `config` stores it) into this
  // model's layout, in place; the default keeps them. What a family whose layout depends on a
  // config key overrides (DeepSeek-V3's interleaved RoPE rows). An export is written in the
  // layout this model reads back unchanged.
  virtual void FromHf(const nlohmann::json& /*config*/, const ParamInfo& /*tensor*/,
                      float* /*values*/) const {}
};

class ModelSpec {
 public:
  virtual ~ModelSpec() = default;

  // ---- what it is ----
  virtual std::string name() const = 0;  // the [model] name it is registered under
  virtual int64_t vocab_size() const = 0;
  // key=value pairs for the phase=start line, e.g. "flavor=debug layers=2 dim=128 vocab=2048".
  virtual std::string Summary() const = 0;
  // The [model] keys that set its size, for messages, e.g. "model.vocab_size = 2048, ...".
  virtual std::string SizeKeys() const = 0;
  // The shape recorded in a weights file's __metadata__ ("crucible.<key>" -> value).
  virtual std::map<std::string, std::string> WeightsMetadata() const = 0;
  // Whether its forward adds an auxiliary loss (LossSum::aux): the trainer then reports it.
  virtual bool has_aux_loss() const { return false; }

  // ---- planned before anything is allocated ----
  // Of this rank's table under `parallelism` (BuildTable(parallelism)); the whole model's without.
  virtual ParameterSizes PlannedSizes(const ModelParallelism& parallelism) const = 0;
  ParameterSizes PlannedSizes() const { return PlannedSizes(ModelParallelism{}); }
  // Of the model Build(batch_size, seq_len, backend, parallelism) makes (this rank's part).
  virtual BufferSizes PlannedBuffers(double batch_size, double seq_len,
                                     const ModelParallelism& parallelism) const = 0;
  BufferSizes PlannedBuffers(double batch_size, double seq_len) const {
    return PlannedBuffers(batch_size, seq_len, ModelParallelism{});
  }

  // ---- the parameters ----
  // The table of the parts `parallelism` gives this rank (the tensors of a tensor-parallel
  // model cut as its layers need them, ParamInfo's split); the whole model without it.
  virtual ParameterTable BuildTable(const ModelParallelism& parallelism) const = 0;
  ParameterTable BuildTable() const { return BuildTable(ModelParallelism{}); }
  // What `parallelism` cannot cut of this model, naming its keys and the rule ("" when it can).
  virtual std::string CheckParallelism(const ModelParallelism& parallelism) const {
    if (parallelism.ep_degree > 1) return name() + " has no experts to split";
    return parallelism.tp_chunks > 1 ? name() + " has no tensor-parallel layers" : "";
  }
  // The initial values of flat elements [begin, end) of `table` (a BuildTable's), written to
  // out[0, end - begin): a pure function of (seed, tensor, element of the whole tensor), so a
  // ZeRO-3 rank initialises its shard alone, and a tensor-parallel rank its part, and each gets
  // the bits of a full initialisation.
  virtual void InitWeights(const ParameterTable& table, uint64_t seed, size_t begin, size_t end,
                           float* out) const = 0;
  // Floating-point operations per trained token, forward and backward (what MFU divides by).
  virtual double TrainFlopsPerToken(const ParameterTable& table, int64_t seq_len) const = 0;

  // ---- the model ----
  // Its activations in `backend`'s memory, run by its kernels (compute/backend.h).
  // Split over ranks as `parallelism` says (its table is BuildTable(parallelism)'s).
  virtual std::unique_ptr<Model> Build(int64_t batch_size, int64_t seq_len,
                                       std::shared_ptr<ComputeBackend> backend,
                                       const ModelParallelism& parallelism) const = 0;
  std::unique_ptr<Model> Build(int64_t batch_size, int64_t seq_len,
                               std::shared_ptr<ComputeBackend> backend) const {
    return Build(batch_size, seq_len, std::move(backend), ModelParallelism{});
  }
  // On the fp32 CPU backend.
  std::unique_ptr<Model> Build(int64_t batch_size, int64_t seq_len) const {
    return Build(batch_size, seq_len, DefaultCpuBackend());
  }

  // Its inference path over the weights `access` gives (copied once: model/inference_weights.h,
  // with its matrices in `weight_type`), `slots` sequences of up to `max_len` positions, on
  // `backend`. The default: UsageError saying the family has none.
  virtual std::unique_ptr<InferenceModel> StartInference(
      ParameterAccess& access, int64_t slots, int64_t max_len,
      std::shared_ptr<ComputeBackend> backend, WeightType weight_type = WeightType::kF32) const;
  // The bytes of its KV cache (InferenceModel::kv_cache_bytes()), in double; 0 without one.
  virtual double PlannedKvCacheBytes(double /*slots*/, double /*max_len*/) const { return 0; }

  // Its Hugging Face form; nullptr when it has none (export and initial_load_hf refuse it).
  virtual const HfMapping* hf() const { return nullptr; }
};

// ---- the registry ----

// Resolves [model] (presets, then explicit keys), validates it (UsageError naming the key) and
// writes the resolved values back into `config`, so the run directory records them.
using ModelSpecBuilder = std::shared_ptr<const ModelSpec> (*)(Config& config);
// The spec a Hugging Face config.json describes (`path` for messages); DataError naming the
// file and key when it is malformed or describes what the model cannot reproduce exactly.
using HfConfigReader = std::shared_ptr<const ModelSpec> (*)(const nlohmann::json& config,
                                                            const std::string& path);
// A family's Hugging Face identity; all null when it has none.
struct HfFamily {
  const char* model_type = nullptr;    // config.json "model_type", e.g. "llama"
  const char* architecture = nullptr;  // e.g. "LlamaForCausalLM"
  HfConfigReader read = nullptr;
};

// A static instance in a model family's .cc file registers it. Two registrations of one name
// end the program at start-up. `own_keys`: the [model] keys that only this family reads; a run
// of another family that sets one to a value other than its default is refused in one line
// (BuildModelSpec; a recorded config.toml holds every key, at its default when unused).
struct ModelRegistrar {
  ModelRegistrar(const char* name, ModelSpecBuilder build, HfFamily hf = {},
                 std::vector<const char*> own_keys = {});
};

// The names registered, sorted.
std::vector<std::string> RegisteredModels();
// The model `config`'s [model] name selects, built by its family (UsageError listing the
// registered names when none has that name, or naming a key of another family that is set).
std::shared_ptr<const ModelSpec> BuildModelSpec(Config& config);
// The [model] name of the family whose model_type the Hugging Face `config` (at `path`) names;
// without a model_type, the default [model] name's. DataError naming the file and the model
// types crucible reads otherwise.
std::string ModelNameForHfConfig(const nlohmann::json& config, const std::string& path);
// The spec that family reads from `config`.
std::shared_ptr<const ModelSpec> ModelSpecFromHfConfig(const nlohmann::json& config,
                                                       const std::string& path);

}  // namespace crucible
