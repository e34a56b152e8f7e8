// TensorBoard event files ([metrics] enable_tensorboard): rank 0 writes
// <run>/<metrics.save_tb_folder>/events.out.tfevents.<unix time>.<host>.<pid>.0, the name
// TensorBoard's own writers use, one new file per run or resume. Readable by TensorBoard
// (`tensorboard --logdir <run>/tb`) and its reader, tensorboard.backend.event_processing.
//
// The file is a TFRecord stream: each record is its length (uint64, little endian), the masked
// CRC-32C of those 8 bytes, the data, and the masked CRC-32C of the data. Each record's data is
// one serialized tensorflow.Event (tensorflow/core/util/event.proto):
//   - first an Event with file_version = "brain.Event:2";
//   - then an Event with session_log.status = START at the run's first step: the reader drops
//     every event it holds of that step or later (an earlier run's steps past the checkpoint
//     this one resumed from), as it does for a restarted TensorFlow job;
//   - the resolved config as text: a Value tagged "config" whose metadata names the "text"
//     plugin and whose tensor is a DT_STRING scalar holding the TOML;
//   - per logged step one Event (wall_time, step) whose Summary holds one Value (tag,
//     simple_value, a float32) per scalar.
// The few fields of those messages are encoded here by hand (ProtoWriter): three tiny messages
// do not justify a protoc step in the build and a protobuf runtime to link. No Debian package
// provides CRC-32C for C or C++, so it is the table-driven one below, checked against RFC 3720's
// vectors (tests/unit/train/tensorboard_test.cc).
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace crucible {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as iSCSI (RFC 3720) and TFRecord use it.
uint32_t Crc32c(std::string_view data);
// TFRecord's masked CRC: rotated right by 15 bits plus 0xa282ead8.
uint32_t MaskCrc32c(uint32_t crc);
// One TFRecord around `data` (the framing above).
std::string FrameRecord(std::string_view data);

// A protobuf message encoded field by field in the wire format: varints (wire type 0), fixed
// 64-bit (1), length-delimited strings, bytes and nested messages (2), fixed 32-bit (5).
class ProtoWriter {
 public:
  ProtoWriter& Varint(int field, uint64_t value);
  ProtoWriter& Double(int field, double value);
  ProtoWriter& Float(int field, float value);
  ProtoWriter& Bytes(int field, std::string_view value);
  const std::string& data() const { return data_; }

 private:
  std::string data_;
};
// Appends `value` as a base-128 varint, least significant group first.
void AppendVarint(std::string& out, uint64_t value);

// Scalars of one step, by tag.
using TensorBoardScalars = std::vector<std::pair<std::string, double>>;

// The serialized Events this writer writes (the list above); `wall_time` in seconds since 1970.
std::string FileVersionEvent(double wall_time);
std::string SessionStartEvent(double wall_time, int64_t step);
std::string TextEvent(double wall_time, int64_t step, const std::string& tag,
                      const std::string& text);
std::string ScalarsEvent(double wall_time, int64_t step, const TensorBoardScalars& scalars);

// Every number of a JSON record as a scalar, tagged `prefix` + its path with "/" between keys
// (metrics.jsonl's {"loss": 2.5, ...} with prefix "train/" gives train/loss): true and false
// are 1 and 0; an array element is named by its index, or "layer<L>" when it is an object with
// an integer "layer" (that key then left out); the top-level "step", strings, nulls and
// non-finite numbers are left out (metrics.jsonl writes null for the same values).
TensorBoardScalars ScalarsOfRecord(const nlohmann::json& record, const std::string& prefix);

class TensorBoardWriter {
 public:
  // Creates `folder` and a new event file in it, named after `host`, this process and the time
  // (later than every event file already there, so the reader, which reads them in name order,
  // reads this run's last), and writes the file_version event and a SessionLog START at
  // `first_step`. IoError (exit 74) when the folder or file cannot be written.
  TensorBoardWriter(const std::string& folder, const std::string& host, int64_t first_step);
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
  ~TensorBoardWriter();

  // Each writes one event and flushes it, so a killed run loses at most the event being written.
  void WriteScalars(int64_t step, const TensorBoardScalars& scalars);
  void WriteText(int64_t step, const std::string& tag, const std::string& text);
  const std::string& path() const { return path_; }

 private:
  void Write(const std::string& event);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace crucible
