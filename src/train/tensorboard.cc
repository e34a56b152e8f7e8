#include "train/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"

namespace crucible {

namespace {

// The table of the reflected CRC-32C: entry b is the CRC of the byte b alone.
std::array<uint32_t, 256> MakeCrc32cTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? 0x82F63B78u : 0u);
    table[b] = crc;
  }
  return table;
}

void AppendLittleEndian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

// Field numbers of the messages written (tensorflow/core/util/event.proto,
// tensorflow/core/framework/summary.proto and tensor.proto).
enum EventField { kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5, kSessionLog = 7 };
enum SummaryValueField { kTag = 1, kSimpleValue = 2, kTensor = 8, kMetadata = 9 };
constexpr int kSummaryValue = 1;        // Summary.value (repeated)
constexpr int kSessionLogStatus = 1;    // SessionLog.status
constexpr int kSessionLogStart = 1;     // SessionLog.START
constexpr int kMetadataPluginData = 1;  // SummaryMetadata.plugin_data
constexpr int kMetadataDataClass = 4;   // SummaryMetadata.data_class
constexpr int kDataClassTensor = 2;     // DataClass.DATA_CLASS_TENSOR
constexpr int kPluginName = 1;          // SummaryMetadata.PluginData.plugin_name
constexpr int kTensorDtype = 1, kTensorShape = 2, kTensorStringVal = 8;  // TensorProto
constexpr int kDtypeString = 7;                                          // DataType.DT_STRING

ProtoWriter EventHeader(double wall_time, int64_t step) {
  ProtoWriter event;
  event.Double(kWallTime, wall_time).Varint(kStep, static_cast<uint64_t>(step));
  return event;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

constexpr const char kEventFilePrefix[] = "events.out.tfevents.";

// The unix time in the name of the newest event file in `folder`, or 0.
long long NewestEventFileTime(const std::string& folder) {
  long long newest = 0;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(folder, error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kEventFilePrefix, 0) != 0) continue;
    const char* digits = name.c_str() + std::strlen(kEventFilePrefix);
    char* end = nullptr;
    const long long time = std::strtoll(digits, &end, 10);
    if (end != digits && *end == '.') newest = std::max(newest, time);
  }
  return newest;
}

void AddScalars(const nlohmann::json& value, const std::string& tag, bool top,
                TensorBoardScalars& out) {
  if (value.is_boolean()) {
    out.emplace_back(tag, value.get<bool>() ? 1.0 : 0.0);
  } else if (value.is_number()) {
    const double number = value.get<double>();
    if (std::isfinite(number)) out.emplace_back(tag, number);
  } else if (value.is_object()) {
    for (const auto& [key, item] : value.items())
      if (!(top && key == "step")) AddScalars(item, tag + key + "/", false, out);
  } else if (value.is_array()) {
    for (size_t i = 0; i < value.size(); ++i) {
      const nlohmann::json& item = value[i];
      if (item.is_object() && item.contains("layer") && item["layer"].is_number_integer()) {
        nlohmann::json rest = item;
        rest.erase("layer");
        AddScalars(rest, tag + StrFormat("layer%lld/", item["layer"].get<long long>()), false, out);
      } else {
        AddScalars(item, tag + std::to_string(i) + "/", false, out);
      }
    }
  }
}

}  // namespace

uint32_t Crc32c(std::string_view data) {
  static const std::array<uint32_t, 256> table = MakeCrc32cTable();
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : data) crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t MaskCrc32c(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string FrameRecord(std::string_view data) {
  std::string record;
  AppendLittleEndian(record, data.size(), 8);
  AppendLittleEndian(record, MaskCrc32c(Crc32c(record)), 4);
  record.append(data);
  AppendLittleEndian(record, MaskCrc32c(Crc32c(data)), 4);
  return record;
}

void AppendVarint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

ProtoWriter& ProtoWriter::Varint(int field, uint64_t value) {
  AppendVarint(data_, static_cast<uint64_t>(field) << 3 | 0);
  AppendVarint(data_, value);
  return *this;
}

ProtoWriter& ProtoWriter::Double(int field, double value) {
  AppendVarint(data_, static_cast<uint64_t>(field) << 3 | 1);
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  AppendLittleEndian(data_, bits, 8);
  return *this;
}

ProtoWriter& ProtoWriter::Float(int field, float value) {
  AppendVarint(data_, static_cast<uint64_t>(field) << 3 | 5);
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  AppendLittleEndian(data_, bits, 4);
  return *this;
}

ProtoWriter& ProtoWriter::Bytes(int field, std::string_view value) {
  AppendVarint(data_, static_cast<uint64_t>(field) << 3 | 2);
  AppendVarint(data_, value.size());
  data_.append(value);
  return *this;
}

std::string FileVersionEvent(double wall_time) {
  return EventHeader(wall_time, 0).Bytes(kFileVersion, "brain.Event:2").data();
}

std::string SessionStartEvent(double wall_time, int64_t step) {
  return EventHeader(wall_time, step)
      .Bytes(kSessionLog, ProtoWriter().Varint(kSessionLogStatus, kSessionLogStart).data())
      .data();
}

std::string TextEvent(double wall_time, int64_t step, const std::string& tag,
                      const std::string& text) {
  ProtoWriter plugin;
  plugin.Bytes(kPluginName, "text");
  ProtoWriter metadata;
  metadata.Bytes(kMetadataPluginData, plugin.data()).Varint(kMetadataDataClass, kDataClassTensor);
  ProtoWriter tensor;  // a scalar: an empty shape
  tensor.Varint(kTensorDtype, kDtypeString).Bytes(kTensorShape, "").Bytes(kTensorStringVal, text);
  ProtoWriter value;
  value.Bytes(kTag, tag).Bytes(kMetadata, metadata.data()).Bytes(kTensor, tensor.data());
  ProtoWriter summary;
  summary.Bytes(kSummaryValue, value.data());
  return EventHeader(wall_time, step).Bytes(kSummary, summary.data()).data();
}

std::string ScalarsEvent(double wall_time, int64_t step, const TensorBoardScalars& scalars) {
  ProtoWriter summary;
  for (const auto& [tag, number] : scalars)
    summary.Bytes(
        kSummaryValue,
        ProtoWriter().Bytes(kTag, tag).Float(kSimpleValue, static_cast<float>(number)).data());
  return EventHeader(wall_time, step).Bytes(kSummary, summary.data()).data();
}

TensorBoardScalars ScalarsOfRecord(const nlohmann::json& record, const std::string& prefix) {
  TensorBoardScalars scalars;
  AddScalars(record, prefix, true, scalars);
  for (auto& [tag, number] : scalars) tag.pop_back();  // the "/" after the last key
  return scalars;
}

TensorBoardWriter::TensorBoardWriter(const std::string& folder, const std::string& host,
                                     int64_t first_step) {
  MakeDirectories(folder);
  const double now = Now();
  const long long time = std::max(static_cast<long long>(now), NewestEventFileTime(folder) + 1);
  path_ = JoinPath(folder, StrFormat("%s%010lld.%s.%d.0", kEventFilePrefix, time, host.c_str(),
                                     static_cast<int>(::getpid())));
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) ThrowErrno("cannot create the TensorBoard event file " + path_);
  Write(FileVersionEvent(now));
  Write(SessionStartEvent(now, first_step));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::WriteScalars(int64_t step, const TensorBoardScalars& scalars) {
  Write(ScalarsEvent(Now(), step, scalars));
}

void TensorBoardWriter::WriteText(int64_t step, const std::string& tag, const std::string& text) {
  Write(TextEvent(Now(), step, tag, text));
}

void TensorBoardWriter::Write(const std::string& event) {
  const std::string record = FrameRecord(event);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() ||
      std::fflush(file_) != 0)
    ThrowErrno("cannot write " + path_);
}

}  // namespace crucible
