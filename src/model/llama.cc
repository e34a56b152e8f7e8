// Forward and backward of the Llama decoder over one micro-batch.
#include "model/llama.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "common/error.h"
#include "common/strings.h"
#include "compute/backend.h"
#include "kernels/cpu/kernels.h"

namespace crucible {

namespace k = kernels;

// Activations of one micro-batch, planned once, in the backend's memory. N = B*T rows.
struct LlamaModel::Buffers {
  using Floats = DeviceArray<float>;
  // n: the rows this rank holds of the residual stream and the norms (N, or N / tp_degree under
  // sequence parallelism).
  struct Layer {
    Floats x_in;              // (n,C) residual stream entering the layer
    Floats ln1, ln1_rstd;     // (n,C), (n)
    Floats q, k, v;           // (N,H*D), (N,KV*D) x2, after RoPE
    Floats att_lse;           // (B,H,T) log-sum-exp of each attention row
    Floats att;               // (N,H*D) attention output before o_proj
    Floats x_mid;             // (n,C) residual after attention
    Floats ln2, ln2_rstd;     // (n,C), (n)
    Floats gate, up, hidden;  // (N,F) each
  };
  std::vector<Layer> layers;
  Floats x_final;                        // (n,C) residual leaving the last layer
  Floats lnf, lnf_rstd;                  // (n,C), (n)
  Floats logits;                         // (N,V), reused for dlogits; at the first kLogits Forward
  Floats head_chunk;                     // (FusedHeadRows, V): the fused head's logits, dlogits
  Floats losses, lse;                    // (N)
  std::unique_ptr<RopePositions> rope;   // (T,D/2) tables; packed rows (model/decoder_common.h)
  DeviceArray<int32_t> tokens, targets;  // (N)
  Floats loss_weights;                   // (N), a device copy (off the host only)
  // Backward scratch: dx (n,C), dln (n,C) under sequence parallelism, else (N,C).
  Floats dx, dln, dq, dk, dv, datt, dgate, dup, dhidden;
  // Sequence parallelism: all rows (N,C) of a norm's output gathered for a column-parallel
  // product (forward, and again in backward) or of a row-parallel product's partial sum, and of
  // dx gathered for a row-parallel product's backward or of a column-parallel one's input
  // gradient before its reduce-scatter.
  Floats full, dx_full;
  // The row chunks' norm weight-gradients after the first (tp_chunks > 1: their count - 1, x C).
  Floats norm_partials;
  // More than one chunk per rank (model/parallelism.h): the partial results of the other chunks
  // of a sum over a split dimension (chunks - 1 of (N,C)), and the fused head's per-chunk row
  // maxima, exp-sums and target logits (chunks x FusedHeadRows each) with the row maxima of the
  // whole vocabulary.
  Floats partials, vocab_max, vocab_sum, vocab_target, row_max;
  // Tensor parallelism: the host's copy of the tokens (the embedding's owner of each row) and the
  // host scratch of the vocabulary's combine.
  std::vector<float> host_rows;
  std::vector<float> host_max, host_sum, host_target, host_lse, host_losses_part, host_best;
  // On the host, copies of what callers read: the targets (always), the losses and the logits
  // (off the host only; the logits copied when asked for).
  std::vector<int32_t> host_targets;
  std::vector<float> host_losses, host_logits;
  bool host_logits_current = false;
  // kScored: each position's argmax (N), and off the host a chunk of logits copied to read it.
  std::vector<int32_t> predictions;
  std::vector<float> host_chunk;
};

LlamaModel::LlamaModel(const LlamaConfig& config, int64_t batch_size, int64_t seq_len,
                       std::shared_ptr<ComputeBackend> backend, const ModelParallelism& parallelism)
    : config_(config),
      parallelism_(parallelism),
      table_(LlamaParameterTable(config, parallelism)),
      B_(batch_size),
      T_(seq_len),
      T_max_(seq_len),
      backend_(std::move(backend)),
      buffers_(new Buffers) {
  tp_ = std::make_unique<TensorParallelOps>(parallelism, *backend_);
  const int64_t chunks = parallelism.tp_chunks;
  chunks_ = parallelism.chunks_per_rank();
  sp_ = parallelism.sequence_parallel;
  rows_ = sp_ ? batch_size * seq_len / parallelism.tp_degree : batch_size * seq_len;
  row_first_ = sp_ ? parallelism.tp_rank * rows_ : 0;
  if (sp_ && (batch_size * seq_len) % chunks != 0)
    throw Error(kExitFailure, "internal: sequence parallelism over rows that do not split into " +
                                  std::to_string(chunks) + " chunks");
  Hc_ = config.n_heads / chunks;
  KVc_ = config.n_kv_heads / chunks;
  Fc_ = config.ffn_hidden_dim / chunks;
  Vc_ = config.vocab_size / chunks;
  // This rank's widths: its chunks of heads, KV heads, the FFN and the vocabulary.
  const int64_t N = B_ * T_, C = config.dim, H = Hc_ * chunks_, KV = KVc_ * chunks_;
  const int64_t D = config.head_dim(), F = Fc_ * chunks_, V = Vc_ * chunks_, n = rows_;
  ComputeBackend& be = *backend_;
  Buffers& b = *buffers_;
  auto floats = [&](int64_t n) { return Buffers::Floats(be, static_cast<size_t>(n)); };
  b.layers.resize(config.n_layers);
  for (auto& layer : b.layers) {
    layer.x_in = floats(n * C);
    layer.ln1 = floats(n * C);
    layer.ln1_rstd = floats(n);
    layer.q = floats(N * H * D);
    layer.k = floats(N * KV * D);
    layer.v = floats(N * KV * D);
    layer.att_lse = floats(B_ * H * T_);
    layer.att = floats(N * H * D);
    layer.x_mid = floats(n * C);
    layer.ln2 = floats(n * C);
    layer.ln2_rstd = floats(n);
    layer.gate = floats(N * F);
    layer.up = floats(N * F);
    layer.hidden = floats(N * F);
  }
  b.x_final = floats(n * C);
  b.lnf = floats(n * C);
  b.lnf_rstd = floats(n);
  b.head_chunk = floats(FusedHeadRows(N, config.vocab_size) * V);
  b.losses = floats(N);
  b.lse = floats(N);
  b.rope = std::make_unique<RopePositions>(be, B_, T_, D, config.rope_theta);
  b.tokens = DeviceArray<int32_t>(be, N);
  b.targets = DeviceArray<int32_t>(be, N);
  b.host_targets.resize(N);
  b.dx = floats(n * C);
  b.dln = floats((sp_ ? n : N) * C);
  if (sp_) {
    b.full = floats(N * C);
    b.dx_full = floats(N * C);
  }
  if (chunks > 1) b.norm_partials = floats(((sp_ ? chunks_ : chunks) - 1) * C);
  head_rows_ = sp_ ? b.full.data() : b.lnf.data();
  b.dq = floats(N * H * D);
  b.dk = floats(N * KV * D);
  b.dv = floats(N * KV * D);
  b.datt = floats(N * H * D);
  b.dgate = floats(N * F);
  b.dup = floats(N * F);
  b.dhidden = floats(N * F);
  const int64_t rows = FusedHeadRows(N, config.vocab_size);
  if (chunks_ > 1) b.partials = floats((chunks_ - 1) * N * C);
  if (chunks > 1) {
    b.vocab_max = floats(chunks_ * rows);
    b.vocab_sum = floats(chunks_ * rows);
    b.vocab_target = floats(chunks_ * rows);
    b.row_max = floats(rows);
  }
  if (!be.host_memory()) {
    b.loss_weights = floats(N);
    b.host_losses.resize(N);
  }
  units_ = std::make_unique<UnitMemory>(table_, be);

  const LlamaTensorOffsets offsets = FindLlamaTensors(table_, config);
  embed_ = offsets.embed;
  final_norm_ = offsets.final_norm;
  head_ = offsets.head;
  layers_ = offsets.layers;
}

LlamaTensorOffsets FindLlamaTensors(const ParameterTable& table, const LlamaConfig& config) {
  auto in_unit = [&](const std::string& name, size_t unit) {
    return table.OffsetInUnit(name, unit);
  };
  LlamaTensorOffsets offsets;
  const size_t tail = static_cast<size_t>(table.tail_unit());
  offsets.embed = in_unit("model.embed_tokens.weight", 0);
  offsets.final_norm = in_unit("model.norm.weight", tail);
  if (!config.tie_embeddings) offsets.head = in_unit("lm_head.weight", tail);
  offsets.layers.resize(config.n_layers);
  for (int64_t l = 0; l < config.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const size_t unit = static_cast<size_t>(1 + l);
    auto at = [&](const char* name) { return in_unit(p + name, unit); };
    offsets.layers[l] = {at("input_layernorm.weight"),  at("self_attn.q_proj.weight"),
                         at("self_attn.k_proj.weight"), at("self_attn.v_proj.weight"),
                         at("self_attn.o_proj.weight"), at("post_attention_layernorm.weight"),
                         at("mlp.gate_proj.weight"),    at("mlp.up_proj.weight"),
                         at("mlp.down_proj.weight")};
  }
  return offsets;
}

LlamaModel::~LlamaModel() {
  delete buffers_;
}

size_t LlamaModel::activation_bytes() const {
  const Buffers& b = *buffers_;
  size_t floats = 0;
  for (const auto& l : b.layers)
    floats += l.x_in.size() + l.ln1.size() + l.ln1_rstd.size() + l.q.size() + l.k.size() +
              l.v.size() + l.att_lse.size() + l.att.size() + l.x_mid.size() + l.ln2.size() +
              l.ln2_rstd.size() + l.gate.size() + l.up.size() + l.hidden.size();
  floats += b.x_final.size() + b.lnf.size() + b.lnf_rstd.size() + b.logits.size() +
            b.head_chunk.size() + b.losses.size() + b.lse.size() + b.dx.size() + b.dln.size() +
            b.dq.size() + b.dk.size() + b.dv.size() + b.datt.size() + b.dgate.size() +
            b.dup.size() + b.dhidden.size() + b.partials.size() + b.vocab_max.size() +
            b.vocab_sum.size() + b.vocab_target.size() + b.row_max.size() + b.full.size() +
            b.dx_full.size() + b.norm_partials.size();
  return floats * sizeof(float);
}

double PlannedLlamaActivationBytes(const LlamaConfig& c, double B, double T,
                                   const ModelParallelism& p) {
  // This rank's share of each split dimension.
  const double share = 1.0 / p.tp_degree, chunks = p.chunks_per_rank();
  const double N = B * T, C = static_cast<double>(c.dim);
  const double V = static_cast<double>(c.vocab_size) * share;
  const double H = static_cast<double>(c.n_heads) * share;
  const double KV = static_cast<double>(c.n_kv_heads) * share;
  const double D = static_cast<double>(c.head_dim());
  const double F = static_cast<double>(c.ffn_hidden_dim) * share;
  const double rows = FusedHeadRowsPlanned(N, static_cast<double>(c.vocab_size));
  // The rows of the residual stream and the norms: all, or this rank's under sequence
  // parallelism (with the two gathered buffers of all rows).
  const bool sp = p.sequence_parallel;
  const double n = sp ? N / p.tp_degree : N;
  // The buffers of LlamaModel::LlamaModel, in floats.
  const double layer =
      4 * n * C + 2 * n + N * H * D + 2 * N * KV * D + B * H * T + N * H * D + 3 * N * F;
  const double rest = 3 * n * C + (sp ? n : N) * C + n + 2 * N + rows * V + 2 * N * H * D +
                      2 * N * KV * D + 3 * N * F + (chunks - 1) * N * C +
                      (p.tp_chunks > 1 ? (3 * chunks + 1) * rows : 0) + (sp ? 2 * N * C : 0) +
                      (p.tp_chunks > 1 ? ((sp ? chunks : p.tp_chunks) - 1) * C : 0);
  return 4 * (static_cast<double>(c.n_layers) * layer + rest);
}

const float* LlamaModel::logits() const {
  Buffers& b = *buffers_;
  if (fused_ || scored_ || !b.logits.data())
    throw Error(kExitFailure,
                "internal: logits() after a fused or scored forward (ForwardOptions::Fused and "
                "Scored keep no logits; ask Forward for ForwardOptions::Logits())");
  if (backend_->host_memory()) return b.logits.data();
  if (!b.host_logits_current) {
    b.host_logits.resize(b.logits.size());
    b.logits.CopyTo(b.host_logits.data(), b.logits.size());
    b.host_logits_current = true;
  }
  return b.host_logits.data();
}
const float* LlamaModel::losses() const {
  return backend_->host_memory() ? buffers_->losses.data() : buffers_->host_losses.data();
}

std::vector<float*> LlamaModel::Partials(float* out) {
  std::vector<float*> partials(static_cast<size_t>(chunks_));
  partials[0] = out;
  const size_t NC = static_cast<size_t>(B_ * T_ * config_.dim);
  for (int64_t c = 1; c < chunks_; ++c) partials[c] = buffers_->partials.data() + (c - 1) * NC;
  return partials;
}

void LlamaModel::NormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                              const float* weight, const float* rstd) {
  ComputeBackend& be = *backend_;
  const int64_t C = config_.dim;
  const int chunks = parallelism_.tp_chunks;
  if (chunks == 1) {  // the plain model: one sum over all rows
    be.RmsnormBackward(dinp, dweight, dout, inp, weight, rstd, rows_, C);
    return;
  }
  // Row chunk by row chunk (the same rows at every degree), the weight's gradients added in the
  // tree: this rank's chunks, then the group's when the rows are split.
  const int64_t N = B_ * T_;
  const int held = sp_ ? parallelism_.chunks_per_rank() : chunks;
  const int first = sp_ ? parallelism_.first_chunk() : 0;
  std::vector<float*> parts(static_cast<size_t>(held));
  for (int j = 0; j < held; ++j) {
    parts[j] = j == 0 ? dweight : buffers_->norm_partials.data() + (j - 1) * C;
    const int64_t begin = parallelism_.RowChunkBegin(first + j, N) - row_first_;
    const int64_t end = parallelism_.RowChunkBegin(first + j + 1, N) - row_first_;
    be.RmsnormBackward(dinp + begin * C, parts[j], dout + begin * C, inp + begin * C, weight,
                       rstd + begin, end - begin, C);
  }
  if (sp_)
    tp_->SumChunks(parts.data(), static_cast<size_t>(C), "norm weight-gradient sum");
  else
    tp_->TreeSum(parts.data(), held, static_cast<size_t>(C));
}

void LlamaModel::RowParallelSum(const std::vector<float*>& partials, float* out, const char* what) {
  const size_t NC = static_cast<size_t>(B_ * T_ * config_.dim);
  if (sp_)
    tp_->SumChunksScatter(partials.data(), NC, out, what);
  else
    tp_->SumChunks(partials.data(), NC, what);
}

void LlamaModel::ColumnParallelBackward(const std::vector<float*>& partials, const float* inp,
                                        std::initializer_list<ColumnProjection> projections) {
  const int64_t N = B_ * T_, C = config_.dim;
  for (size_t k = 0; k < partials.size(); ++k) {
    bool accumulate = false;
    for (const ColumnProjection& p : projections) {
      const int64_t offset = static_cast<int64_t>(k) * p.width;
      backend_->MatmulBackward(partials[k], p.grad + offset * C, p.dout + offset * N, inp,
                               p.weight + offset * C, N, C, p.width, accumulate, false);
      accumulate = true;
    }
  }
}

const float* LlamaModel::AllRows(const float* local, float* full, const char* what) {
  if (!sp_) return local;
  tp_->AllGatherTo(local, static_cast<size_t>(rows_ * config_.dim), full, what);
  return full;
}

void LlamaModel::SetLength(int64_t seq_len) {
  const int64_t T = seq_len > 0 ? seq_len : T_max_;
  if (T > T_max_ || (T != T_max_ && (parallelism_.tp_chunks > 1 || sp_)))
    throw Error(kExitFailure,
                StrFormat("internal: a forward of rows of %lld positions on a model built for "
                          "%lld%s",
                          (long long)T, (long long)T_max_,
                          T > T_max_ ? "" : " under tensor parallelism (not supported)"));
  T_ = T;
  if (!sp_) rows_ = B_ * T;  // under sequence parallelism T is the built length
  buffers_->rope->SetLength(T);
}

LossSum LlamaModel::Forward(ParameterAccess& access, const int32_t* tokens, const int32_t* targets,
                            const float* loss_weights, const ForwardOptions& options) {
  SetLength(options.seq_len);
  Buffers& b = *buffers_;
  ComputeBackend& be = *backend_;
  const LlamaConfig& c = config_;
  const int64_t N = B_ * T_, C = c.dim, D = c.head_dim();
  // One chunk's widths (model/parallelism.h), this rank's chunks, and its whole widths.
  const int64_t Hc = Hc_, KVc = KVc_, Fc = Fc_, chunks = chunks_;
  const int64_t qw = Hc * D, kw = KVc * D, Hl = Hc * chunks, Fl = Fc * chunks;
  const int64_t V = Vc_ * chunks;
  const int64_t L = c.n_layers;
  const int tail = table_.tail_unit();
  const float eps = static_cast<float>(c.norm_eps);
  b.tokens.CopyFrom(tokens, N);
  b.rope->Set(options.positions);
  loss_weights_ = loss_weights;
  if (loss_weights && !be.host_memory()) b.loss_weights.CopyFrom(loss_weights, N);
  if (options.head == ForwardOptions::Head::kLogits && parallelism_.tp_chunks > 1)
    throw Error(kExitFailure,
                "internal: the whole logits of a tensor-parallel model (ForwardOptions::Logits) "
                "are not supported; ask for Fused or Scored");

  const float* unit0 = UnitWeights(access, 0);
  access.Prefetch(L > 0 ? 1 : tail);
  float* x0 = b.layers.empty() ? b.x_final.data() : b.layers[0].x_in.data();
  const int64_t n = rows_;  // this rank's rows of the residual stream (sequence parallelism)
  if (!parallelism_.distributed()) {
    be.EmbeddingForward(x0, b.tokens.data() + row_first_, unit0 + embed_, n, C);
  } else if (sp_) {
    // Each rank looks up the tokens of every row in its vocabulary, and the rows of each rank's
    // block go to it from the ranks that hold their tokens.
    const int64_t first = parallelism_.tp_rank * V;
    be.EmbeddingForwardRows(b.full.data(), b.tokens.data(), unit0 + embed_, N, C, first, V);
    const float* all = tp_->AllToAll(b.full.data(), static_cast<size_t>(n * C), "embedding rows");
    std::vector<float>& rows = b.host_rows;
    rows.resize(static_cast<size_t>(n * C));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t owner = tokens[row_first_ + i] / V;
      std::memcpy(rows.data() + i * C, all + (owner * n + i) * C, C * sizeof(float));
    }
    be.CopyToDevice(x0, rows.data(), rows.size() * sizeof(float));
  } else {
    // A vocabulary-parallel embedding: each rank looks up the tokens of its rows, and every row
    // is taken from the rank that holds its token (a copy, not a sum: the bits of one table).
    const int64_t first = parallelism_.tp_rank * V;
    be.EmbeddingForwardRows(x0, b.tokens.data(), unit0 + embed_, N, C, first, V);
    const float* all = tp_->AllGather(x0, static_cast<size_t>(N * C), "embedding rows");
    std::vector<float>& rows = b.host_rows;
    rows.resize(static_cast<size_t>(N * C));
    for (int64_t i = 0; i < N; ++i) {
      const int64_t owner = tokens[i] / V;
      std::memcpy(rows.data() + i * C, all + (owner * N + i) * C, C * sizeof(float));
    }
    be.CopyToDevice(x0, rows.data(), rows.size() * sizeof(float));
  }
  if (!c.tie_embeddings) access.ReleaseWeights(0);
  for (int64_t l = 0; l < L; ++l) {
    auto& Lb = b.layers[l];
    const int unit = static_cast<int>(1 + l);
    const float* w = UnitWeights(access, unit);
    access.Prefetch(l + 1 < L ? unit + 1 : tail);
    const LayerOffsets& o = layers_[l];  // unit-relative
    float* x_out = l + 1 < L ? b.layers[l + 1].x_in.data() : b.x_final.data();
    be.RmsnormForward(Lb.ln1.data(), Lb.ln1_rstd.data(), Lb.x_in.data(), w + o.ln1, n, C, eps);
    // Attention, chunk by chunk of heads: q k v column-parallel (rows of their weights), o
    // row-parallel (columns of its weight), its chunks' partial products summed in the tree.
    const float* ln1 = AllRows(Lb.ln1.data(), b.full.data(), "attention norm rows");
    for (int64_t k = 0; k < chunks; ++k) {
      float* q = Lb.q.data() + k * N * qw;
      float* kk = Lb.k.data() + k * N * kw;
      float* v = Lb.v.data() + k * N * kw;
      be.MatmulForward(q, ln1, w + o.q + k * qw * C, N, C, qw);
      be.MatmulForward(kk, ln1, w + o.k + k * kw * C, N, C, kw);
      be.MatmulForward(v, ln1, w + o.v + k * kw * C, N, C, kw);
      const RopePositions& rope = *b.rope;
      be.RopeForward(q, rope.cos(), rope.sin(), rope.batch(), rope.seq(), Hc, D);
      be.RopeForward(kk, rope.cos(), rope.sin(), rope.batch(), rope.seq(), KVc, D);
      be.AttentionForward(Lb.att.data() + k * N * qw, Lb.att_lse.data() + k * B_ * Hc * T_, q, kk,
                          v, B_, T_, Hc, KVc, D, rope.positions());
    }
    // Under sequence parallelism the sum is reduce-scattered to each rank's rows (the gathered
    // norm rows are read no more).
    std::vector<float*> partials = Partials(sp_ ? b.full.data() : Lb.x_mid.data());
    for (int64_t k = 0; k < chunks; ++k)
      be.MatmulForwardStrided(partials[k], Lb.att.data() + k * N * qw, w + o.o + k * qw, Hl * D, N,
                              qw, C);
    RowParallelSum(partials, Lb.x_mid.data(), "o_proj sum");
    be.Add(Lb.x_mid.data(), Lb.x_in.data(), n * C);
    be.RmsnormForward(Lb.ln2.data(), Lb.ln2_rstd.data(), Lb.x_mid.data(), w + o.ln2, n, C, eps);
    // The MLP: gate and up column-parallel, down row-parallel.
    const float* ln2 = AllRows(Lb.ln2.data(), b.full.data(), "mlp norm rows");
    for (int64_t k = 0; k < chunks; ++k) {
      be.MatmulForward(Lb.gate.data() + k * N * Fc, ln2, w + o.gate + k * Fc * C, N, C, Fc);
      be.MatmulForward(Lb.up.data() + k * N * Fc, ln2, w + o.up + k * Fc * C, N, C, Fc);
    }
    be.SwigluForward(Lb.hidden.data(), Lb.gate.data(), Lb.up.data(), N, Fl);
    partials = Partials(sp_ ? b.full.data() : x_out);
    for (int64_t k = 0; k < chunks; ++k)
      be.MatmulForwardStrided(partials[k], Lb.hidden.data() + k * N * Fc, w + o.down + k * Fc, Fl,
                              N, Fc, C);
    RowParallelSum(partials, x_out, "down_proj sum");
    be.Add(x_out, Lb.x_mid.data(), n * C);
    access.ReleaseWeights(unit);
  }
  const float* wt = UnitWeights(access, tail);
  be.RmsnormForward(b.lnf.data(), b.lnf_rstd.data(), b.x_final.data(), wt + final_norm_, n, C, eps);
  AllRows(b.lnf.data(), b.full.data(), "final norm rows");  // head_rows_: all rows
  const float* head = c.tie_embeddings ? unit0 + embed_ : wt + head_;
  LossSum sum;
  if (options.head == ForwardOptions::Head::kFused) {
    sum = FusedHead(access, head, targets, options.loss_scale);
  } else if (options.head == ForwardOptions::Head::kScored) {
    sum = ScoredHead(head, targets);
  } else {
    fused_ = false;
    scored_ = false;
    if (!b.logits.data())  // for the longest rows
      b.logits = Buffers::Floats(be, static_cast<size_t>(B_ * T_max_ * V));
    be.MatmulForward(b.logits.data(), head_rows_, head, N, C, V);
    sum = Retarget(targets);
  }
  access.ReleaseWeights(tail);
  if (c.tie_embeddings) access.ReleaseWeights(0);
  return sum;
}

LossSum LlamaModel::FusedHead(ParameterAccess& access, const float* head, const int32_t* targets,
                              float loss_scale) {
  Buffers& b = *buffers_;
  ComputeBackend& be = *backend_;
  const int64_t N = B_ * T_, C = config_.dim, V = config_.vocab_size, Vc = Vc_;
  SetTargets(targets);
  // The head's weight gradient opens here and is made ready by Backward, with the final norm's
  // (the tail unit) or after the embedding's backward adds to it (tied: unit 0).
  const int unit = config_.tie_embeddings ? 0 : table_.tail_unit();
  float* dhead = UnitGradients(access, unit) + (config_.tie_embeddings ? embed_ : head_);
  const float* weights =
      loss_weights_ ? (be.host_memory() ? loss_weights_ : b.loss_weights.data()) : nullptr;
  const int64_t rows = FusedHeadRows(N, V);
  // Per chunk of rows: logits, losses and lse, dlogits in place, then d lnf rows = dlogits W and
  // the head's gradient += dlogits^T lnf (the first chunk overwrites it). The vocabulary cut in
  // chunks (model/parallelism.h): each chunk's logits and products, the lse over all of them, and
  // d lnf summed over them in the tree.
  if (parallelism_.tp_chunks == 1) {  // the whole vocabulary in one chunk: the plain head
    FusedHeadChunks(be, head_rows_, head, N, C, V, b.targets.data(), weights, loss_scale,
                    b.head_chunk.data(), b.losses.data(), b.lse.data(), b.dln.data(), dhead);
  }
  std::vector<float*> x(static_cast<size_t>(chunks_));
  for (int64_t r = 0; parallelism_.tp_chunks > 1 && r < N; r += rows) {
    const int64_t n = std::min(rows, N - r);
    const float* lnf = head_rows_ + r * C;
    for (int64_t k = 0; k < chunks_; ++k) {
      x[k] = b.head_chunk.data() + k * rows * Vc;
      be.MatmulForward(x[k], lnf, head + k * Vc * C, n, C, Vc);
    }
    VocabularyLse(x.data(), r, n, targets);
    const int64_t first = parallelism_.first_chunk() * Vc;
    // d lnf of all rows; under sequence parallelism this rank's chunks' sum here, the group's
    // (each rank's rows) after the last row chunk.
    std::vector<float*> partials = Partials((sp_ ? b.dx_full.data() : b.dln.data()) + r * C);
    for (int64_t k = 0; k < chunks_; ++k) {
      be.CrossEntropyBackwardRows(x[k], b.lse.data() + r, b.targets.data() + r, n, Vc,
                                  first + k * Vc, loss_scale, weights ? weights + r : nullptr);
      be.MatmulBackward(partials[k], dhead + k * Vc * C, x[k], lnf, head + k * Vc * C, n, C, Vc,
                        false, r > 0);
    }
    if (sp_)
      tp_->TreeSum(partials.data(), static_cast<int>(chunks_), static_cast<size_t>(n * C));
    else
      tp_->SumChunks(partials.data(), static_cast<size_t>(n * C), "lm_head input-gradient sum");
  }
  if (sp_)
    tp_->ScatterSum(b.dx_full.data(), static_cast<size_t>(N * C), b.dln.data(),
                    "lm_head input-gradient sum");
  fused_ = true;
  fused_scale_ = loss_scale;
  scored_ = false;
  if (!be.host_memory()) b.losses.CopyTo(b.host_losses.data(), N);
  return SumLosses(targets);
}

void LlamaModel::VocabularyLse(const float* const* x, int64_t r, int64_t n,
                               const int32_t* targets) {
  Buffers& b = *buffers_;
  ComputeBackend& be = *backend_;
  const int64_t rows = FusedHeadRows(B_ * T_, config_.vocab_size), Vc = Vc_;
  const int64_t first_chunk = parallelism_.first_chunk();
  const size_t count = static_cast<size_t>(n);
  // The row maxima: of each chunk, then of all (a maximum is exact in any order).
  std::vector<float>& m = b.host_max;
  m.assign(count * chunks_, 0.0f);
  for (int64_t k = 0; k < chunks_; ++k) be.RowMax(b.vocab_max.data() + k * rows, x[k], n, Vc);
  for (int64_t k = 0; k < chunks_; ++k)
    be.CopyToHost(m.data() + k * count, b.vocab_max.data() + k * rows, count * sizeof(float));
  for (int64_t k = 1; k < chunks_; ++k)
    for (size_t i = 0; i < count; ++i) m[i] = std::max(m[i], m[k * count + i]);
  if (parallelism_.distributed()) {
    const float* all = tp_->AllGatherHost(m.data(), count, "vocabulary row maxima");
    for (size_t i = 0; i < count; ++i) m[i] = all[i];
    for (int q = 1; q < parallelism_.tp_degree; ++q)
      for (size_t i = 0; i < count; ++i) m[i] = std::max(m[i], all[q * count + i]);
  }
  be.CopyToDevice(b.row_max.data(), m.data(), count * sizeof(float));
  // The exp-sums against the whole row's maximum, summed over the chunks in the tree.
  std::vector<float*> sums(static_cast<size_t>(chunks_));
  for (int64_t k = 0; k < chunks_; ++k) {
    sums[k] = b.vocab_sum.data() + k * rows;
    be.RowExpSum(sums[k], x[k], b.row_max.data(), n, Vc);
  }
  tp_->SumChunks(sums.data(), count, "vocabulary exp-sum");
  std::vector<float>& s = b.host_sum;
  s.resize(count);
  be.CopyToHost(s.data(), sums[0], count * sizeof(float));
  // The target's logit, from the chunk (and the rank) that holds it.
  std::vector<float>& t = b.host_target;
  t.assign(count * chunks_, 0.0f);
  for (int64_t k = 0; k < chunks_; ++k) {
    be.TargetLogits(b.vocab_target.data() + k * rows, x[k], b.targets.data() + r, n, Vc,
                    (first_chunk + k) * Vc);
    be.CopyToHost(t.data() + k * count, b.vocab_target.data() + k * rows, count * sizeof(float));
  }
  const int32_t* target = targets + r;
  std::vector<float> mine(count, 0.0f);
  for (size_t i = 0; i < count; ++i) {
    if (target[i] < 0) continue;
    const int64_t k = target[i] / Vc - first_chunk;
    if (k >= 0 && k < chunks_) mine[i] = t[k * count + i];
  }
  if (parallelism_.distributed()) {
    const float* all = tp_->AllGatherHost(mine.data(), count, "vocabulary target logits");
    for (size_t i = 0; i < count; ++i)
      if (target[i] >= 0) mine[i] = all[(target[i] / Vc / chunks_) * count + i];
  }
  // lse = max + log(sum), the loss lse - the target's logit, in float as the row kernel.
  std::vector<float>& lse = b.host_lse;
  std::vector<float>& losses = b.host_losses_part;
  lse.resize(count);
  losses.resize(count);
  for (size_t i = 0; i < count; ++i) {
    lse[i] = m[i] + std::log(s[i]);
    losses[i] = target[i] < 0 ? 0.0f : lse[i] - mine[i];
  }
  be.CopyToDevice(b.lse.data() + r, lse.data(), count * sizeof(float));
  be.CopyToDevice(b.losses.data() + r, losses.data(), count * sizeof(float));
}

void LlamaModel::VocabularyArgmax(const float* const* x, int64_t r, int64_t n,
                                  const int32_t* targets) {
  Buffers& b = *buffers_;
  const int64_t Vc = Vc_, first = parallelism_.first_chunk() * Vc;
  const size_t count = static_cast<size_t>(n);
  // Each row's best (value, index) over this rank's chunks in order, a later one only when
  // larger: the first of equal logits, as std::max_element over the whole row.
  std::vector<float>& best = b.host_best;
  best.assign(2 * count, 0.0f);
  std::vector<float> chunk(count * Vc);
  for (int64_t k = 0; k < chunks_; ++k) {
    const float* row0 = x[k];
    if (!backend_->host_memory()) {
      backend_->CopyToHost(chunk.data(), x[k], chunk.size() * sizeof(float));
      row0 = chunk.data();
    }
    for (size_t i = 0; i < count; ++i) {
      const float* row = row0 + i * Vc;
      const int64_t j = std::max_element(row, row + Vc) - row;
      if (k == 0 || row[j] > best[i]) {
        best[i] = row[j];
        best[count + i] = static_cast<float>(first + k * Vc + j);  // exact: V <= 2^24
      }
    }
  }
  std::vector<float> all(best);
  if (parallelism_.distributed()) {
    const float* gathered = tp_->AllGatherHost(best.data(), 2 * count, "vocabulary argmax");
    all.assign(gathered, gathered + 2 * count * parallelism_.tp_degree);
  }
  int32_t* predicted = b.predictions.data() + r;
  for (size_t i = 0; i < count; ++i) {
    if (targets[r + i] < 0) continue;
    float value = all[i], index = all[count + i];
    for (int q = 1; q < parallelism_.tp_degree; ++q) {
      const float* theirs = all.data() + 2 * count * q;
      if (theirs[i] > value) value = theirs[i], index = theirs[count + i];
    }
    predicted[i] = static_cast<int32_t>(index);
  }
}

LossSum LlamaModel::ScoredHead(const float* head, const int32_t* targets) {
  Buffers& b = *buffers_;
  ComputeBackend& be = *backend_;
  const int64_t N = B_ * T_, C = config_.dim, V = config_.vocab_size, Vc = Vc_;
  SetTargets(targets);
  const int64_t rows = FusedHeadRows(N, V);
  b.predictions.assign(N, -1);
  if (parallelism_.tp_chunks == 1) {  // the whole vocabulary in one chunk: the plain head
    ScoredHeadChunks(be, head_rows_, head, N, C, V, b.targets.data(), targets, b.head_chunk.data(),
                     b.losses.data(), b.lse.data(), b.predictions.data(), &b.host_chunk);
  }
  std::vector<float*> x(static_cast<size_t>(chunks_));
  for (int64_t r = 0; parallelism_.tp_chunks > 1 && r < N; r += rows) {
    const int64_t n = std::min(rows, N - r);
    for (int64_t k = 0; k < chunks_; ++k) {
      x[k] = b.head_chunk.data() + k * rows * Vc;
      be.MatmulForward(x[k], head_rows_ + r * C, head + k * Vc * C, n, C, Vc);
    }
    VocabularyLse(x.data(), r, n, targets);
    VocabularyArgmax(x.data(), r, n, targets);
  }
  fused_ = false;
  scored_ = true;
  if (!be.host_memory()) b.losses.CopyTo(b.host_losses.data(), N);
  return SumLosses(targets);
}

const int32_t* LlamaModel::predictions() const {
  if (!scored_)
    throw Error(kExitFailure,
                "internal: predictions() without a scored forward (ask Forward for "
                "ForwardOptions::Scored())");
  return buffers_->predictions.data();
}

void LlamaModel::SetTargets(const int32_t* targets) {
  Buffers& b = *buffers_;
  const int64_t N = B_ * T_;
  k::check_targets(targets, N, config_.vocab_size);
  std::memcpy(b.host_targets.data(), targets, N * sizeof(int32_t));
  b.targets.CopyFrom(targets, N);
}

LossSum LlamaModel::Retarget(const int32_t* targets) {
  Buffers& b = *buffers_;
  const int64_t N = B_ * T_, V = config_.vocab_size;
  if (fused_ || scored_ || !b.logits.data())
    throw Error(kExitFailure,
                "internal: Retarget after a fused or scored forward (no logits kept; ask "
                "Forward for ForwardOptions::Logits())");
  SetTargets(targets);
  backend_->CrossEntropyForward(b.losses.data(), b.lse.data(), b.logits.data(), b.targets.data(), N,
                                V);
  b.host_logits_current = false;
  if (!backend_->host_memory()) b.losses.CopyTo(b.host_losses.data(), N);
  return SumLosses(targets);
}

LossSum LlamaModel::Reweight(const float* loss_weights) {
  Buffers& b = *buffers_;
  const int64_t N = B_ * T_;
  if (fused_ || scored_ || !b.logits.data())
    throw Error(kExitFailure,
                "internal: Reweight after a fused or scored forward (no logits kept; ask "
                "Forward for ForwardOptions::Logits())");
  loss_weights_ = loss_weights;
  if (loss_weights && !backend_->host_memory()) b.loss_weights.CopyFrom(loss_weights, N);
  return SumLosses(b.host_targets.data());
}

LossSum LlamaModel::SumLosses(const int32_t* targets) const {
  return crucible::SumLosses(losses(), targets, loss_weights_, B_ * T_);
}

void LlamaModel::Backward(ParameterAccess& access, float loss_scale) {
  Buffers& b = *buffers_;
  ComputeBackend& be = *backend_;
  const LlamaConfig& c = config_;
  const int64_t N = B_ * T_, C = c.dim, D = c.head_dim();
  const int64_t Hc = Hc_, KVc = KVc_, Fc = Fc_, chunks = chunks_;
  const int64_t qw = Hc * D, kw = KVc * D, Hl = Hc * chunks, Fl = Fc * chunks;
  const int64_t V = Vc_ * chunks;
  const int64_t L = c.n_layers;
  const int tail = table_.tail_unit();
  if (scored_)
    throw Error(kExitFailure,
                "internal: Backward after a scored forward (ForwardOptions::Scored keeps no "
                "logits; ask Forward for ForwardOptions::Logits() or Fused)");

  // Head and final norm (the tied head's weight and gradient live in the embedding unit).
  const float* wt = UnitWeights(access, tail);
  const float* unit0 = c.tie_embeddings ? UnitWeights(access, 0) : nullptr;
  if (L > 0) access.Prefetch(static_cast<int>(L));
  float* gt = UnitGradients(access, tail);
  float* g0 = c.tie_embeddings ? UnitGradients(access, 0) : nullptr;
  if (fused_) {  // the head's backward ran in Forward, with its loss scale
    if (loss_scale != fused_scale_)
      throw Error(kExitFailure,
                  "internal: Backward's loss scale differs from the fused forward's (ask Forward "
                  "for ForwardOptions::Fused with the scale Backward will get)");
  } else {
    const float* weights =
        loss_weights_ ? (be.host_memory() ? loss_weights_ : b.loss_weights.data()) : nullptr;
    be.CrossEntropyBackward(b.logits.data(), b.lse.data(), b.targets.data(), N, V, loss_scale,
                            weights);
    b.host_logits_current = false;
    const float* dlogits = b.logits.data();
    if (c.tie_embeddings)
      be.MatmulBackward(b.dln.data(), g0 + embed_, dlogits, head_rows_, unit0 + embed_, N, C, V,
                        false, false);
    else
      be.MatmulBackward(b.dln.data(), gt + head_, dlogits, head_rows_, wt + head_, N, C, V, false,
                        false);
  }
  fused_ = false;
  be.Fill(b.dx.data(), b.dx.size(), 0.0f);
  NormBackward(b.dx.data(), gt + final_norm_, b.dln.data(), b.x_final.data(), wt + final_norm_,
               b.lnf_rstd.data());
  access.ReleaseWeights(tail);
  UnitGradientsReady(access, tail);

  for (int64_t l = L - 1; l >= 0; --l) {
    auto& Lb = b.layers[l];
    const int unit = static_cast<int>(1 + l);
    const float* w = UnitWeights(access, unit);
    if (l > 0) access.Prefetch(unit - 1);  // the embedding's backward needs no weights
    float* g = UnitGradients(access, unit);
    const LayerOffsets& o = layers_[l];
    // MLP: x_out = x_mid + down(silu(gate(ln2)) * up(ln2)); dx holds d x_out. Chunk by chunk of
    // the FFN width; d ln2 is a sum over it (the tree, model/parallelism.h). Under sequence
    // parallelism dx of all rows is gathered, the norm's rows gathered again (not kept from the
    // forward), and d ln2 reduce-scattered to this rank's rows.
    const float* dx = AllRows(b.dx.data(), b.dx_full.data(), "mlp output-gradient rows");
    for (int64_t k = 0; k < chunks; ++k)
      be.MatmulBackwardStrided(b.dhidden.data() + k * N * Fc, g + o.down + k * Fc, dx,
                               Lb.hidden.data() + k * N * Fc, w + o.down + k * Fc, Fl, N, Fc, C,
                               false, false);
    be.SwigluBackward(b.dgate.data(), b.dup.data(), b.dhidden.data(), Lb.gate.data(), Lb.up.data(),
                      N, Fl);
    const float* ln2 = AllRows(Lb.ln2.data(), b.full.data(), "mlp norm rows");
    std::vector<float*> partials = Partials(sp_ ? b.dx_full.data() : b.dln.data());
    ColumnParallelBackward(
        partials, ln2,
        {{g + o.gate, w + o.gate, b.dgate.data(), Fc}, {g + o.up, w + o.up, b.dup.data(), Fc}});
    RowParallelSum(partials, b.dln.data(), "mlp input-gradient sum");
    // dx (d x_mid) += rmsnorm backward
    NormBackward(b.dx.data(), g + o.ln2, b.dln.data(), Lb.x_mid.data(), w + o.ln2,
                 Lb.ln2_rstd.data());
    // Attention: x_mid = x_in + o_proj(att(rope(q(ln1)), rope(k(ln1)), v(ln1))), chunk by chunk
    // of heads; d ln1 is a sum over them.
    const float* dx_mid = AllRows(b.dx.data(), b.dx_full.data(), "attention output-gradient rows");
    for (int64_t k = 0; k < chunks; ++k) {
      float* datt = b.datt.data() + k * N * qw;
      float* dq = b.dq.data() + k * N * qw;
      float* dk = b.dk.data() + k * N * kw;
      float* dv = b.dv.data() + k * N * kw;
      be.MatmulBackwardStrided(datt, g + o.o + k * qw, dx_mid, Lb.att.data() + k * N * qw,
                               w + o.o + k * qw, Hl * D, N, qw, C, false, false);
      be.AttentionBackward(dq, dk, dv, datt, Lb.att.data() + k * N * qw,
                           Lb.att_lse.data() + k * B_ * Hc * T_, Lb.q.data() + k * N * qw,
                           Lb.k.data() + k * N * kw, Lb.v.data() + k * N * kw, B_, T_, Hc, KVc, D,
                           b.rope->positions());
      const RopePositions& rope = *b.rope;
      be.RopeBackward(dq, rope.cos(), rope.sin(), rope.batch(), rope.seq(), Hc, D);
      be.RopeBackward(dk, rope.cos(), rope.sin(), rope.batch(), rope.seq(), KVc, D);
    }
    const float* ln1 = AllRows(Lb.ln1.data(), b.full.data(), "attention norm rows");
    partials = Partials(sp_ ? b.dx_full.data() : b.dln.data());
    ColumnParallelBackward(partials, ln1,
                           {{g + o.q, w + o.q, b.dq.data(), qw},
                            {g + o.k, w + o.k, b.dk.data(), kw},
                            {g + o.v, w + o.v, b.dv.data(), kw}});
    RowParallelSum(partials, b.dln.data(), "attention input-gradient sum");
    // dx (d x_in) += rmsnorm backward; the residual path carries dx through unchanged.
    NormBackward(b.dx.data(), g + o.ln1, b.dln.data(), Lb.x_in.data(), w + o.ln1,
                 Lb.ln1_rstd.data());
    access.ReleaseWeights(unit);
    UnitGradientsReady(access, unit);
  }
  // Embedding: overwrite (untied) or add to the head's gradient (tied); a vocabulary-parallel
  // rank adds the rows of its tokens only.
  if (!g0) g0 = UnitGradients(access, 0);
  float* dembed = g0 + embed_;
  if (!c.tie_embeddings) be.Fill(dembed, table_.params()[0].numel, 0.0f);
  const float* dx0 = AllRows(b.dx.data(), b.dx_full.data(), "embedding gradient rows");
  if (parallelism_.distributed())
    be.EmbeddingBackwardRows(dembed, dx0, b.tokens.data(), N, C, parallelism_.tp_rank * V, V);
  else
    be.EmbeddingBackward(dembed, dx0, b.tokens.data(), N, C);
  if (c.tie_embeddings) access.ReleaseWeights(0);
  UnitGradientsReady(access, 0);
}

}  // namespace crucible
