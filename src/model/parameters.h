// The parameters of a model, as every module outside the model sees them: a table of named
// tensors laid out in one flat float buffer, grouped into units, and the interface through which
// the model reaches a unit's weights and hands back its gradient. Weights, gradients and
// optimizer state all mirror this layout, so checkpointing, reduction, sharding and hashing work
// on one span. Nothing here knows which model built the table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace crucible {

// What a tensor is to the optimizer and the initialiser: the input embedding, a norm's scale, a
// hidden matrix (attention and MLP projections; kOutputProjection are those that write into the
// residual stream), the output head, or a balance bias: a tensor no optimizer trains, steered by
// what the model writes in its gradient slot instead (a mixture of experts' per-expert routing
// bias, whose "gradient" is each expert's load above the mean): every optimizer leaves it to the
// sign rule of optim/balance_bias.h, and it counts in neither the gradient norm nor clipping.
// Initialised to 0.
enum class ParamKind { kEmbedding, kNorm, kLinear, kOutputProjection, kHead, kBalanceBias };
inline constexpr size_t kParamKindCount = 6;

// How a tensor is cut over the ranks of a tensor-parallel group: this rank holds part `part` of
// `parts` equal parts along dimension `dim` of the whole tensor. dim -1: the whole tensor, on
// every rank of the group (replicated). `chunks`: the whole dimension is computed in that many
// equal chunks at every degree (model/parallelism.h, tp_chunks), so a part holds chunks / parts
// of them; recorded even for one part.
struct TensorSplit {
  int dim = -1;
  int64_t parts = 1, part = 0;
  int64_t chunks = 1;
};

struct ParamInfo {
  std::string name;            // e.g. model.layers.0.self_attn.q_proj.weight (Llama: HF names)
  std::vector<int64_t> shape;  // this rank's part, e.g. {out_features, in_features}
  size_t offset = 0;           // into the flat buffer, in floats
  size_t numel = 0;
  ParamKind kind = ParamKind::kLinear;
  int layer = -1;  // decoder layer, -1 for tensors outside the layers
  // The whole tensor this is a part of (tensor parallelism): its shape, the dimension it is cut
  // along (-1: not cut, global_shape == shape) and where this part starts along it.
  std::vector<int64_t> global_shape;
  int split_dim = -1;
  int64_t slice_begin = 0;
  // The dimension tensor parallelism cuts into `chunks` chunks whatever the degree (-1 and 1:
  // not cut; set at degree 1 too).
  int chunk_dim = -1;
  int64_t chunks = 1;
  // A routed expert's tensor: the expert's index (-1: not an expert's). Under expert parallelism
  // its gradient also takes contributions computed on another rank's tokens
  // (ParameterAccess::AddGradient), so the exact sum's grid starts at it (LayoutFreeRuns).
  int expert = -1;
  // Its index in the whole model's table: a rank's table may leave out tensors another rank
  // holds (expert parallelism: the other ranks' experts; ParameterTable::Skip).
  size_t whole_index = 0;

  bool sliced() const { return split_dim >= 0; }
  // The length of the runs of consecutive elements of this part that lie in one chunk (the same
  // elements of the whole tensor at every degree): numel when the tensor is not cut in chunks.
  size_t ChunkRun() const;
  size_t global_numel() const;
  // The row-major index in the whole tensor of element `local` of this part.
  size_t GlobalIndex(size_t local) const;
};

// A contiguous range [begin, end) of the flat buffer that the model uses as a whole (for a
// decoder: the embedding, each layer, the tail). ZeRO-3 gathers parameters and data parallelism
// reduces gradients unit by unit. Units may differ in layout.
struct ParamUnit {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
};

// Flat elements [begin, end) in consecutive pieces of `piece` elements (the last one may be
// shorter), each of which holds the same elements of the whole model in every layout the run
// can take.
struct LayoutFreeRun {
  size_t begin = 0, end = 0, piece = 0;
};

class ParameterTable {
 public:
  // Appends a tensor to the unit being built, right after the previous tensor. `in_flops`: the
  // tensor's parameters count in FlopParams() (false for a lookup table such as an untied input
  // embedding).
  // `shape` is the whole tensor's; `split` cuts it (each part along split.dim must divide
  // evenly; the caller checks the config first, this throws an internal error).
  const ParamInfo& Add(const std::string& name, std::vector<int64_t> shape, ParamKind kind,
                       int layer, bool in_flops = true, TensorSplit split = {});
  // Closes the unit being built: every tensor added since the previous EndUnit().
  void EndUnit();
  // The tensors added from now on belong to routed expert `expert` (ParamInfo::expert); -1 ends
  // the expert's tensors.
  void SetExpert(int expert) { expert_ = expert; }
  // A tensor of the whole model that this table leaves out (another rank holds it): counted in
  // the tensors' whole_index, taking no place here.
  void Skip() { ++whole_count_; }

  const std::vector<ParamInfo>& params() const { return params_; }
  const std::vector<ParamUnit>& units() const { return units_; }
  int tail_unit() const { return static_cast<int>(units_.size()) - 1; }
  size_t max_unit_size() const;
  size_t total() const { return total_; }
  const ParamInfo& Find(const std::string& name) const;  // throws if absent
  // Where tensor `name` starts inside unit `unit` (an internal error when it is not inside it).
  size_t OffsetInUnit(const std::string& name, size_t unit) const;
  const ParamInfo* TryFind(const std::string& name) const;
  // Parameters counted for FLOPs (6 N per token for forward and backward), of the whole
  // tensors: the model's, whatever part of it this table holds.
  size_t FlopParams() const { return flop_params_; }
  // True when some tensor is a part of a whole one (tensor parallelism).
  bool sliced() const;
  // True when this is a rank's part of the whole model: a tensor is sliced, or left out.
  bool partial() const { return whole_count_ != params_.size() || sliced(); }
  // True when some tensor is cut in tensor-parallel chunks (at any degree, 1 included).
  bool chunked() const;
  // True when some tensor is a routed expert's (ParamInfo::expert).
  bool has_experts() const;
  // The runs of `unit` whose pieces are laid out alike at every degree of the run's tensor
  // parallelism (and every data-parallel degree, which does not change the table): when a
  // tensor is cut in chunks, each tensor in pieces of its ChunkRun(); else the unit's
  // consecutive tensors that are not an expert's as one run, and each expert tensor as its own
  // run (expert parallelism adds an expert's contributions by themselves, and the grid of each
  // contribution must not reach into its neighbours). What the blocks of the exact gradient
  // sum's grid are aligned to (distributed/exact_sum.h).
  std::vector<LayoutFreeRun> LayoutFreeRuns(int unit) const;

 private:
  std::vector<ParamInfo> params_;
  std::vector<ParamUnit> units_;
  size_t total_ = 0;
  size_t unit_begin_ = 0;
  int expert_ = -1;
  size_t whole_count_ = 0;  // tensors of the whole model so far, held or skipped
  size_t flop_params_ = 0;
};

// Between a table of parts (`parts`, a tensor- or expert-parallel rank's) and the table of the
// whole model (`whole`: every tensor, unsplit; `parts` holds some of them, in the same order, each
// whole or cut): each part's elements are copied to or from their places in the whole tensor.
// Throws an internal error when the tables do not match.
void CopyPartsToWhole(const ParameterTable& parts, const float* part_values,
                      const ParameterTable& whole, float* whole_values);
// The runs of elements that are contiguous in both: for each, fn(tensor index in `parts`, its
// index in `whole`, first element of the part, first element of the whole tensor, count). What the
// copies above (and the copies of an optimizer state laid out tensor by tensor) are made of.
template <typename Fn>
void ForEachPartRun(const ParameterTable& parts, const ParameterTable& whole, Fn fn);
void CopyWholeToParts(const ParameterTable& whole, const float* whole_values,
                      const ParameterTable& parts, float* part_values);

// How the model reaches its parameters and hands back gradients, one unit at a time. Within
// unit u, flat element i (u.begin <= i < u.end) is at AcquireWeights(u)[i - u.begin], and its
// gradient at Gradients(u)[i - u.begin]. One replicated buffer serves a single process; ZeRO-3
// gathers each unit from the ranks' shards when it is acquired, and data parallelism starts
// reducing a unit's gradient as soon as it is ready, while the backward pass goes on with the
// units below it. What ZeRO-3 can hold at once: three acquired units (its gather buffers), and
// two open gradients, unit 0's (a decoder's embedding, written again by a tied head) and one
// other unit's. A unit's gradient may open during Forward (the fused head writes its weight
// gradient there, model.h ForwardOptions) and stay open until Backward makes it ready: nothing
// but the model touches an open gradient.
class ParameterAccess {
 public:
  virtual ~ParameterAccess() = default;
  virtual const float* AcquireWeights(int unit) = 0;
  virtual void ReleaseWeights(int /*unit*/) {}
  // A hint that `unit` is needed next (ZeRO-3 starts its gather).
  virtual void Prefetch(int /*unit*/) {}
  // Where the unit's gradient goes; the model writes every element of the unit before it calls
  // GradientsReady(unit) for this micro-batch.
  virtual float* Gradients(int unit) = 0;
  virtual void GradientsReady(int /*unit*/) {}
  // Another contribution of this micro-batch to flat elements [begin, end) of `unit`'s gradient,
  // before GradientsReady(unit): summed exactly with the one in Gradients(unit), each put on the
  // exact sum's grid by itself, as if another rank's micro-batch had computed it. Expert
  // parallelism's owner of an expert adds the expert's gradient from each other rank's tokens
  // this way. [begin, end) is a whole number of LayoutFreeRuns (expert tensors); `values` may be
  // overwritten. Layouts without it (one process) throw an internal error.
  virtual void AddGradient(int unit, size_t begin, size_t end, float* values);
};

// A single process's access: every unit is a view into one flat buffer of weights and one of
// gradients (both in table layout; `grads` may be nullptr when only Forward is called).
class FlatParameterAccess : public ParameterAccess {
 public:
  FlatParameterAccess(const ParameterTable& table, const float* weights, float* grads)
      : table_(table), weights_(weights), grads_(grads) {}
  const float* AcquireWeights(int unit) override { return weights_ + table_.units()[unit].begin; }
  float* Gradients(int unit) override { return grads_ + table_.units()[unit].begin; }

 private:
  const ParameterTable& table_;
  const float* weights_;
  float* grads_;
};

// ---- implementation ----

// Checks that `parts` is `whole` cut (internal error otherwise).
void CheckPartsOfWhole(const ParameterTable& parts, const ParameterTable& whole);

template <typename Fn>
void ForEachPartRun(const ParameterTable& parts, const ParameterTable& whole, Fn fn) {
  CheckPartsOfWhole(parts, whole);
  for (size_t t = 0; t < parts.params().size(); ++t) {
    const ParamInfo& p = parts.params()[t];
    if (!p.sliced()) {
      fn(t, p.whole_index, size_t{0}, size_t{0}, p.numel);
      continue;
    }
    // Runs of contiguous elements: the split dimension and everything inside it.
    size_t inner = 1;
    for (size_t d = static_cast<size_t>(p.split_dim); d < p.shape.size(); ++d)
      inner *= static_cast<size_t>(p.shape[d]);
    for (size_t local = 0; local < p.numel; local += inner)
      fn(t, p.whole_index, local, p.GlobalIndex(local), inner);
  }
}

}  // namespace crucible
