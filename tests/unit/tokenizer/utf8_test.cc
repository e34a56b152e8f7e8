#include "tokenizer/utf8.h"

#include <gtest/gtest.h>

#include <set>

namespace crucible {
namespace {

TEST(ByteLevelMap, IsTheGpt2TableAndABijection) {
  std::set<uint32_t> seen;
  for (int b = 0; b < 256; ++b) {
    uint32_t cp = ByteToCodepoint(static_cast<uint8_t>(b));
    EXPECT_TRUE(seen.insert(cp).second) << b;
    EXPECT_EQ(CodepointToByte(cp), b);
  }
  EXPECT_EQ(ByteToCodepoint('!'), uint32_t{'!'});
  EXPECT_EQ(ByteToCodepoint('~'), uint32_t{'~'});
  EXPECT_EQ(ByteToCodepoint(0xE9), 0xE9u);   // printable Latin-1 stays
  EXPECT_EQ(ByteToCodepoint(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(ByteToCodepoint('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(ByteToCodepoint(0xAD), 0x143u);  // 'Ń', the soft hyphen
  EXPECT_EQ(CodepointToByte('A' + 0x1000), -1);
  EXPECT_EQ(BytesToByteLevel("hi there\n"), "hi\xC4\xA0there\xC4\x8A");
}

TEST(ByteLevelMap, RoundTripsEveryByteString) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  std::string back;
  ASSERT_TRUE(ByteLevelToBytes(BytesToByteLevel(all), &back));
  EXPECT_EQ(back, all);
  EXPECT_FALSE(ByteLevelToBytes("a b", &back));           // a literal space is not byte-level
  EXPECT_FALSE(ByteLevelToBytes("\xE6\x9D\xB1", &back));  // nor is a CJK character
}

TEST(Utf8, RepairReplacesMaximalSubpartsLikePython) {
  // Expected values are Python's bytes.decode("utf-8", "replace").
  EXPECT_EQ(RepairUtf8("ok \xC3\xA9"), "ok \xC3\xA9");
  EXPECT_EQ(RepairUtf8("\xC3"), "\xEF\xBF\xBD");
  EXPECT_EQ(RepairUtf8("a\xE2\x82"), "a\xEF\xBF\xBD");
  EXPECT_EQ(RepairUtf8("\xF0\x9F\x98x"), "\xEF\xBF\xBDx");
  EXPECT_EQ(RepairUtf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(RepairUtf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // overlong
  EXPECT_EQ(RepairUtf8("\xF4\x90\x80\x80"),
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // above U+10FFFF
  EXPECT_EQ(RepairUtf8("\xFF"
                       "a"),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_TRUE(IsValidUtf8("plain ascii text, long enough for the 8-byte loop \xF0\x9F\x8E\x89"));
  EXPECT_FALSE(IsValidUtf8("plain ascii text, long enough for the 8-byte loop \xF0\x9F\x8E"));
}

}  // namespace
}  // namespace crucible
