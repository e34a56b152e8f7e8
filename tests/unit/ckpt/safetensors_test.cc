// The safetensors reader's refusals: headers that parse as JSON but do not describe one tensor
// per name.
#include "ckpt/safetensors.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "common/error.h"

namespace crucible {
namespace {

// A file with the given JSON header and `data_bytes` zero bytes of data.
std::string FileWithHeader(const std::string& header, size_t data_bytes) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  return out + header + std::string(data_bytes, '\0');
}

std::pair<int, std::string> OpenError(const std::string& bytes) {
  try {
    SafetensorsReader reader(bytes, "model.safetensors");
  } catch (const Error& e) {
    return {e.exit_code(), e.what()};
  }
  return {0, ""};
}

TEST(Safetensors, ATensorNamedTwiceIsBadDataNamingTheFileAndTheTensor) {
  // JSON parsers keep the last of two equal keys: the first tensor would vanish unseen.
  const std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},)"
                             R"("w":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})";
  auto [code, message] = OpenError(FileWithHeader(header, 16));
  EXPECT_EQ(code, kExitBadData);
  EXPECT_NE(message.find("model.safetensors"), std::string::npos) << message;
  EXPECT_NE(message.find("tensor 'w' appears twice"), std::string::npos) << message;
}

TEST(Safetensors, AKeyTwiceInsideAnEntryOrTheMetadataIsBadData) {
  auto [code, message] = OpenError(
      FileWithHeader(R"({"w":{"dtype":"F32","shape":[1],"dtype":"F16","data_offsets":[0,4]}})", 4));
  EXPECT_EQ(code, kExitBadData);
  EXPECT_NE(message.find("tensor 'w': key 'dtype' appears twice"), std::string::npos) << message;
  std::tie(code, message) =
      OpenError(FileWithHeader(R"({"__metadata__":{"format":"pt","format":"np"},)"
                               R"("w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                               4));
  EXPECT_EQ(code, kExitBadData);
  EXPECT_NE(message.find("__metadata__: key 'format' appears twice"), std::string::npos) << message;
}

TEST(Safetensors, DistinctNamesStillRead) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  SafetensorsReader reader(FileWithHeader(header, 8), "ok.safetensors");
  EXPECT_EQ(reader.tensors().size(), 2u);
}

}  // namespace
}  // namespace crucible
