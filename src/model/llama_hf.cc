// The Llama's Hugging Face mapping: config.json written from a LlamaConfig, read back into one,
// and compared with one. ckpt/hf.cc reads and writes the files.
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/error.h"
#include "common/strings.h"
#include "model/hf_config.h"
#include "model/llama.h"

namespace crucible {
namespace {

// Refuses (DataError naming the file and key) a config.json whose model crucible's Llama cannot
// reproduce exactly: another activation, biases, a head_dim other than hidden_size/heads, or
// another RoPE. (The model_type chose this family.)
void RequireReproducible(const nlohmann::json& c, const std::string& path) {
  RequireHfSiluWithoutBiases(c, path, "Llama", {"attention_bias", "mlp_bias"});
  auto integer = [&](const char* key) {
    return c.contains(key) && c[key].is_number_integer() ? c[key].get<int64_t>() : int64_t{0};
  };
  const int64_t head_dim = integer("head_dim"), hidden = integer("hidden_size"),
                heads = integer("num_attention_heads");
  if (c.contains("head_dim") && c["head_dim"].is_number_integer() && heads > 0 &&
      hidden % heads == 0 && head_dim != hidden / heads)
    throw DataError(StrFormat(
        "%s: head_dim=%lld is not hidden_size/num_attention_heads=%lld: not supported (crucible's "
        "Llama splits hidden_size evenly over the heads); use a model whose head_dim is that",
        path.c_str(), (long long)head_dim, (long long)(hidden / heads)));
  ReadHfRopeTheta(c, path);
}

}  // namespace

nlohmann::ordered_json LlamaSpec::ConfigJson(int64_t max_position_embeddings,
                                             const nlohmann::json& bos_token_id,
                                             const nlohmann::json& eos_token_id) const {
  const LlamaConfig& m = config_;
  nlohmann::ordered_json config = {{"architectures", {architecture()}},
                                   {"model_type", "llama"},
                                   {"vocab_size", m.vocab_size},
                                   {"hidden_size", m.dim},
                                   {"intermediate_size", m.ffn_hidden_dim},
                                   {"num_hidden_layers", m.n_layers},
                                   {"num_attention_heads", m.n_heads},
                                   {"num_key_value_heads", m.n_kv_heads},
                                   {"head_dim", m.head_dim()},
                                   {"mlp_bias", false},
                                   {"pretraining_tp", 1}};
  AppendHfCommonKeys({max_position_embeddings, m.norm_eps, m.rope_theta, m.init_std,
                      m.tie_embeddings, bos_token_id, eos_token_id},
                     &config);
  return config;
}

std::vector<std::string> LlamaSpec::Differences(const nlohmann::json& c,
                                                const std::string& path) const {
  RequireReproducible(c, path);
  const LlamaConfig& m = config_;
  std::vector<std::string> differences;
  auto integer = [&](const char* key, int64_t ours, const char* our_key, int64_t fallback) {
    int64_t theirs = fallback;
    if (c.contains(key) && c[key].is_number_integer())
      theirs = c[key].get<int64_t>();
    else if (fallback < 0)
      differences.push_back(std::string(key) + " missing");
    if (fallback >= 0 || c.contains(key))
      if (theirs != ours)
        differences.push_back(
            StrFormat("%s=%lld vs %s=%lld", key, (long long)theirs, our_key, (long long)ours));
  };
  auto real = [&](const char* key, double theirs, double ours, const char* our_key) {
    if (std::fabs(theirs - ours) > 1e-12 * std::max(1.0, std::fabs(ours)))
      differences.push_back(StrFormat("%s=%g vs %s=%g", key, theirs, our_key, ours));
  };
  integer("vocab_size", m.vocab_size, "model.vocab_size", -1);
  integer("hidden_size", m.dim, "model.dim", -1);
  integer("intermediate_size", m.ffn_hidden_dim, "model.ffn_hidden_dim", -1);
  integer("num_hidden_layers", m.n_layers, "model.n_layers", -1);
  integer("num_attention_heads", m.n_heads, "model.n_heads", -1);
  int64_t kv =
      c.contains("num_key_value_heads") && c["num_key_value_heads"].is_number_integer()
          ? c["num_key_value_heads"].get<int64_t>()
          : (c.contains("num_attention_heads") && c["num_attention_heads"].is_number_integer()
                 ? c["num_attention_heads"].get<int64_t>()
                 : -1);
  if (kv != m.n_kv_heads)
    differences.push_back(StrFormat("num_key_value_heads=%lld vs model.n_kv_heads=%lld",
                                    (long long)kv, (long long)m.n_kv_heads));
  // head_dim: RequireReproducible made it hidden_size / heads, compared above.
  real("rms_norm_eps", HfNumber(c, "rms_norm_eps", "rms_norm_eps", path).value_or(1e-6), m.norm_eps,
       "model.norm_eps");
  real("rope_theta", ReadHfRopeTheta(c, path), m.rope_theta, "model.rope_theta");
  const bool tied = HfBoolean(c, "tie_word_embeddings", false, path);
  if (tied != m.tie_embeddings)
    differences.push_back(StrFormat("tie_word_embeddings=%s vs model.tie_embeddings=%s",
                                    tied ? "true" : "false", m.tie_embeddings ? "true" : "false"));
  return differences;
}

std::shared_ptr<const ModelSpec> ReadLlamaHfConfig(const nlohmann::json& c,
                                                   const std::string& path) {
  RequireReproducible(c, path);
  auto integer = [&](const char* key, int64_t fallback) -> int64_t {
    if (c.contains(key) && c[key].is_number_integer()) return c[key].get<int64_t>();
    if (fallback >= 0) return fallback;
    throw DataError(path + ": no integer '" + key + "'");
  };
  LlamaConfig m;
  m.flavor = "hf";
  m.vocab_size = integer("vocab_size", -1);
  m.dim = integer("hidden_size", -1);
  m.ffn_hidden_dim = integer("intermediate_size", -1);
  m.n_layers = integer("num_hidden_layers", -1);
  m.n_heads = integer("num_attention_heads", -1);
  m.n_kv_heads = integer("num_key_value_heads", m.n_heads);
  m.norm_eps = HfNumber(c, "rms_norm_eps", "rms_norm_eps", path).value_or(1e-6);
  m.rope_theta = ReadHfRopeTheta(c, path);
  m.tie_embeddings = HfBoolean(c, "tie_word_embeddings", false, path);
  if (c.contains("initializer_range") && c["initializer_range"].is_number())
    m.init_std = c["initializer_range"].get<double>();
  if (m.n_heads <= 0 || m.dim % m.n_heads != 0 || m.n_kv_heads <= 0 ||
      m.n_heads % m.n_kv_heads != 0)
    throw DataError(path +
                    ": hidden_size / num_attention_heads / num_key_value_heads do not divide");
  return std::make_shared<LlamaSpec>(m);
}

}  // namespace crucible
