#include "data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"

namespace crucible {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

template <typename T>
T Load(const uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

// Maps a whole file read-only; an empty file maps to nullptr with size 0.
const uint8_t* MapFile(const std::string& path, size_t* size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) throw UsageError(path + ": no such file");
    ThrowErrno("cannot open " + path);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw DataError(path + ": not a regular file");
  }
  *size = static_cast<size_t>(st.st_size);
  if (*size == 0) {
    ::close(fd);
    return nullptr;
  }
  void* map = ::mmap(nullptr, *size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) ThrowErrno("cannot map " + path);
  return static_cast<const uint8_t*>(map);
}

}  // namespace

int DtypeSize(uint8_t code) {
  switch (static_cast<TokenDtype>(code)) {
    case TokenDtype::kUint8:
    case TokenDtype::kInt8:
      return 1;
    case TokenDtype::kInt16:
    case TokenDtype::kUint16:
      return 2;
    case TokenDtype::kInt32:
    case TokenDtype::kFloat32:
      return 4;
    case TokenDtype::kInt64:
    case TokenDtype::kFloat64:
      return 8;
  }
  return 0;
}

const char* DtypeName(TokenDtype dtype) {
  switch (dtype) {
    case TokenDtype::kUint8:
      return "uint8";
    case TokenDtype::kInt8:
      return "int8";
    case TokenDtype::kInt16:
      return "int16";
    case TokenDtype::kInt32:
      return "int32";
    case TokenDtype::kInt64:
      return "int64";
    case TokenDtype::kFloat64:
      return "float64";
    case TokenDtype::kFloat32:
      return "float32";
    case TokenDtype::kUint16:
      return "uint16";
  }
  return "";
}

bool ParseDtype(const std::string& name, TokenDtype* dtype) {
  for (uint8_t code = 1; code <= 8; ++code) {
    if (name == DtypeName(static_cast<TokenDtype>(code))) {
      *dtype = static_cast<TokenDtype>(code);
      return true;
    }
  }
  return false;
}

TokenDtype OptimalDtype(int64_t vocab_size) {
  return vocab_size < 65500 ? TokenDtype::kUint16 : TokenDtype::kInt32;
}

int64_t DtypeMaxToken(TokenDtype dtype) {
  switch (dtype) {
    case TokenDtype::kUint8:
      return 255;
    case TokenDtype::kInt8:
      return 127;
    case TokenDtype::kInt16:
      return 32767;
    case TokenDtype::kUint16:
      return 65535;
    case TokenDtype::kInt32:
      return 2147483647;
    case TokenDtype::kInt64:
      return 2147483647;  // token ids are int32 in the trainer
    case TokenDtype::kFloat32:
    case TokenDtype::kFloat64:
      return 0;
  }
  return 0;
}

std::string BinPath(const std::string& prefix) {
  return prefix + ".bin";
}
std::string IdxPath(const std::string& prefix) {
  return prefix + ".idx";
}

int64_t IndexView::length(int64_t sequence) const {
  return Load<int32_t>(lengths + 4 * sequence);
}
int64_t IndexView::pointer(int64_t sequence) const {
  return Load<int64_t>(pointers + 8 * sequence);
}
int64_t IndexView::document_begin(int64_t document) const {
  return Load<int64_t>(documents + 8 * document);
}

IndexView ParseIndex(const uint8_t* data, size_t size, const std::string& name) {
  if (size < kHeaderBytes)
    throw DataError(StrFormat("%s: truncated index: %zu bytes, shorter than the %zu-byte header",
                              name.c_str(), size, kHeaderBytes));
  if (std::memcmp(data, kMagic, sizeof(kMagic)) != 0)
    throw DataError(name +
                    ": wrong magic: not a Megatron MMapIndexedDataset index (expected "
                    "'MMIDIDX\\0\\0')");
  const uint64_t version = Load<uint64_t>(data + 9);
  if (version != 1)
    throw DataError(StrFormat("%s: unsupported index version %llu (expected 1)", name.c_str(),
                              (unsigned long long)version));
  IndexView view;
  const uint8_t code = data[17];
  if (DtypeSize(code) == 0)
    throw DataError(StrFormat("%s: unknown dtype code %u", name.c_str(), code));
  view.dtype = static_cast<TokenDtype>(code);
  if (DtypeMaxToken(view.dtype) == 0)
    throw DataError(
        StrFormat("%s: dtype %s cannot hold token ids", name.c_str(), DtypeName(view.dtype)));
  const uint64_t sequences = Load<uint64_t>(data + 18);
  const uint64_t document_entries = Load<uint64_t>(data + 26);
  // Sizes: 4 + 8 bytes per sequence, 8 per document entry; bound the counts before multiplying.
  const uint64_t body = size - kHeaderBytes;
  if (sequences > body / 12 || document_entries > body / 8 ||
      sequences * 12 + document_entries * 8 != body) {
    throw DataError(StrFormat(
        "%s: truncated or oversized index: %llu sequences and %llu document entries need %s "
        "bytes after the header, the file has %llu",
        name.c_str(), (unsigned long long)sequences, (unsigned long long)document_entries,
        (sequences > body / 12 || document_entries > body / 8)
            ? "more"
            : std::to_string(sequences * 12 + document_entries * 8).c_str(),
        (unsigned long long)body));
  }
  if (document_entries < 1)
    throw DataError(name + ": document index is empty (it must start with 0)");
  view.sequence_count = static_cast<int64_t>(sequences);
  view.document_count = static_cast<int64_t>(document_entries) - 1;
  view.lengths = data + kHeaderBytes;
  view.pointers = view.lengths + 4 * sequences;
  view.documents = view.pointers + 8 * sequences;

  const int width = DtypeSize(code);
  int64_t expected_pointer = 0;
  int64_t tokens = 0;
  for (int64_t s = 0; s < view.sequence_count; ++s) {
    const int64_t length = view.length(s);
    if (length < 0)
      throw DataError(StrFormat("%s: sequence %lld has negative length %lld", name.c_str(),
                                (long long)s, (long long)length));
    if (view.pointer(s) != expected_pointer)
      throw DataError(StrFormat(
          "%s: sequence %lld starts at byte %lld, expected %lld (pointers "
          "must be contiguous; dtype mismatch?)",
          name.c_str(), (long long)s, (long long)view.pointer(s), (long long)expected_pointer));
    tokens += length;
    expected_pointer += length * width;  // no overflow: length < 2^31, s < 2^60 / 12
  }
  int64_t previous = -1;
  for (int64_t d = 0; d <= view.document_count; ++d) {
    const int64_t begin = view.document_begin(d);
    if ((d == 0 && begin != 0) || begin < previous || begin > view.sequence_count)
      throw DataError(
          StrFormat("%s: document index entry %lld is %lld: must rise from 0 to the "
                    "sequence count %lld",
                    name.c_str(), (long long)d, (long long)begin, (long long)view.sequence_count));
    previous = begin;
  }
  if (previous != view.sequence_count)
    throw DataError(StrFormat("%s: document index ends at %lld, not at the sequence count %lld",
                              name.c_str(), (long long)previous, (long long)view.sequence_count));
  view.total_tokens = tokens;
  view.expected_bin_bytes = expected_pointer;
  return view;
}

IndexedDataset::IndexedDataset(const std::string& prefix) : prefix_(prefix) {
  const std::string idx_path = IdxPath(prefix), bin_path = BinPath(prefix);
  idx_map_ = MapFile(idx_path, &idx_size_);
  try {
    index_ =
        ParseIndex(idx_map_ ? idx_map_ : reinterpret_cast<const uint8_t*>(""), idx_size_, idx_path);
    bin_map_ = MapFile(bin_path, &bin_size_);
    if (static_cast<int64_t>(bin_size_) != index_.expected_bin_bytes)
      throw DataError(StrFormat(
          "%s: %zu bytes, but %s describes %lld tokens of %s = %lld bytes (truncated .bin, or a "
          ".bin/.idx pair from different runs)",
          bin_path.c_str(), bin_size_, idx_path.c_str(), (long long)index_.total_tokens,
          DtypeName(index_.dtype), (long long)index_.expected_bin_bytes));
  } catch (...) {
    if (idx_map_) ::munmap(const_cast<uint8_t*>(idx_map_), idx_size_);
    if (bin_map_) ::munmap(const_cast<uint8_t*>(bin_map_), bin_size_);
    throw;
  }
}

IndexedDataset::~IndexedDataset() {
  if (idx_map_) ::munmap(const_cast<uint8_t*>(idx_map_), idx_size_);
  if (bin_map_) ::munmap(const_cast<uint8_t*>(bin_map_), bin_size_);
}

void IndexedDataset::ReadTokens(int64_t sequence, int64_t offset, int64_t count,
                                int32_t* out) const {
  if (count <= 0) return;  // an empty sequence (and an empty .bin maps to nullptr)
  const int width = DtypeSize(static_cast<uint8_t>(index_.dtype));
  const uint8_t* p = bin_map_ + index_.pointer(sequence) + offset * width;
  switch (index_.dtype) {
    case TokenDtype::kUint16:
      for (int64_t i = 0; i < count; ++i) out[i] = Load<uint16_t>(p + 2 * i);
      break;
    case TokenDtype::kInt32:
      std::memcpy(out, p, static_cast<size_t>(count) * 4);
      break;
    case TokenDtype::kUint8:
      for (int64_t i = 0; i < count; ++i) out[i] = p[i];
      break;
    case TokenDtype::kInt8:
      for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int8_t>(p[i]);
      break;
    case TokenDtype::kInt16:
      for (int64_t i = 0; i < count; ++i) out[i] = Load<int16_t>(p + 2 * i);
      break;
    case TokenDtype::kInt64:
      for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(Load<int64_t>(p + 8 * i));
      break;
    case TokenDtype::kFloat32:
    case TokenDtype::kFloat64:
      break;  // rejected by ParseIndex
  }
}

std::vector<int64_t> IndexedDataset::Sequence(int64_t sequence) const {
  std::vector<int32_t> tokens(static_cast<size_t>(sequence_length(sequence)));
  ReadTokens(sequence, 0, static_cast<int64_t>(tokens.size()), tokens.data());
  return std::vector<int64_t>(tokens.begin(), tokens.end());
}

int64_t IndexedDataset::MaxToken() const {
  const int width = DtypeSize(static_cast<uint8_t>(index_.dtype));
  const int64_t count = static_cast<int64_t>(bin_size_) / width;
  int64_t best = -1;
  auto scan = [&](auto type_tag) {
    using T = decltype(type_tag);
    for (int64_t i = 0; i < count; ++i)
      best = std::max<int64_t>(best, static_cast<int64_t>(Load<T>(bin_map_ + i * sizeof(T))));
  };
  switch (index_.dtype) {
    case TokenDtype::kUint16:
      scan(uint16_t{});
      break;
    case TokenDtype::kInt32:
      scan(int32_t{});
      break;
    case TokenDtype::kUint8:
      scan(uint8_t{});
      break;
    case TokenDtype::kInt8:
      scan(int8_t{});
      break;
    case TokenDtype::kInt16:
      scan(int16_t{});
      break;
    case TokenDtype::kInt64:
      scan(int64_t{});
      break;
    case TokenDtype::kFloat32:
    case TokenDtype::kFloat64:
      break;
  }
  return best;
}

// ---- writer ----

IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix, TokenDtype dtype)
    : prefix_(prefix),
      dtype_(dtype),
      width_(DtypeSize(static_cast<uint8_t>(dtype))),
      max_token_(DtypeMaxToken(dtype)) {
  if (max_token_ == 0)
    throw UsageError(std::string("cannot write token ids as ") + DtypeName(dtype));
  bin_ = std::make_unique<OutputFile>(BinPath(prefix));
  buffer_.reserve(1 << 22);
}

IndexedDatasetWriter::~IndexedDatasetWriter() = default;  // an uncommitted output is removed

void IndexedDatasetWriter::AddDocument(const uint32_t* tokens, size_t count,
                                       const std::string& where) {
  if (count > static_cast<size_t>(INT32_MAX))
    throw DataError(where + ": document of " + std::to_string(count) +
                    " tokens is longer than an .idx length (int32) can hold");
  for (size_t i = 0; i < count; ++i) {
    if (static_cast<int64_t>(tokens[i]) > max_token_)
      throw DataError(StrFormat("%s: token id %u does not fit dtype %s (vocabulary overflow)",
                                where.c_str(), tokens[i], DtypeName(dtype_)));
    uint8_t bytes[4];
    if (width_ == 2) {
      const uint16_t v = static_cast<uint16_t>(tokens[i]);
      std::memcpy(bytes, &v, 2);
    } else if (width_ == 4) {
      const int32_t v = static_cast<int32_t>(tokens[i]);
      std::memcpy(bytes, &v, 4);
    } else if (width_ == 1) {
      bytes[0] = static_cast<uint8_t>(tokens[i]);
    } else {
      const int64_t v = tokens[i];
      buffer_.insert(buffer_.end(), reinterpret_cast<const uint8_t*>(&v),
                     reinterpret_cast<const uint8_t*>(&v) + 8);
      continue;
    }
    buffer_.insert(buffer_.end(), bytes, bytes + width_);
  }
  lengths_.push_back(static_cast<int32_t>(count));
  tokens_ += static_cast<int64_t>(count);
  if (buffer_.size() >= (1u << 22)) Flush();
}

void IndexedDatasetWriter::Flush() {
  bin_->Write(buffer_.data(), buffer_.size());
  bin_hasher_.Update(buffer_.data(), buffer_.size());
  bin_bytes_ += static_cast<int64_t>(buffer_.size());
  buffer_.clear();
}

void IndexedDatasetWriter::Commit() {
  Flush();

  const uint64_t sequences = lengths_.size();
  std::string idx;
  idx.reserve(kHeaderBytes + sequences * 20 + 8);
  auto put = [&](const void* p, size_t n) { idx.append(static_cast<const char*>(p), n); };
  put(kMagic, sizeof(kMagic));
  const uint64_t version = 1;
  put(&version, 8);
  const uint8_t code = static_cast<uint8_t>(dtype_);
  put(&code, 1);
  put(&sequences, 8);
  const uint64_t document_entries = sequences + 1;
  put(&document_entries, 8);
  put(lengths_.data(), sequences * 4);
  int64_t pointer = 0;
  for (int32_t length : lengths_) {
    put(&pointer, 8);
    pointer += static_cast<int64_t>(length) * width_;
  }
  for (int64_t d = 0; d <= static_cast<int64_t>(sequences); ++d) put(&d, 8);

  StreamHasher idx_hasher;
  idx_hasher.Update(idx.data(), idx.size());
  idx_checksum_ = idx_hasher.HexDigest128();
  idx_bytes_ = static_cast<int64_t>(idx.size());
  bin_checksum_ = bin_hasher_.HexDigest128();
  // Both are written before either is renamed into place.
  OutputFile idx_out(IdxPath(prefix_));
  idx_out.Write(idx.data(), idx.size());
  bin_->Commit();
  idx_out.Commit();
}

}  // namespace crucible
