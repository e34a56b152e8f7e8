// The Llama family's ModelSpec: what the rest of the program asks of a Llama before it is built
// (sizes, weight init, FLOPs, metadata), and its registration as [model] name "llama".
#include <algorithm>
#include <cmath>

#include "common/philox.h"
#include "common/strings.h"
#include "model/llama.h"

namespace crucible {
namespace {

constexpr char kArchitecture[] = "LlamaForCausalLM";

std::shared_ptr<const ModelSpec> BuildLlamaSpec(Config& config) {
  return std::make_shared<LlamaSpec>(BuildLlamaConfig(config));
}

ModelRegistrar llama_registrar("llama", BuildLlamaSpec,
                               {"llama", kArchitecture, ReadLlamaHfConfig});

}  // namespace

std::string LlamaSpec::Summary() const {
  return StrFormat("flavor=%s layers=%lld dim=%lld vocab=%lld", config_.flavor.c_str(),
                   (long long)config_.n_layers, (long long)config_.dim,
                   (long long)config_.vocab_size);
}

std::string LlamaSpec::SizeKeys() const {
  return StrFormat(
      "model.vocab_size = %lld, model.dim = %lld, model.n_layers = %lld, model.ffn_hidden_dim = "
      "%lld",
      (long long)config_.vocab_size, (long long)config_.dim, (long long)config_.n_layers,
      (long long)config_.ffn_hidden_dim);
}

std::map<std::string, std::string> LlamaSpec::WeightsMetadata() const {
  const LlamaConfig& m = config_;
  return {{"crucible.flavor", m.flavor},
          {"crucible.vocab_size", std::to_string(m.vocab_size)},
          {"crucible.dim", std::to_string(m.dim)},
          {"crucible.n_layers", std::to_string(m.n_layers)},
          {"crucible.n_heads", std::to_string(m.n_heads)},
          {"crucible.n_kv_heads", std::to_string(m.n_kv_heads)},
          {"crucible.ffn_hidden_dim", std::to_string(m.ffn_hidden_dim)},
          {"crucible.tie_embeddings", m.tie_embeddings ? "true" : "false"}};
}

ParameterSizes LlamaSpec::PlannedSizes(const ModelParallelism& parallelism) const {
  const LlamaSizes s = PlannedLlamaSizes(config_, parallelism);
  // Per layer two norms and seven projections; the embedding, the final norm, an untied head.
  const double L = static_cast<double>(config_.n_layers), tied = config_.tie_embeddings ? 0 : 1;
  ParameterSizes sizes;
  sizes.parameters = s.parameters;
  sizes.active = s.parameters;
  sizes.first_unit = s.embedding;
  sizes.largest_unit = s.largest_unit;
  sizes.largest_other_unit = s.largest_other_unit;
  sizes.tensors = 9 * L + 2 + tied;
  const double C = static_cast<double>(config_.dim);
  auto set = [&](ParamKind kind, double parameters, double tensors) {
    sizes.kind_parameters[static_cast<size_t>(kind)] = parameters;
    sizes.kind_tensors[static_cast<size_t>(kind)] = tensors;
  };
  set(ParamKind::kEmbedding, s.embedding, 1);
  set(ParamKind::kNorm, (2 * L + 1) * C, 2 * L + 1);
  set(ParamKind::kLinear, L * s.linear, 5 * L);            // q k v, gate up
  set(ParamKind::kOutputProjection, L * s.output, 2 * L);  // o, down
  set(ParamKind::kHead, tied * s.embedding, tied);
  return sizes;
}

BufferSizes LlamaSpec::PlannedBuffers(double B, double T,
                                      const ModelParallelism& parallelism) const {
  const double activations = PlannedLlamaActivationBytes(config_, B, T, parallelism);
  // Besides the activations: the RoPE tables (T, D/2) x 2 and the copies of tokens and targets.
  return {activations, activations + 4 * T * static_cast<double>(config_.head_dim()) + 8 * B * T,
          4 * B * T * static_cast<double>(config_.vocab_size)};
}

std::unique_ptr<Model> LlamaSpec::Build(int64_t batch_size, int64_t seq_len,
                                        std::shared_ptr<ComputeBackend> backend,
                                        const ModelParallelism& parallelism) const {
  return std::make_unique<LlamaModel>(config_, batch_size, seq_len, std::move(backend),
                                      parallelism);
}

void LlamaSpec::InitWeights(const ParameterTable& table, uint64_t seed, size_t begin, size_t end,
                            float* out) const {
  const LlamaConfig& c = config_;
  for (size_t index = 0; index < table.params().size(); ++index) {
    const ParamInfo& p = table.params()[index];
    const size_t b = std::max(begin, p.offset), e = std::min(end, p.offset + p.numel);
    if (b >= e) continue;
    float* w = out + (b - begin);
    const size_t first = b - p.offset, count = e - b;  // elements [first, first + count) of p
    if (p.kind == ParamKind::kNorm) {
      std::fill(w, w + count, 1.0f);
      continue;
    }
    double std = c.init_std;
    if (p.kind == ParamKind::kOutputProjection) std = c.init_std / std::sqrt(2.0 * c.n_layers);
    if (p.kind == ParamKind::kHead) std = 0.25 / std::sqrt(static_cast<double>(c.dim));
#pragma omp parallel for schedule(static)
    for (size_t j = 0; j < count; ++j) {
      // Each element has its own Philox stream position: thread-count independent.
      // The element's index in the whole tensor: a tensor-parallel part gets the whole's bits.
      const size_t i = p.GlobalIndex(first + j);
      Philox rng(seed, (static_cast<uint64_t>(p.whole_index) << 40) | i);
      double z = rng.NextNormal();
      for (int attempt = 0; attempt < 8 && std::fabs(z) > 3.0; ++attempt) z = rng.NextNormal();
      if (std::fabs(z) > 3.0) z = 0.0;
      w[j] = static_cast<float>(z * std);
    }
  }
}

double LlamaSpec::TrainFlopsPerToken(const ParameterTable& table, int64_t seq_len) const {
  return 6.0 * static_cast<double>(table.FlopParams()) +
         6.0 * static_cast<double>(config_.n_layers) * static_cast<double>(config_.dim) *
             static_cast<double>(seq_len);
}

std::string LlamaSpec::architecture() const {
  return kArchitecture;
}

}  // namespace crucible
