// Internals of the GGUF export (ckpt/gguf.h), shared by gguf.cc (the file format, the tokenizer,
// the writer) and gguf_layout.cc (what each llama.cpp architecture holds): the metadata section
// and the tensors of the file, each as float32 values in llama.cpp's layout filled on demand.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/parameters.h"

namespace crucible {

// gguf_type of a metadata value.
enum GgufValueType : uint32_t {
  kGgufUint32 = 4,
  kGgufInt32 = 5,
  kGgufFloat32 = 6,
  kGgufBool = 7,
  kGgufString = 8,
  kGgufArray = 9,
};

// Little-endian bytes of a GGUF section (x86-64 and aarch64 are little-endian).
class GgufBytes {
 public:
  template <typename T>
  void Put(T value) {
    data_.append(reinterpret_cast<const char*>(&value), sizeof value);
  }
  void String(const std::string& s) {
    Put<uint64_t>(s.size());
    data_ += s;
  }
  const std::string& data() const { return data_; }

 private:
  std::string data_;
};

// The metadata section: key-value pairs, counted, in the order they are added.
class GgufMetadata {
 public:
  void Uint32(const std::string& key, uint32_t v) { Key(key, kGgufUint32).Put(v); }
  void Float32(const std::string& key, float v) { Key(key, kGgufFloat32).Put(v); }
  void Bool(const std::string& key, bool v) { Key(key, kGgufBool).Put<uint8_t>(v ? 1 : 0); }
  void String(const std::string& key, const std::string& v) { Key(key, kGgufString).String(v); }
  void Strings(const std::string& key, const std::vector<std::string>& values) {
    Key(key, kGgufArray).Put<uint32_t>(kGgufString);
    bytes_.Put<uint64_t>(values.size());
    for (const auto& v : values) bytes_.String(v);
  }
  void Int32s(const std::string& key, const std::vector<int32_t>& values) {
    Key(key, kGgufArray).Put<uint32_t>(kGgufInt32);
    bytes_.Put<uint64_t>(values.size());
    for (int32_t v : values) bytes_.Put(v);
  }
  uint64_t count() const { return count_; }
  const std::string& data() const { return bytes_.data(); }

 private:
  GgufBytes& Key(const std::string& key, GgufValueType type) {
    ++count_;
    bytes_.String(key);
    bytes_.Put<uint32_t>(type);
    return bytes_;
  }
  GgufBytes bytes_;
  uint64_t count_ = 0;
};

// One tensor of the file, before its type is chosen: `fill` writes its numel() float32 values in
// llama.cpp's order (dims[0] the contiguous dimension).
struct GgufTensor {
  std::string name;
  std::vector<int64_t> dims;  // ggml order
  // Takes the file's type (F16, BF16, Q8_0, ...); false: always F32, as convert_hf_to_gguf.py
  // keeps 1-D tensors, norms and MoE routers.
  bool matrix = false;
  std::function<void(float* out)> fill;
  uint64_t numel() const;
};

// An architecture's keys (added after general.*, before tokenizer.*) and tensors, from the
// model's Hugging Face form: `config` is HfMapping::ConfigJson (max_position_embeddings the
// context length), `weights` the whole model's flat buffer (alive while the file is written).
// UsageError (one line) for what llama.cpp's architecture cannot represent.
std::vector<GgufTensor> LlamaGgufLayout(const HfMapping& hf, const nlohmann::ordered_json& config,
                                        const ParameterTable& table, const float* weights,
                                        GgufMetadata* metadata);
std::vector<GgufTensor> DeepSeek2GgufLayout(const HfMapping& hf,
                                            const nlohmann::ordered_json& config,
                                            const ParameterTable& table, const float* weights,
                                            GgufMetadata* metadata);

// Of `count` rows of `columns` floats that hold one RoPE head in Hugging Face's rotate-half order
// (pairs i, i + count/2), llama.cpp's adjacent pairs: row 2i <- row i, row 2i+1 <- row count/2 + i
// (convert_hf_to_gguf.py's LlamaModel.permute), in place.
void InterleaveRopeRows(float* rows, int64_t count, int64_t columns);

}  // namespace crucible
