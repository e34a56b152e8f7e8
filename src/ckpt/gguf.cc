#include "ckpt/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/bfloat16.h"
#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"
#include "tokenizer/tokenizer.h"

namespace crucible {
namespace {

constexpr uint32_t kGgufVersion = 3;
constexpr uint64_t kAlignment = 32;
constexpr size_t kQ8Block = 32, kQ8BlockBytes = 2 + kQ8Block;

// gguf_type of a metadata value.
enum ValueType : uint32_t {
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
};

// ggml_type of a tensor, and llama_ftype of a file (general.file_type).
enum TensorType : uint32_t { kTypeF32 = 0, kTypeF16 = 1, kTypeQ8_0 = 8, kTypeBF16 = 30 };

// llama.cpp's token types (tokenizer.ggml.token_type).
enum TokenType : int32_t { kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5 };

// Little-endian bytes of a GGUF section (x86-64 and aarch64 are little-endian).
class Bytes {
 public:
  template <typename T>
  void Put(T value) {
    data_.append(reinterpret_cast<const char*>(&value), sizeof value);
  }
  void String(const std::string& s) {
    Put<uint64_t>(s.size());
    data_ += s;
  }
  void Pad(size_t alignment) {
    data_.resize((data_.size() + alignment - 1) / alignment * alignment);
  }
  const std::string& data() const { return data_; }

 private:
  std::string data_;
};

// The metadata section: key-value pairs, counted.
class Metadata {
 public:
  void Uint32(const std::string& key, uint32_t v) { Key(key, kUint32).Put(v); }
  void Float32(const std::string& key, float v) { Key(key, kFloat32).Put(v); }
  void Bool(const std::string& key, bool v) { Key(key, kBool).Put<uint8_t>(v ? 1 : 0); }
  void String(const std::string& key, const std::string& v) { Key(key, kString).String(v); }
  void Strings(const std::string& key, const std::vector<std::string>& values) {
    Key(key, kArray).Put<uint32_t>(kString);
    bytes_.Put<uint64_t>(values.size());
    for (const auto& v : values) bytes_.String(v);
  }
  void Int32s(const std::string& key, const std::vector<int32_t>& values) {
    Key(key, kArray).Put<uint32_t>(kInt32);
    bytes_.Put<uint64_t>(values.size());
    for (int32_t v : values) bytes_.Put(v);
  }
  uint64_t count() const { return count_; }
  const std::string& data() const { return bytes_.data(); }

 private:
  Bytes& Key(const std::string& key, ValueType type) {
    ++count_;
    bytes_.String(key);
    bytes_.Put<uint32_t>(type);
    return bytes_;
  }
  Bytes bytes_;
  uint64_t count_ = 0;
};

uint32_t FloatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

float BitsFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// The llama.cpp name of a Llama tensor (Hugging Face name); "" when it is not one.
std::string GgufTensorName(const std::string& hf) {
  static const std::map<std::string, std::string> outside = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"}};
  static const std::map<std::string, std::string> in_layer = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"}};
  if (auto it = outside.find(hf); it != outside.end()) return it->second;
  const std::string prefix = "model.layers.";
  if (!StartsWith(hf, prefix)) return "";
  const size_t dot = hf.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size()) return "";
  const std::string layer = hf.substr(prefix.size(), dot - prefix.size());
  if (layer.find_first_not_of("0123456789") != std::string::npos) return "";
  auto it = in_layer.find(hf.substr(dot + 1));
  return it == in_layer.end() ? "" : "blk." + layer + "." + it->second;
}

// Rows of each of `heads` heads of a (heads * head_dim, columns) matrix, from Hugging Face's
// rotate-half order to llama.cpp's adjacent pairs: out row 2i <- row i, out row 2i+1 <- row
// head_dim/2 + i (convert_hf_to_gguf.py's LlamaModel.permute).
void InterleaveRopeRows(const float* in, int64_t heads, int64_t columns, int64_t rows, float* out) {
  const int64_t head_dim = rows / heads, half = head_dim / 2;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t pair = 0; pair < 2; ++pair)
        std::memcpy(out + (h * head_dim + 2 * i + pair) * columns,
                    in + (h * head_dim + pair * half + i) * columns, columns * sizeof(float));
}

int64_t ConfigInt(const nlohmann::ordered_json& c, const char* key) {
  if (!c.contains(key) || !c[key].is_number_integer())
    throw Error(kExitFailure,
                std::string("internal: export gguf: config.json has no integer ") + key);
  return c[key].get<int64_t>();
}

// One tensor of the file: where its values come from and how they are stored.
struct GgufTensor {
  std::string name;
  const ParamInfo* param = nullptr;
  std::vector<int64_t> dims;  // ggml order: dims[0] is the contiguous one
  uint32_t type = kTypeF32;
  int64_t rope_heads = 0;  // > 0: interleave the rows of this many heads (q_proj, k_proj)
  uint64_t offset = 0;     // from the start of the data section
  uint64_t bytes = 0;
};

uint64_t TensorBytes(uint32_t type, uint64_t numel) {
  if (type == kTypeF32) return numel * 4;
  if (type == kTypeQ8_0) return numel / kQ8Block * kQ8BlockBytes;
  return numel * 2;
}

// The values of `t` as stored in the file.
std::string TensorData(const GgufTensor& t, const float* weights) {
  const ParamInfo& p = *t.param;
  std::vector<float> permuted;
  const float* values = weights + p.offset;
  if (t.rope_heads > 0) {
    permuted.resize(p.numel);
    InterleaveRopeRows(values, t.rope_heads, p.shape[1], p.shape[0], permuted.data());
    values = permuted.data();
  }
  std::string out(t.bytes, '\0');
  if (t.type == kTypeF32) {
    std::memcpy(out.data(), values, t.bytes);
  } else if (t.type == kTypeQ8_0) {
    QuantizeQ8_0(values, p.numel, reinterpret_cast<uint8_t*>(out.data()));
  } else {
    std::vector<uint16_t> halves(p.numel);
    for (size_t i = 0; i < p.numel; ++i)
      halves[i] = t.type == kTypeF16 ? FloatToFp16Bits(values[i]) : FloatToBf16Bits(values[i]);
    std::memcpy(out.data(), halves.data(), t.bytes);
  }
  return out;
}

// A tokenizer.json merge, "a b" (GGUF's form) from either of tokenizer.json's forms.
std::string MergeString(const nlohmann::json& merge, const std::string& path) {
  if (merge.is_string()) return merge.get<std::string>();
  if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
    const std::string a = merge[0].get<std::string>(), b = merge[1].get<std::string>();
    if (a.find(' ') != std::string::npos || b.find(' ') != std::string::npos)
      throw UsageError(path + ": merge [\"" + a + "\", \"" + b +
                       "\"] holds a space, which GGUF's \"a b\" merges cannot spell");
    return a + " " + b;
  }
  throw DataError(path + ": model.merges holds " + merge.dump() + ", not a merge");
}

// The tokenizer.ggml.* keys of the tokenizer.json at `path`, for a model of `vocab_size` ids.
void AddTokenizer(const std::string& path, int64_t vocab_size, Metadata* metadata) {
  const Tokenizer tokenizer = Tokenizer::Load(path);  // refuses what crucible cannot encode with
  const nlohmann::json json = nlohmann::json::parse(tokenizer.ToJson());
  const nlohmann::json& model = json["model"];
  const std::string pre = GgufPreTokenizer(json["pre_tokenizer"].dump());
  const std::string description = tokenizer.Describe();
  if (pre.empty() || !json["normalizer"].is_null() || model.value("byte_fallback", false))
    throw UsageError(path + ": " + description +
                     " has no llama.cpp equivalent; export gguf writes byte-level BPE tokenizers "
                     "without a normalizer, pre-tokenized as Llama 3 or GPT-2 (crucible tokenizer "
                     "train --pretokenizer llama3|gpt2)");
  // llama.cpp looks a Llama-3 pre-token up whole before merging it (ignore_merges) and a GPT-2
  // one never: the tokenizer must agree, or a few words would split differently.
  const bool ignore_merges = model.value("ignore_merges", false);
  if (ignore_merges != (pre == "llama-bpe"))
    throw UsageError(
        StrFormat("%s: model.ignore_merges is %s, but llama.cpp's %s pre-tokenizer "
                  "runs with it %s; retrain it with crucible tokenizer train",
                  path.c_str(), ignore_merges ? "true" : "false", pre.c_str(),
                  pre == "llama-bpe" ? "on" : "off"));
  if (tokenizer.vocab_size() > vocab_size)
    throw UsageError(
        StrFormat("%s: %lld tokens do not fit the model's vocabulary of %lld "
                  "(model.vocab_size)",
                  path.c_str(), (long long)tokenizer.vocab_size(), (long long)vocab_size));
  std::vector<std::string> tokens(vocab_size);
  std::vector<int32_t> types(vocab_size, kUnused);
  for (const auto& [token, id] : model["vocab"].items()) {
    const int64_t i = id.get<int64_t>();
    if (i < 0 || i >= vocab_size) throw DataError(path + ": token id out of range: " + token);
    tokens[i] = token, types[i] = kNormal;
  }
  std::vector<std::pair<std::string, int64_t>> added;
  for (const auto& token : json["added_tokens"]) {
    const int64_t i = token["id"].get<int64_t>();
    if (i < 0 || i >= vocab_size) throw DataError(path + ": added token id out of range");
    tokens[i] = token["content"].get<std::string>();
    types[i] = token.value("special", false) ? kControl : kUserDefined;
    added.emplace_back(tokens[i], i);
  }
  for (int64_t i = 0; i < vocab_size; ++i)
    if (types[i] == kUnused) tokens[i] = "[PAD" + std::to_string(i) + "]";
  std::vector<std::string> merges;
  merges.reserve(model["merges"].size());
  for (const auto& merge : model["merges"]) merges.push_back(MergeString(merge, path));

  metadata->String("tokenizer.ggml.model", "gpt2");
  metadata->String("tokenizer.ggml.pre", pre);
  metadata->Strings("tokenizer.ggml.tokens", tokens);
  metadata->Int32s("tokenizer.ggml.token_type", types);
  metadata->Strings("tokenizer.ggml.merges", merges);
  const SpecialTokenIds special = FindSpecialTokens(added);
  if (special.bos >= 0) metadata->Uint32("tokenizer.ggml.bos_token_id", special.bos);
  if (special.eos >= 0) metadata->Uint32("tokenizer.ggml.eos_token_id", special.eos);
  metadata->Bool("tokenizer.ggml.add_bos_token", false);
  metadata->Bool("tokenizer.ggml.add_eos_token", false);
}

}  // namespace

GgufFileType ParseGgufFileType(const std::string& name) {
  if (name == "f32") return GgufFileType::kF32;
  if (name == "f16") return GgufFileType::kF16;
  if (name == "bf16") return GgufFileType::kBF16;
  if (name == "q8_0") return GgufFileType::kQ8_0;
  throw UsageError("--dtype '" + name + "': expected f32, f16, bf16 or q8_0");
}

std::string GgufFileTypeName(GgufFileType type) {
  switch (type) {
    case GgufFileType::kF32:
      return "f32";
    case GgufFileType::kF16:
      return "f16";
    case GgufFileType::kBF16:
      return "bf16";
    case GgufFileType::kQ8_0:
      return "q8_0";
  }
  return "?";
}

std::string GgufPreTokenizer(const std::string& pre_tokenizer_json) {
  const nlohmann::json p = nlohmann::json::parse(pre_tokenizer_json, nullptr, false);
  if (!p.is_object()) return "";
  auto byte_level = [](const nlohmann::json& s, bool use_regex) {
    return s.is_object() && s.value("type", "") == "ByteLevel" &&
           s.value("use_regex", true) == use_regex && !s.value("add_prefix_space", true);
  };
  if (byte_level(p, true)) return "gpt-2";
  if (p.value("type", "") != "Sequence" || !p.contains("pretokenizers")) return "";
  const nlohmann::json& steps = p["pretokenizers"];
  if (!steps.is_array() || steps.size() != 2 || !byte_level(steps[1], false)) return "";
  const nlohmann::json& split = steps[0];
  if (!split.is_object() || split.value("type", "") != "Split" ||
      split.value("behavior", "") != "Isolated" || split.value("invert", true) ||
      !split.contains("pattern") || !split["pattern"].is_object() ||
      !split["pattern"].contains("Regex") || !split["pattern"]["Regex"].is_string())
    return "";
  const std::string regex = split["pattern"]["Regex"].get<std::string>();
  if (regex == kLlama3Pattern) return "llama-bpe";
  if (regex == kGpt2Pattern) return "gpt-2";
  return "";
}

// The branch-free conversion of the FP16 library (Maratyszcza), which ggml also uses: the
// float32 additions round the mantissa to nearest even in the float unit.
uint16_t FloatToFp16Bits(float value) {
  const float scale_to_inf = BitsFloat(0x77800000);   // 2^112
  const float scale_to_zero = BitsFloat(0x08800000);  // 2^-110
  float base = (std::fabs(value) * scale_to_inf) * scale_to_zero;
  const uint32_t w = FloatBits(value), shl1_w = w + w, sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = BitsFloat((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = FloatBits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u, mantissa_bits = bits & 0x00000FFFu;
  return static_cast<uint16_t>((sign >> 16) |
                               (shl1_w > 0xFF000000u ? 0x7E00u : exp_bits + mantissa_bits));
}

uint16_t FloatToBf16Bits(float value) {
  if (std::isnan(value)) return static_cast<uint16_t>((FloatBits(value) >> 16) | 0x0040u);
  return static_cast<uint16_t>(FloatBits(RoundToBfloat16(value)) >> 16);
}

void QuantizeQ8_0(const float* x, size_t n, uint8_t* out) {
  for (size_t block = 0; block < n / kQ8Block; ++block, x += kQ8Block, out += kQ8BlockBytes) {
    float amax = 0;
    for (size_t j = 0; j < kQ8Block; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    const uint16_t scale = FloatToFp16Bits(d);
    std::memcpy(out, &scale, 2);
    for (size_t j = 0; j < kQ8Block; ++j)
      out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[j] * id)));
  }
}

size_t ExportGgufModel(const std::string& out, const ModelSpec& model, const ParameterTable& table,
                       const float* weights, int64_t context_length,
                       const std::string& tokenizer_path, GgufFileType type,
                       const std::string& name) {
  if (model.name() != "llama")
    throw UsageError("export gguf: model '" + model.name() +
                     "' is not supported: only the Llama family is written (DeepSeek-V3 needs "
                     "llama.cpp's deepseek2 layout: MLA kv_a/kv_b tensors and merged expert "
                     "tensors, not written yet); use crucible export hf and llama.cpp's "
                     "convert_hf_to_gguf.py");
  if (tokenizer_path.empty())
    throw UsageError(
        "export gguf: the run has no tokenizer ([model] tokenizer_path is empty): "
        "llama.cpp runs no GGUF without one");
  const HfMapping& hf = *model.hf();
  const nlohmann::ordered_json c = hf.ConfigJson(context_length, nullptr, nullptr);
  const int64_t heads = ConfigInt(c, "num_attention_heads");
  const int64_t kv_heads = ConfigInt(c, "num_key_value_heads");
  const int64_t head_dim = ConfigInt(c, "head_dim");
  const int64_t vocab_size = ConfigInt(c, "vocab_size");

  uint32_t matrix_type = kTypeF32, file_type = 0;                            // llama_ftype: ALL_F32
  if (type == GgufFileType::kF16) matrix_type = kTypeF16, file_type = 1;     // MOSTLY_F16
  if (type == GgufFileType::kBF16) matrix_type = kTypeBF16, file_type = 32;  // MOSTLY_BF16
  if (type == GgufFileType::kQ8_0) matrix_type = kTypeQ8_0, file_type = 7;   // MOSTLY_Q8_0

  Metadata metadata;
  metadata.String("general.architecture", "llama");
  metadata.String("general.name", name);
  metadata.Uint32("general.alignment", kAlignment);
  metadata.Uint32("general.file_type", file_type);
  metadata.Uint32("general.quantization_version", 2);
  metadata.Uint32("llama.context_length", context_length);
  metadata.Uint32("llama.embedding_length", ConfigInt(c, "hidden_size"));
  metadata.Uint32("llama.block_count", ConfigInt(c, "num_hidden_layers"));
  metadata.Uint32("llama.feed_forward_length", ConfigInt(c, "intermediate_size"));
  metadata.Uint32("llama.attention.head_count", heads);
  metadata.Uint32("llama.attention.head_count_kv", kv_heads);
  metadata.Float32("llama.rope.freq_base", c["rope_theta"].get<double>());
  metadata.Float32("llama.attention.layer_norm_rms_epsilon", c["rms_norm_eps"].get<double>());
  metadata.Uint32("llama.rope.dimension_count", head_dim);
  metadata.Uint32("llama.attention.key_length", head_dim);
  metadata.Uint32("llama.attention.value_length", head_dim);
  metadata.Uint32("llama.vocab_size", vocab_size);
  AddTokenizer(tokenizer_path, vocab_size, &metadata);

  std::vector<GgufTensor> tensors;
  uint64_t data_bytes = 0;
  for (const ParamInfo& p : table.params()) {
    GgufTensor t;
    t.param = &p;
    t.name = GgufTensorName(hf.TensorName(p));
    if (t.name.empty())
      throw Error(kExitFailure, "internal: export gguf: no llama.cpp name for tensor " + p.name);
    t.dims.assign(p.shape.rbegin(), p.shape.rend());
    if (p.shape.size() == 2) {
      t.type = matrix_type;
      if (t.type == kTypeQ8_0 && t.dims[0] % kQ8Block != 0) t.type = kTypeF16;
      if (EndsWith(t.name, "attn_q.weight")) t.rope_heads = heads;
      if (EndsWith(t.name, "attn_k.weight")) t.rope_heads = kv_heads;
    }
    t.bytes = TensorBytes(t.type, p.numel);
    t.offset = data_bytes;
    data_bytes += (t.bytes + kAlignment - 1) / kAlignment * kAlignment;
    tensors.push_back(std::move(t));
  }

  Bytes header;
  header.Put<uint32_t>(0x46554747);  // "GGUF"
  header.Put<uint32_t>(kGgufVersion);
  header.Put<uint64_t>(tensors.size());
  header.Put<uint64_t>(metadata.count());
  Bytes infos;
  for (const GgufTensor& t : tensors) {
    infos.String(t.name);
    infos.Put<uint32_t>(t.dims.size());
    for (int64_t d : t.dims) infos.Put<uint64_t>(d);
    infos.Put<uint32_t>(t.type);
    infos.Put<uint64_t>(t.offset);
  }
  std::string head = header.data() + metadata.data() + infos.data();
  head.resize((head.size() + kAlignment - 1) / kAlignment * kAlignment, '\0');

  std::string parent = ParentDirectory(out);
  if (!parent.empty()) MakeDirectories(parent);
  OutputFile file(out);
  file.Write(head);
  for (const GgufTensor& t : tensors) {
    std::string data = TensorData(t, weights);
    data.resize((data.size() + kAlignment - 1) / kAlignment * kAlignment, '\0');
    file.Write(data);
  }
  file.Commit();
  return head.size() + data_bytes;
}

}  // namespace crucible
