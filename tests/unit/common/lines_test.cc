// The one line splitter: LF and CRLF give the same lines; what is left is text.
#include "common/lines.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace crucible {
namespace {

std::vector<std::string> Lines(std::string_view text) {
  LineSplitter lines(text);
  std::vector<std::string> out;
  std::string_view line;
  while (lines.Next(&line)) {
    out.emplace_back(line);
    EXPECT_EQ(lines.line_number(), out.size());
  }
  return out;
}

using V = std::vector<std::string>;

TEST(LineSplitter, CrlfAndLfGiveTheSameLines) {
  EXPECT_EQ(Lines("a\nb\n\nc\n"), (V{"a", "b", "", "c"}));
  EXPECT_EQ(Lines("a\r\nb\r\n\r\nc\r\n"), (V{"a", "b", "", "c"}));
  EXPECT_EQ(Lines("a\r\nb\n"), (V{"a", "b"}));  // mixed
}

TEST(LineSplitter, TextAfterTheLastLineEndIsALine) {
  EXPECT_EQ(Lines("a\nb"), (V{"a", "b"}));
  EXPECT_EQ(Lines(""), V{});
  EXPECT_EQ(Lines("\n"), V{""});
  EXPECT_EQ(Lines("\r\n"), V{""});
}

TEST(LineSplitter, ACarriageReturnNotBeforeALineFeedIsText) {
  EXPECT_EQ(Lines("a\rb\n"), V{"a\rb"});
  EXPECT_EQ(Lines("a\r"), V{"a\r"});
  EXPECT_EQ(Lines("a\r\r\n"), V{"a\r"});
}

TEST(JoinLines, AFileAsOneDocumentHasLfLinesAndNoFinalLineEnd) {
  EXPECT_EQ(JoinLines("a\r\nb\r\n"), "a\nb");
  EXPECT_EQ(JoinLines("a\nb\n\n"), "a\nb\n");
  EXPECT_EQ(JoinLines("a"), "a");
  EXPECT_EQ(JoinLines(""), "");
}

}  // namespace
}  // namespace crucible
