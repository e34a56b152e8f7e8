#include "train/tensorboard.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "common/files.h"

namespace crucible {
namespace {

std::string Bytes(std::initializer_list<int> values) {
  std::string out;
  for (int v : values) out.push_back(static_cast<char>(v));
  return out;
}

uint32_t ReadUint32(const std::string& data, size_t at) {
  uint32_t value = 0;
  for (int i = 3; i >= 0; --i) value = value << 8 | static_cast<unsigned char>(data[at + i]);
  return value;
}

// RFC 3720, appendix B.4: the CRC-32C of four 32-byte buffers and an iSCSI read command.
TEST(Crc32c, MatchesTheRfc3720Vectors) {
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xFF')), 0x62A8AB43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(descending), 0x113FDB5Cu);
  const std::string read_command =
      Bytes({0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
             0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
             0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
             0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00});
  EXPECT_EQ(Crc32c(read_command), 0xD9963A56u);
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);  // the check value of the catalogue
  EXPECT_EQ(Crc32c(""), 0u);
}

TEST(Crc32c, TheMaskRotatesRightBy15AndAddsTheConstant) {
  EXPECT_EQ(MaskCrc32c(0), 0xa282ead8u);
  EXPECT_EQ(MaskCrc32c(1u << 15), 0xa282ead9u);
  EXPECT_EQ(MaskCrc32c(1), 0xa282ead8u + (1u << 17));
}

TEST(ProtoWriter, VarintsAreBase128LeastSignificantGroupFirst) {
  auto varint = [](uint64_t v) {
    std::string out;
    AppendVarint(out, v);
    return out;
  };
  EXPECT_EQ(varint(0), Bytes({0x00}));
  EXPECT_EQ(varint(1), Bytes({0x01}));
  EXPECT_EQ(varint(127), Bytes({0x7f}));
  EXPECT_EQ(varint(128), Bytes({0x80, 0x01}));
  EXPECT_EQ(varint(300), Bytes({0xac, 0x02}));
  EXPECT_EQ(varint(~uint64_t{0}),
            Bytes({0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}));
}

TEST(ProtoWriter, FieldsCarryTheirNumberAndWireType) {
  // The examples of the protobuf encoding guide: field 1 = 150; field 2 = "testing".
  EXPECT_EQ(ProtoWriter().Varint(1, 150).data(), Bytes({0x08, 0x96, 0x01}));
  EXPECT_EQ(ProtoWriter().Bytes(2, "testing").data(),
            Bytes({0x12, 0x07, 't', 'e', 's', 't', 'i', 'n', 'g'}));
  EXPECT_EQ(ProtoWriter().Float(2, 1.0f).data(), Bytes({0x15, 0x00, 0x00, 0x80, 0x3f}));
  EXPECT_EQ(ProtoWriter().Double(1, 2.0).data(),
            Bytes({0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x40}));
  EXPECT_EQ(ProtoWriter().Varint(16, 1).data(), Bytes({0x80, 0x01, 0x01}));  // a 2-byte key
}

TEST(FrameRecord, IsLengthItsCrcDataAndTheDataCrc) {
  const std::string data = "brain.Event:2";
  const std::string record = FrameRecord(data);
  ASSERT_EQ(record.size(), 8 + 4 + data.size() + 4);
  EXPECT_EQ(record.substr(0, 8), Bytes({13, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(ReadUint32(record, 8), MaskCrc32c(Crc32c(record.substr(0, 8))));
  EXPECT_EQ(record.substr(12, data.size()), data);
  EXPECT_EQ(ReadUint32(record, 12 + data.size()), MaskCrc32c(Crc32c(data)));
}

TEST(Events, TheFileVersionEventIsWallTimeStepAndVersion) {
  const std::string event = FileVersionEvent(2.0);
  EXPECT_EQ(event,
            Bytes({0x09, 0, 0, 0, 0, 0, 0, 0, 0x40, 0x10, 0x00, 0x1a, 13}) + "brain.Event:2");
}

TEST(Events, AScalarIsATaggedFloatInTheSummary) {
  const std::string event = ScalarsEvent(2.0, 7, {{"train/loss", 1.0}});
  const std::string value = Bytes({0x0a, 10}) + "train/loss" + Bytes({0x15, 0, 0, 0x80, 0x3f});
  const std::string summary = Bytes({0x0a, static_cast<int>(value.size())}) + value;
  EXPECT_EQ(event, Bytes({0x09, 0, 0, 0, 0, 0, 0, 0, 0x40, 0x10, 0x07, 0x2a,
                          static_cast<int>(summary.size())}) +
                       summary);
}

TEST(Events, SessionStartIsStatusOneAtTheStep) {
  EXPECT_EQ(SessionStartEvent(2.0, 11),
            Bytes({0x09, 0, 0, 0, 0, 0, 0, 0, 0x40, 0x10, 11, 0x3a, 2, 0x08, 0x01}));
}

TEST(Events, TextNamesTheTextPluginAndHoldsAStringTensor) {
  const std::string event = TextEvent(2.0, 1, "config", "a = 1\n");
  const std::string metadata = Bytes({0x0a, 6, 0x0a, 4}) + "text" + Bytes({0x20, 0x02});
  const std::string tensor = Bytes({0x08, 0x07, 0x12, 0x00, 0x42, 6}) + "a = 1\n";
  const std::string value = Bytes({0x0a, 6}) + "config" +
                            Bytes({0x4a, static_cast<int>(metadata.size())}) + metadata +
                            Bytes({0x42, static_cast<int>(tensor.size())}) + tensor;
  const std::string summary = Bytes({0x0a, static_cast<int>(value.size())}) + value;
  EXPECT_EQ(event, Bytes({0x09, 0, 0, 0, 0, 0, 0, 0, 0x40, 0x10, 0x01, 0x2a,
                          static_cast<int>(summary.size())}) +
                       summary);
}

TEST(ScalarsOfRecord, TagsEveryFiniteNumberByItsPath) {
  const nlohmann::json record = nlohmann::json::parse(R"({
    "step": 3, "loss": 2.5, "grad_norm": null, "skipped": false, "tokens": 4096,
    "held_out": {"name": "wiki", "loss": 1.25},
    "expert_load": [{"layer": 1, "cv": 0.5}, {"layer": 3, "cv": 0.25}],
    "list": [7]})");
  nlohmann::json with_nan = record;
  with_nan["mfu"] = std::nan("");
  const TensorBoardScalars scalars = ScalarsOfRecord(with_nan, "train/");
  const TensorBoardScalars expected = {{"train/expert_load/layer1/cv", 0.5},
                                       {"train/expert_load/layer3/cv", 0.25},
                                       {"train/held_out/loss", 1.25},
                                       {"train/list/0", 7},
                                       {"train/loss", 2.5},
                                       {"train/skipped", 0},
                                       {"train/tokens", 4096}};
  EXPECT_EQ(scalars, expected);
}

TEST(TensorBoardWriter, WritesFramedEventsToANewFileNamedAfterTheLastOne) {
  const std::string folder =
      (std::filesystem::temp_directory_path() / ("tb_test_" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(folder);
  MakeDirectories(folder);
  // A file from a later clock (another host): the new file must sort after it.
  AtomicWriteFile(JoinPath(folder, "events.out.tfevents.9999999998.other.1.0"), "");
  std::string path;
  {
    TensorBoardWriter writer(folder, "host", 5);
    writer.WriteScalars(5, {{"train/loss", 1.0}});
    path = writer.path();
  }
  EXPECT_EQ(std::filesystem::path(path).filename().string(),
            "events.out.tfevents.9999999999.host." + std::to_string(::getpid()) + ".0");
  const std::string data = ReadFile(path);
  size_t at = 0;
  int records = 0;
  while (at < data.size()) {
    ASSERT_LE(at + 12, data.size());
    uint64_t length = 0;
    for (int i = 7; i >= 0; --i) length = length << 8 | static_cast<unsigned char>(data[at + i]);
    ASSERT_LE(at + 16 + length, data.size());
    EXPECT_EQ(ReadUint32(data, at + 8), MaskCrc32c(Crc32c(data.substr(at, 8))));
    EXPECT_EQ(ReadUint32(data, at + 12 + length), MaskCrc32c(Crc32c(data.substr(at + 12, length))));
    at += 16 + length;
    ++records;
  }
  EXPECT_EQ(records, 3);  // file version, session start, the scalars
  std::filesystem::remove_all(folder);
}

}  // namespace
}  // namespace crucible
