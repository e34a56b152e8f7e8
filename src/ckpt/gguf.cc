#include "ckpt/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "ckpt/gguf_layout.h"
#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"
#include "kernels/cpu/half.h"
#include "tokenizer/tokenizer.h"

namespace crucible {
namespace {

constexpr uint32_t kGgufVersion = 3;
constexpr uint64_t kAlignment = 32;
constexpr size_t kQ8Block = 32, kQ8BlockBytes = 2 + kQ8Block;

// ggml_type of a tensor, and llama_ftype of a file (general.file_type).
enum TensorType : uint32_t { kTypeF32 = 0, kTypeF16 = 1, kTypeQ8_0 = 8, kTypeBF16 = 30 };

// llama.cpp's token types (tokenizer.ggml.token_type).
enum TokenType : int32_t { kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5 };

uint64_t TensorBytes(uint32_t type, uint64_t numel) {
  if (type == kTypeF32) return numel * 4;
  if (type == kTypeQ8_0) return numel / kQ8Block * kQ8BlockBytes;
  return numel * 2;
}

// The values of `t` as stored in the file, as `type`.
std::string TensorData(const GgufTensor& t, uint32_t type) {
  const uint64_t numel = t.numel();
  std::vector<float> values(numel);
  t.fill(values.data());
  std::string out(TensorBytes(type, numel), '\0');
  if (type == kTypeF32) {
    std::memcpy(out.data(), values.data(), out.size());
  } else if (type == kTypeQ8_0) {
    QuantizeQ8_0(values.data(), numel, reinterpret_cast<uint8_t*>(out.data()));
  } else {
    std::vector<uint16_t> halves(numel);
    for (size_t i = 0; i < numel; ++i)
      halves[i] = type == kTypeF16 ? FloatToFp16Bits(values[i]) : FloatToBf16Bits(values[i]);
    std::memcpy(out.data(), halves.data(), out.size());
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
void AddTokenizer(const std::string& path, int64_t vocab_size, GgufMetadata* metadata) {
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

// The project's one conversion each (kernels/cpu/half.h: F16C's for fp16, RoundToBfloat16's for
// bf16), which `crucible generate --dtype` rounds with too.
uint16_t FloatToFp16Bits(float value) {
  return kernels::Fp16Bits(value);
}

uint16_t FloatToBf16Bits(float value) {
  return kernels::Bf16Bits(value);
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
  const std::string family = model.name();
  const std::string architecture = family == "llama"         ? "llama"
                                   : family == "deepseek_v3" ? "deepseek2"
                                                             : "";
  if (architecture.empty() || model.hf() == nullptr)
    throw UsageError("export gguf: model '" + family +
                     "' is not supported: the Llama family (llama.cpp's llama) and DeepSeek-V3 "
                     "(deepseek2) are written; use crucible export hf and llama.cpp's "
                     "convert_hf_to_gguf.py");
  if (tokenizer_path.empty())
    throw UsageError(
        "export gguf: the run has no tokenizer ([model] tokenizer_path is empty): "
        "llama.cpp runs no GGUF without one");
  const HfMapping& hf = *model.hf();
  const nlohmann::ordered_json c = hf.ConfigJson(context_length, nullptr, nullptr);

  uint32_t matrix_type = kTypeF32, file_type = 0;                            // llama_ftype: ALL_F32
  if (type == GgufFileType::kF16) matrix_type = kTypeF16, file_type = 1;     // MOSTLY_F16
  if (type == GgufFileType::kBF16) matrix_type = kTypeBF16, file_type = 32;  // MOSTLY_BF16
  if (type == GgufFileType::kQ8_0) matrix_type = kTypeQ8_0, file_type = 7;   // MOSTLY_Q8_0

  GgufMetadata metadata;
  metadata.String("general.architecture", architecture);
  metadata.String("general.name", name);
  metadata.Uint32("general.alignment", kAlignment);
  metadata.Uint32("general.file_type", file_type);
  metadata.Uint32("general.quantization_version", 2);
  const std::vector<GgufTensor> tensors =
      architecture == "llama" ? LlamaGgufLayout(hf, c, table, weights, &metadata)
                              : DeepSeek2GgufLayout(hf, c, table, weights, &metadata);
  AddTokenizer(tokenizer_path, c["vocab_size"].get<int64_t>(), &metadata);

  // Each tensor's type, where it starts in the data section, and its bytes.
  std::vector<uint32_t> types;
  std::vector<uint64_t> offsets;
  uint64_t data_bytes = 0;
  for (const GgufTensor& t : tensors) {
    uint32_t tensor_type = t.matrix ? matrix_type : kTypeF32;
    if (tensor_type == kTypeQ8_0 && t.dims[0] % kQ8Block != 0) tensor_type = kTypeF16;
    types.push_back(tensor_type);
    offsets.push_back(data_bytes);
    data_bytes += (TensorBytes(tensor_type, t.numel()) + kAlignment - 1) / kAlignment * kAlignment;
  }

  GgufBytes header;
  header.Put<uint32_t>(0x46554747);  // "GGUF"
  header.Put<uint32_t>(kGgufVersion);
  header.Put<uint64_t>(tensors.size());
  header.Put<uint64_t>(metadata.count());
  GgufBytes infos;
  for (size_t i = 0; i < tensors.size(); ++i) {
    infos.String(tensors[i].name);
    infos.Put<uint32_t>(tensors[i].dims.size());
    for (int64_t d : tensors[i].dims) infos.Put<uint64_t>(d);
    infos.Put<uint32_t>(types[i]);
    infos.Put<uint64_t>(offsets[i]);
  }
  std::string head = header.data() + metadata.data() + infos.data();
  head.resize((head.size() + kAlignment - 1) / kAlignment * kAlignment, '\0');

  std::string parent = ParentDirectory(out);
  if (!parent.empty()) MakeDirectories(parent);
  OutputFile file(out);
  file.Write(head);
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::string data = TensorData(tensors[i], types[i]);
    data.resize((data.size() + kAlignment - 1) / kAlignment * kAlignment, '\0');
    file.Write(data);
  }
  file.Commit();
  return head.size() + data_bytes;
}

}  // namespace crucible
