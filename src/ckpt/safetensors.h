// safetensors files (https://huggingface.co/docs/safetensors): an 8-byte little-endian header
// length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {..}}, then the
// tensor bytes. The reader trusts nothing in the file: a truncated or malformed file, or a header
// that names a tensor twice (or repeats a key inside an entry or __metadata__), is a DataError
// (exit 65) naming the file and the tensor, never a crash.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace crucible {

struct TensorEntry {
  std::string name;
  std::string dtype;  // F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL, ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
  size_t numel() const;
};

class SafetensorsReader {
 public:
  // Maps (or reads) and validates the whole file; throws DataError (65) or UsageError (missing
  // file). The file must not be truncated by another process while the reader lives.
  explicit SafetensorsReader(const std::string& path);
  // Validates bytes already in memory; `source` names them in errors.
  SafetensorsReader(std::string bytes, const std::string& source);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::vector<TensorEntry>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorEntry* Find(const std::string& name) const;
  // Copies a tensor as float32 (F32, F16, BF16 and F64 convert); checks the shape.
  void ReadFloat32(const std::string& name, const std::vector<int64_t>& expected_shape,
                   float* out) const;
  // Copies an I32 tensor (any shape).
  void ReadInt32(const std::string& name, int32_t* out) const;
  const std::string& source() const { return source_; }

 private:
  void Parse();
  std::string source_;
  std::string bytes_;           // the contents when not mapped
  void* mapping_ = nullptr;     // the mmap of the file, if mapped
  const char* data_ = nullptr;  // the contents: bytes_ or the mapping
  size_t size_ = 0;
  size_t data_start_ = 0;
  std::vector<TensorEntry> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct TensorView {
  std::string name;
  std::vector<int64_t> shape;
  const float* data;
};

// Writes float32 tensors atomically (temporary file, fsync, rename), in the given order.
void WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                      const std::map<std::string, std::string>& metadata);
// The same bytes, in memory.
std::string EncodeSafetensors(const std::vector<TensorView>& tensors,
                              const std::map<std::string, std::string>& metadata);
// Only the 8-byte length and the JSON header (padded to 8 bytes); the tensor data follows it
// in the order given. For writers that stream the data themselves.
std::string EncodeSafetensorsHeader(const std::vector<TensorView>& tensors,
                                    const std::map<std::string, std::string>& metadata);

std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace crucible
