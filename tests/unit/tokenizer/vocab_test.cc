// The model vocabulary of a tokenizer.json: ids out of range and ids given to two tokens are bad
// data (exit 65) naming the file, the tokens and what is wrong.
#include <gtest/gtest.h>

#include <string>

#include "common/error.h"
#include "tokenizer_test_util.h"

namespace crucible {
namespace {

// The message of the error loading `json` throws, with its exit code checked to be 65.
std::string BadDataMessage(const nlohmann::ordered_json& json) {
  try {
    Tokenizer::FromJson(json.dump(), "vocab.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitBadData) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "the tokenizer loaded";
  return "";
}

nlohmann::ordered_json WithVocabEntry(const std::string& token, nlohmann::ordered_json id) {
  testing::TestTokenizerSpec spec;
  spec.merges = {{"a", "b"}};
  nlohmann::ordered_json json = testing::MakeTokenizerJson(spec);
  json["model"]["vocab"][token] = std::move(id);
  return json;
}

TEST(Vocab, AnIdBeyondTheLargestIsOutOfRangeNamingTheRange) {
  const std::string message = BadDataMessage(WithVocabEntry("big", 2147483653ULL));
  EXPECT_NE(message.find("vocab.json"), std::string::npos) << message;
  EXPECT_NE(message.find("\"big\""), std::string::npos) << message;
  EXPECT_NE(message.find("2147483653 is out of range"), std::string::npos) << message;
  EXPECT_NE(message.find("0 to 2147483647"), std::string::npos) << message;
}

TEST(Vocab, AnIdThatIsNotANonNegativeIntegerIsSaidToBeOne) {
  for (const nlohmann::ordered_json& id :
       {nlohmann::ordered_json(-1), nlohmann::ordered_json(1.5), nlohmann::ordered_json("7")}) {
    const std::string message = BadDataMessage(WithVocabEntry("odd", id));
    EXPECT_NE(message.find("vocab.json"), std::string::npos) << message;
    EXPECT_NE(message.find("not a non-negative integer"), std::string::npos) << message;
  }
}

TEST(Vocab, TwoTokensWithOneIdAreRefusedNamingBoth) {
  // "ab" has id 256 (the first merge's result); "dup" takes the same id.
  const std::string message = BadDataMessage(WithVocabEntry("dup", 256));
  EXPECT_NE(message.find("vocab.json"), std::string::npos) << message;
  EXPECT_NE(message.find("\"ab\""), std::string::npos) << message;
  EXPECT_NE(message.find("\"dup\""), std::string::npos) << message;
  EXPECT_NE(message.find("256"), std::string::npos) << message;
}

}  // namespace
}  // namespace crucible
