#include "ckpt/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"

namespace crucible {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100 << 20;

int DtypeSize(const std::string& dtype) {
  static const std::map<std::string, int> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2},  {"BF16", 2},    {"I64", 8},
      {"I32", 4}, {"I16", 2}, {"I8", 1},   {"U64", 8},     {"U32", 4},
      {"U16", 2}, {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

float HalfToFloat(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal
      exponent = 127 - 15 + 1;
      while (!(mantissa & 0x400)) mantissa <<= 1, --exponent;
      bits = sign | (exponent << 23) | ((mantissa & 0x3ff) << 13);
    }
  } else if (exponent == 31) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

size_t TensorEntry::numel() const {
  size_t n = 1;
  for (int64_t s : shape) n *= static_cast<size_t>(s);
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

SafetensorsReader::SafetensorsReader(const std::string& path) : source_(path) {
  if (!FileExists(path)) throw UsageError(path + ": safetensors file not found");
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) ThrowErrno("cannot open " + path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    ThrowErrno("cannot stat " + path);
  }
  size_ = static_cast<size_t>(st.st_size);
  // Map the file (checkpoints are gigabytes: no allocation, no copy); read it if mapping fails.
  void* mapping = size_ > 0 ? ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
  if (mapping != MAP_FAILED) {
    mapping_ = mapping;
    data_ = static_cast<const char*>(mapping);
  } else {
    bytes_.resize(size_);
    size_t done = 0;
    while (done < size_) {
      ssize_t n = ::read(fd, bytes_.data() + done, size_ - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        int saved = errno;
        ::close(fd);
        if (n == 0) throw DataError(path + ": file shrank while being read");
        errno = saved;
        ThrowErrno("cannot read " + path);
      }
      done += static_cast<size_t>(n);
    }
    data_ = bytes_.data();
  }
  ::close(fd);
  try {
    Parse();
  } catch (...) {
    if (mapping_) ::munmap(mapping_, size_);
    throw;
  }
}

SafetensorsReader::SafetensorsReader(std::string bytes, const std::string& source)
    : source_(source), bytes_(std::move(bytes)) {
  data_ = bytes_.data();
  size_ = bytes_.size();
  Parse();
}

SafetensorsReader::~SafetensorsReader() {
  if (mapping_) ::munmap(mapping_, size_);
}

void SafetensorsReader::Parse() {
  auto bad = [&](const std::string& what) {
    return DataError(source_ + ": not a valid safetensors file: " + what);
  };
  if (size_ < 8)
    throw bad(StrFormat("file is %zu bytes, shorter than the 8-byte header length", size_));
  uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i)
    header_length = (header_length << 8) | static_cast<uint8_t>(data_[i]);
  if (header_length > kMaxHeaderBytes)
    throw bad(StrFormat("header length %llu is implausible", (unsigned long long)header_length));
  if (header_length > size_ - 8)
    throw bad(StrFormat("header length %llu exceeds the file size %zu (truncated?)",
                        (unsigned long long)header_length, size_));
  data_start_ = 8 + header_length;
  const uint64_t data_size = size_ - data_start_;
  // A JSON object keeps the last of two equal keys, so a tensor named twice would silently lose
  // its first entry: every object of the header is checked for repeated keys while it is parsed.
  struct Level {
    std::set<std::string> keys;
    std::string last_key;
  };
  std::vector<Level> levels;
  std::string duplicate;
  auto check_keys = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) {
      levels.emplace_back();
    } else if (event == Event::object_end) {
      if (!levels.empty()) levels.pop_back();
    } else if (event == Event::key && !levels.empty()) {
      const std::string key = parsed.get<std::string>();
      if (!levels.back().keys.insert(key).second && duplicate.empty()) {
        const std::string owner = levels.size() >= 2 ? levels[levels.size() - 2].last_key : "";
        if (levels.size() == 1) {
          duplicate = key == "__metadata__" ? "__metadata__ appears twice"
                                            : "tensor '" + key + "' appears twice";
        } else if (levels.size() == 2 && owner == "__metadata__") {
          duplicate = "__metadata__: key '" + key + "' appears twice";
        } else if (levels.size() == 2) {
          duplicate = "tensor '" + owner + "': key '" + key + "' appears twice";
        } else {
          duplicate = "key '" + key + "' appears twice in one object";
        }
      }
      levels.back().last_key = key;
    }
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(data_ + 8, data_ + data_start_, check_keys);
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("header is not valid JSON (") + e.what() + ")");
  }
  if (!duplicate.empty()) throw bad(duplicate + " in the header (each name must be unique)");
  if (!header.is_object()) throw bad("header is not a JSON object");
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& value = it.value();
    if (name == "__metadata__") {
      if (!value.is_object()) throw bad("__metadata__ is not an object");
      for (auto m = value.begin(); m != value.end(); ++m) {
        if (!m.value().is_string())
          throw bad("__metadata__ value '" + m.key() + "' is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto where = [&](const std::string& what) { return bad("tensor '" + name + "': " + what); };
    if (!value.is_object()) throw where("entry is not an object");
    if (!value.contains("dtype") || !value["dtype"].is_string()) throw where("missing dtype");
    if (!value.contains("shape") || !value["shape"].is_array()) throw where("missing shape");
    if (!value.contains("data_offsets") || !value["data_offsets"].is_array() ||
        value["data_offsets"].size() != 2)
      throw where("missing data_offsets [begin, end]");
    TensorEntry entry;
    entry.name = name;
    entry.dtype = value["dtype"].get<std::string>();
    int element_size = DtypeSize(entry.dtype);
    if (element_size == 0) throw where("unknown dtype '" + entry.dtype + "'");
    unsigned __int128 numel = 1;
    for (const auto& dim : value["shape"]) {
      if (!dim.is_number_unsigned()) throw where("shape has a non-integer or negative dimension");
      uint64_t d = dim.get<uint64_t>();
      if (d > (uint64_t{1} << 48)) throw where("shape dimension too large");
      entry.shape.push_back(static_cast<int64_t>(d));
      numel *= d;
      if (numel > (static_cast<unsigned __int128>(1) << 62)) throw where("shape too large");
    }
    for (const auto& offset : value["data_offsets"])
      if (!offset.is_number_unsigned()) throw where("data_offsets are not non-negative integers");
    entry.begin = value["data_offsets"][0].get<uint64_t>();
    entry.end = value["data_offsets"][1].get<uint64_t>();
    if (entry.begin > entry.end) throw where("data_offsets begin after they end");
    if (entry.end > data_size)
      throw where(
          StrFormat("data ends at byte %llu but the data section has %llu bytes (truncated?)",
                    (unsigned long long)entry.end, (unsigned long long)data_size));
    if (static_cast<unsigned __int128>(entry.end - entry.begin) != numel * element_size)
      throw where(StrFormat("%llu data bytes do not match shape %s of %s",
                            (unsigned long long)(entry.end - entry.begin),
                            ShapeString(entry.shape).c_str(), entry.dtype.c_str()));
    tensors_.push_back(std::move(entry));
  }
  // Tensors must not overlap.
  std::vector<const TensorEntry*> sorted;
  for (const auto& t : tensors_) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorEntry* a, const TensorEntry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i]->begin < sorted[i - 1]->end && sorted[i]->begin != sorted[i]->end)
      throw bad("tensors '" + sorted[i - 1]->name + "' and '" + sorted[i]->name + "' overlap");
}

const TensorEntry* SafetensorsReader::Find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

void SafetensorsReader::ReadFloat32(const std::string& name,
                                    const std::vector<int64_t>& expected_shape, float* out) const {
  const TensorEntry* entry = Find(name);
  if (!entry) throw DataError(source_ + ": no tensor named '" + name + "'");
  if (entry->shape != expected_shape)
    throw DataError(source_ + ": tensor '" + name + "' has shape " + ShapeString(entry->shape) +
                    ", expected " + ShapeString(expected_shape));
  const char* data = data_ + data_start_ + entry->begin;
  size_t n = entry->numel();
  if (n == 0) return;  // an empty tensor: `out` may be null
  if (entry->dtype == "F32") {
    std::memcpy(out, data, n * 4);
  } else if (entry->dtype == "BF16") {
    for (size_t i = 0; i < n; ++i) {
      uint32_t bits = static_cast<uint32_t>(static_cast<uint8_t>(data[2 * i])) << 16 |
                      static_cast<uint32_t>(static_cast<uint8_t>(data[2 * i + 1])) << 24;
      std::memcpy(out + i, &bits, 4);
    }
  } else if (entry->dtype == "F16") {
    for (size_t i = 0; i < n; ++i) {
      uint16_t h = static_cast<uint16_t>(static_cast<uint8_t>(data[2 * i]) |
                                         static_cast<uint8_t>(data[2 * i + 1]) << 8);
      out[i] = HalfToFloat(h);
    }
  } else if (entry->dtype == "F64") {
    for (size_t i = 0; i < n; ++i) {
      double d;
      std::memcpy(&d, data + 8 * i, 8);
      out[i] = static_cast<float>(d);
    }
  } else {
    throw DataError(source_ + ": tensor '" + name + "' has dtype " + entry->dtype +
                    ", expected a floating-point dtype");
  }
}

void SafetensorsReader::ReadInt32(const std::string& name, int32_t* out) const {
  const TensorEntry* entry = Find(name);
  if (!entry) throw DataError(source_ + ": no tensor named '" + name + "'");
  if (entry->dtype != "I32")
    throw DataError(source_ + ": tensor '" + name + "' has dtype " + entry->dtype +
                    ", expected I32");
  if (entry->numel() > 0) std::memcpy(out, data_ + data_start_ + entry->begin, entry->numel() * 4);
}

std::string EncodeSafetensorsHeader(const std::vector<TensorView>& tensors,
                                    const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    uint64_t numel = 1;
    for (int64_t s : t.shape) numel *= static_cast<uint64_t>(s);
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + 4 * numel}}};
    offset += 4 * numel;
  }
  std::string json = header.dump();
  while ((8 + json.size()) % 8 != 0) json.push_back(' ');
  std::string out;
  uint64_t length = json.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
  return out + json;
}

std::string EncodeSafetensors(const std::vector<TensorView>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::string out = EncodeSafetensorsHeader(tensors, metadata);
  for (const auto& t : tensors) {
    uint64_t numel = 1;
    for (int64_t s : t.shape) numel *= static_cast<uint64_t>(s);
    out.append(reinterpret_cast<const char*>(t.data), 4 * numel);
  }
  return out;
}

void WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  AtomicWriteFile(path, EncodeSafetensors(tensors, metadata));
}

}  // namespace crucible
